"""The one-partition produce fast path against the general path (``server/data_path.py``).

``DataPath._produce_one_partition`` takes the commonest produce (one topic, one partition, not
transactional, acks 1 or all, a single node under ``sync=always``) with fewer calls than
``DataPath._produce_general``. Two brokers get the same generated produces, at the same
times, in the same passes (some staged as the produce lane stages them, some appended at
once as a connection's reader does): one through ``produce`` (the fast path where it
applies), one through the general path only. Their answers (``ready`` and ``wait``), the
``Pending`` flags, their logs byte for byte, their producer states and their produce metrics
must be equal, also when a pass's write fails. The requests include what the fast path must hand on untouched (several
partitions, acks=0, internal, unknown or missing topics and partitions) and what it must
answer as the general path does (bad CRCs, empty records, idempotent retries, gaps and
fenced epochs, control and transactional bits).

The fast broker also takes some requests as the produce lane takes a client's repeated
produce, undecoded: by the shape learned from its payload (``protocol/produce_shape.py``)
and its records, through ``DataPath.produce_plain``; the general broker decodes nothing
differently, so the same comparison covers that path too (also where it must fall back:
missing, internal and badly named topics).
"""

from __future__ import annotations

import errno
import pathlib
import tempfile

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rivven_broker.protocol import codec
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.produce_shape import ProduceShape
from rivven_broker.protocol.messages import (
    CreateTopic,
    Produce,
    ProducePartition,
    ProduceResponse,
    ProduceTopic,
)
from rivven_broker.records import BatchBuilder
from rivven_broker.server.broker import Broker
from rivven_broker.server.config import BrokerConfig, HostPort
from rivven_broker.server.context import Pending, RequestContext
from rivven_broker.server.env import RealEnv
from rivven_broker.server.produce_answers import OnePartitionWait
from rivven_broker.storage.file_store import OsFileStore

_PRODUCER_ID = 7


def _batch(kind: str, sequence: int, epoch: int, records: int) -> bytes:
    idempotent = kind in ("idempotent", "transactional", "control")
    builder = BatchBuilder(
        batch_bytes_max=1 << 20,
        producer_id=_PRODUCER_ID if idempotent else -1,
        producer_epoch=epoch if idempotent else -1,
        base_sequence=sequence if idempotent else -1,
        transactional=kind in ("transactional", "control"),
        control=kind == "control",
    )
    for index in range(records):
        assert builder.append(1_000 + index, None, b"v%d" % index)
    data = builder.build()
    if kind == "bad-crc":
        data = data[:-1] + bytes([data[-1] ^ 0xFF])
    elif kind == "two-batches":
        data += _batch("plain", -1, -1, 1)
    elif kind == "empty":
        data = b""
    elif kind == "truncated":
        data = data[:-3]
    return data


_KINDS = ["plain", "plain", "plain", "idempotent", "idempotent", "idempotent",
          "transactional", "control", "bad-crc", "two-batches", "empty", "truncated"]

_request = st.builds(
    lambda topic, partition, kind, sequence, epoch, records, acks, second, by_shape=False: (
        topic, partition, kind, sequence, epoch, records, acks, second, by_shape),
    topic=st.sampled_from(["t", "t", "t", "u", "missing", "__consumer_offsets", "bad name"]),
    partition=st.sampled_from([0, 0, 0, 1, 5]),
    kind=st.sampled_from(_KINDS),
    sequence=st.integers(0, 6),
    epoch=st.sampled_from([0, 0, 0, 1]),
    records=st.integers(1, 3),
    acks=st.sampled_from([-1, -1, 1, 0]),
    second=st.booleans(),  # a second partition in the same request: the general path's
    by_shape=st.booleans(),  # taken by its shape where it has one (``produce_plain``)
)
#: (staged as the lane stages, the pass's write fails, the requests)
_passes = st.lists(st.tuples(st.booleans(), st.sampled_from([False, False, False, True]),
                             st.lists(_request, min_size=1, max_size=5)),
                   min_size=1, max_size=6)


