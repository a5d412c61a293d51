"""The raw producer's batch template and the generated document sections.

Method: fill the template as a producer does and check the batch is valid for the broker (its
CRC matches, records decode) and carries the mark where the verifier reads it; check a filled
request template is byte for byte the frame the protocol's ``ClientConnection`` encodes for
the same request, and that ``ProduceAnswers`` matches answers to requests and reads their
errors (from answers the server's own connection core encodes); render the
docs tables from a minimal result and check ``replace_section`` keeps everything outside its
markers and appends missing sections.
"""

from __future__ import annotations

from rivven_broker.bench.docs import render_sections, replace_section
from rivven_broker.bench.ledger import MARK, Ledger
import pytest

from rivven_broker.bench.rivven_load import ProduceAnswers, batch_template, request_template
from rivven_broker.protocol.connection import ClientConnection, ServerConnection
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    Produce,
    ProducePartition,
    ProducePartitionResponse,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResponse,
)
from rivven_broker.records import decode_records, validate


def test_filled_batches_are_valid_and_marked():
    template = batch_template(100, 10)
    batch = bytes(template.fill(4, 17, 99))
    header = validate(batch)
    assert header.record_count == 10
    records = decode_records(batch)
    assert [len(r.value) for r in records] == [100] * 10
    assert MARK.unpack_from(records[0].value) == (4, 17, 99)
    assert MARK.unpack_from(batch, template.mark_at) == (4, 17, 99)
    other = bytes(template.fill(4, 18, 99))
    assert validate(other).crc != header.crc
    ledger = Ledger()
    ledger.add_producer(4, sent=19, acked=0)
    ledger.observe_value(batch, template.mark_at)
    assert ledger.verdict().ok


@pytest.mark.parametrize("acks", [-1, 1, 0])
def test_filled_requests_are_the_codecs_frames(acks):
    template = batch_template(100, 3)
    requests = request_template(template, "bench-topic", 7, acks)
    core = ClientConnection(first_correlation_id=41)
    for sequence in range(3):
        sent = requests.fill(41 + sequence, 5, sequence, 1_000 + sequence)
        batch = bytes(template.fill(5, sequence, 1_000 + sequence))
        expected = core.send_request(Produce(acks=acks, timeout_ms=30_000, topics=(
            ProduceTopic("bench-topic", (ProducePartition(7, batch),)),)))[1]
        assert bytes(sent) == expected
    server = ServerConnection()
    server.receive_data(bytes(requests.fill(9, 5, 3, 7)))
    event = server.next_event()
    assert event.correlation_id == 9 and event.request.topics[0].partitions[0].partition == 7


def _request(server: ServerConnection, correlation_id: int) -> None:
    server.receive_data(bytes(request_template(batch_template(100, 1), "t", 0, -1).fill(
        correlation_id, 1, correlation_id, 0)))
    assert server.next_event().correlation_id == correlation_id


def _answer(server: ServerConnection, correlation_id: int, code: ErrorCode) -> bytes:
    _request(server, correlation_id)
    partition = ProducePartitionResponse(0, code, 12 if code == ErrorCode.NONE else -1,
                                         error_message=None if code == ErrorCode.NONE else "no")
    frame = server.send_response(correlation_id, ProduceResponse(
        topics=(ProduceTopicResponse("t", (partition,)),)))
    assert type(frame) is bytes
    return frame


def _error(server: ServerConnection, correlation_id: int) -> bytes:
    _request(server, correlation_id)
    frame = server.send_error(correlation_id, ErrorCode.THROTTLED, "slow down")
    assert type(frame) is bytes
    return frame


def test_answers_are_matched_in_order_and_read_for_errors():
    server = ServerConnection()
    answers = ProduceAnswers()
    ids = [answers.number() for _ in range(4)]
    assert ids == [1, 2, 3, 4] and answers.number(answered=False) == 5
    wire = (_answer(server, 1, ErrorCode.NONE) + _answer(server, 2, ErrorCode.NOT_ENOUGH_REPLICAS)
            + _error(server, 3))
    assert answers.feed(wire[:7]) == []  # a split frame waits for its rest
    outcomes = answers.feed(wire[7:])
    assert outcomes[0] is None
    assert outcomes[1].startswith("NOT_ENOUGH_REPLICAS") and outcomes[2].startswith("THROTTLED")
    with pytest.raises(ConnectionError, match="expected 4"):
        answers.feed(_answer(server, 6, ErrorCode.NONE))


def test_replace_section_keeps_the_rest():
    text = "# Perf\n\nintro\n<!-- bench:produce -->\nold\n<!-- /bench:produce -->\n\nanalysis\n"
    out = replace_section(text, "produce", "| new |")
    assert out == "# Perf\n\nintro\n<!-- bench:produce -->\n| new |\n<!-- /bench:produce -->\n\nanalysis\n"
    assert replace_section(out, "produce", "| new |") == out
    added = replace_section(out, "consume", "c")
    assert added.startswith(out.rstrip("\n")) and added.endswith("<!-- bench:consume -->\nc\n<!-- /bench:consume -->\n")


def _figures(rate: float) -> dict:
    return {
        "target": "rivven", "setting": "always", "records_per_s": rate, "rounds_records_per_s": [rate],
        "mb_per_s": rate / 1e4, "wire_mb_per_s": rate / 8e3, "latency_ms": {"p50": 1, "p99": 2, "p999": 3, "max": 4},
        "latency_count": 5, "lost": 0, "duplicated": 0, "broker_cpu_s_per_million": 0.5, "unsteady": False,
    }


def test_render_sections_lists_every_case():
    summary = {"mode": "produce", "workload": "w", "records_per_s": 1e6, "mb_per_s": 100.0,
               "latency_ms": {"p50": 1, "p99": 2, "p999": 3, "max": 4}, "lost": 0, "duplicated": 0,
               "rivven": _figures(1e6), "peer": {**_figures(2e5), "target": "redis"}, "ratio": 5.0}
    results = [{"name": "produce-100B-redis", "target": ">= 1M", "met": True, "summary": summary}]
    sections = render_sections({"when": "now", "commit": "abc", "peers": {}}, results)
    assert set(sections) == {"environment", "targets", "produce", "consume", "latency"}
    assert "produce-100B-redis" in sections["targets"] and "5.0x" in sections["produce"]
    assert "1.00M" in sections["produce"] and "redis always: 200.0k" in sections["produce"]