class _FailingWrites:
    """``OsFileStore.pwritev`` refusing (ENOSPC, nothing written) while ``failing``."""

    failing = False

    def __init__(self) -> None:
        self._pwritev = OsFileStore.pwritev

    def __enter__(self) -> _FailingWrites:
        original = self._pwritev

        def pwritev(store: OsFileStore, *args: object) -> None:
            if _FailingWrites.failing:
                raise OSError(errno.ENOSPC, "no space left (the test's)")
            original(store, *args)  # type: ignore[arg-type]

        OsFileStore.pwritev = pwritev  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        OsFileStore.pwritev = self._pwritev  # type: ignore[method-assign]
        _FailingWrites.failing = False


def _produce(spec: tuple) -> Produce:
    topic, partition, kind, sequence, epoch, records, acks, second = spec[:8]
    parts = [ProducePartition(partition, _batch(kind, sequence, epoch, records))]
    if second and partition != 1:
        parts.append(ProducePartition(1, _batch("plain", -1, -1, 1)))
    return Produce(acks=acks, timeout_ms=5_000, topics=(ProduceTopic(topic, tuple(parts)),))


def _broker(directory: pathlib.Path) -> Broker:
    config = BrokerConfig(data_dir=str(directory), listen=HostPort("127.0.0.1", 0), http=None,
                          auto_create_topics=False)
    return Broker(RealEnv(str(directory)), config)


def _payload_kind(wait: OnePartitionWait, answer: ProduceResponse) -> str:
    """Check ``wait.payload`` against the generic encoding of ``answer`` (``ready``'s) at
    every version: equal bytes for a plain success, None for anything else; which it was."""
    partition = answer.topics[0].partitions[0]
    plain = partition.error_code == ErrorCode.NONE and not partition.duplicate
    low, high = Produce.VERSIONS
    for version in range(low, high + 1):
        payload = wait.payload(version)
        if plain:
            assert payload == codec.encode_response(answer, version)
        else:
            assert payload is None
    return "template" if plain else "ready"


def _shape(request: Produce) -> ProduceShape | None:
    """The shape the lane would learn from ``request`` sent as it is, if it has one."""
    payload = codec.encode_request(request)
    decoded, version = codec.decode_request_and_version(payload)
    assert decoded == request
    return ProduceShape.learn(payload, request, version)


async def _run(passes: list, kinds: set[str], shapes: list[str] | None = None) -> None:
    shapes = [] if shapes is None else shapes
    with tempfile.TemporaryDirectory() as directory:
        brokers = [_broker(pathlib.Path(directory) / name) for name in ("fast", "general")]
        async with trio.open_nursery() as nursery:
            for broker in brokers:
                await nursery.start(broker.serve)
            for broker in brokers:
                handlers = broker._handlers
                assert handlers is not None
                for topic in ("t", "u"):
                    handlers.begin(CreateTopic(topic, 2), RequestContext(0))
            fast, general = (broker._handlers.data for broker in brokers)  # type: ignore[union-attr]
            stagings = [broker.lane._staging for broker in brokers]  # type: ignore[union-attr]
            now_ms = 1_700_000_000_000
            for staged, failing, specs in passes:
                requests = [(_produce(spec), len(spec) > 8 and spec[8]) for spec in specs]
                if staged:  # as the lane does: stage the pass, write it, then answer
                    for staging in stagings:
                        staging.open()
                outcomes = []
                for request, by_shape in requests:
                    now_ms += 1
                    received_at = trio.current_time()
                    shape = _shape(request) if by_shape else None
                    if shape is not None:
                        records = request.topics[0].partitions[0].records
                        one = fast.produce_plain(shape, records, now_ms, received_at)
                        shapes.append(shape.topic)
                    else:
                        one = fast.produce(request, now_ms, received_at=received_at)
                    other = general._produce_general(request, now_ms, None, received_at)
                    outcomes.append((one, other))
                if staged:
                    _FailingWrites.failing = failing  # the pass's one write per partition
                    try:
                        for staging in stagings:
                            staging.close()
                    finally:
                        _FailingWrites.failing = False
                for one, other in outcomes:
                    if isinstance(one, (Pending, OnePartitionWait)):
                        assert isinstance(other, Pending)
                        assert one.serial == other.serial
                        assert one.after_progress == other.after_progress
                        assert one.deadline == other.deadline
                        assert one.provisional is not None and other.provisional is not None
                        assert one.provisional() == other.provisional()
                        with trio.fail_after(20):
                            answer = await one.wait()
                            assert answer == await other.wait()
                        assert one.ready is not None and other.ready is not None
                        assert one.ready() == other.ready() == answer
                        if type(one) is OnePartitionWait:  # its answer from the template
                            kinds.add(_payload_kind(one, answer))
                    else:
                        assert type(one) is type(other) and one == other
            for topic in ("t", "u"):
                for index in (0, 1):
                    logs = [data._context.logs.get_log(topic, index) for data in (fast, general)]
                    assert logs[0].log_end_offset == logs[1].log_end_offset
                    reads = [log.read(0, 1 << 24).records for log in logs]
                    assert bytes(reads[0]) == bytes(reads[1])
                    states = [data._context.partitions.get(topic, index, log)
                              for data, log in zip((fast, general), logs)]
                    assert states[0].state.snapshot() == states[1].state.snapshot()
            metrics = [data._context.metrics for data in (fast, general)]
            assert metrics[0].records_in_total == metrics[1].records_in_total
            assert metrics[0].topic_records_in == metrics[1].topic_records_in
            assert metrics[0].topic_bytes_in == metrics[1].topic_bytes_in
            for broker in brokers:
                broker.request_shutdown()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(passes=_passes)
def test_the_fast_path_answers_writes_and_counts_as_the_general_path(passes: list) -> None:
    with _FailingWrites():
        trio.run(_run, passes, set())


def test_the_fast_path_answers_from_the_template_and_otherwise_by_ready() -> None:
    """The differential test's comparison of ``payload`` bites both ways: a plain append is
    answered from the template, and a failed write and an idempotent retry are not."""
    plain, retried = ("t", 0, "idempotent", 0, 0, 1, -1, False), \
        ("t", 0, "idempotent", 0, 0, 1, -1, False)
    kinds: set[str] = set()
    with _FailingWrites():
        trio.run(_run, [(True, False, [plain, retried]), (True, True, [("u", 1, "plain", 0, 0,
                                                                        2, 1, False)])], kinds)
    assert kinds == {"template", "ready"}


def test_requests_are_taken_by_their_shape() -> None:
    """The comparison covers ``produce_plain``: requests go that way, to existing topics and
    to ones the general path must answer (a missing topic, an internal one)."""
    shapes: list[str] = []
    specs = [("t", 0, "plain", 0, 0, 1, -1, False, True), ("missing", 0, "plain", 0, 0, 1, 1,
                                                            False, True),
             ("__consumer_offsets", 0, "plain", 0, 0, 1, -1, False, True),
             ("t", 1, "bad-crc", 0, 0, 1, -1, False, True)]
    with _FailingWrites():
        trio.run(_run, [(True, False, specs), (False, False, specs)], set(), shapes)
    assert shapes == ["t", "missing", "__consumer_offsets", "t"] * 2


def test_the_fast_path_takes_the_plain_produce() -> None:
    """The differential test above compares something: a plain one-partition produce goes
    the fast way (and a two-partition one does not)."""
    calls: list[str] = []

    async def main() -> None:
        with tempfile.TemporaryDirectory() as directory:
            broker = _broker(pathlib.Path(directory))
            async with trio.open_nursery() as nursery:
                await nursery.start(broker.serve)
                handlers = broker._handlers
                assert handlers is not None
                handlers.begin(CreateTopic("t", 2), RequestContext(0))
                data = handlers.data
                general = data._produce_general

                def spy(*args: object) -> object:
                    calls.append("general")
                    return general(*args)  # type: ignore[arg-type]

                data._produce_general = spy  # type: ignore[method-assign]
                plain = _produce(("t", 0, "plain", 0, 0, 1, -1, False))
                pending = data.produce(plain, 1)
                assert isinstance(pending, OnePartitionWait) and calls == []
                with trio.fail_after(20):
                    answer = await pending.wait()
                assert answer.topics[0].partitions[0].base_offset == 0
                data.produce(_produce(("t", 0, "plain", 0, 0, 1, -1, True)), 2)
                assert calls == ["general"]
                broker.request_shutdown()

    trio.run(main)
