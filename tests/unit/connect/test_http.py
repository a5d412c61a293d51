"""The runtime's HTTP API: the pure handlers (request -> response over a snapshot of views)
and the h11 server over memory streams (keep-alive, limits, timeouts)."""

from __future__ import annotations

import json
import re

import trio
import trio.testing

from rivven_connect import http_server
from rivven_connect.core.admission import (
    Admission,
    AdmissionConfig,
    AdmissionMode,
    RejectReason,
    SendOutcome,
    TopicPattern,
)
from rivven_connect.core.batch_cycle import CycleStatus, Phase, Status
from rivven_connect.core.records import Destination
from rivven_connect.core.sink_cycle import SinkPhase, SinkStatus
from rivven_connect.http_api import CONTENT_TYPE_METRICS, ConnectorView, Metric, respond


def _status(state: Status = Status.RUNNING, **changes) -> CycleStatus:
    fields = dict(state=state, phase=Phase.POLLING, last_error=None, position=41, records=40,
                  batches=4, consecutive_failures=0, dropped=1, dead_lettered=2)
    fields.update(changes)
    return CycleStatus(**fields)


def _admission() -> Admission:
    admission = Admission(AdmissionConfig(AdmissionMode.ALLOWLIST, (TopicPattern.parse("t.*"),),
                                          max_destinations=2), failure_threshold=1)
    assert admission.admit(Destination("t.a"), 1, 0) is None
    assert admission.admit(Destination("t.b"), 1, 0) is None
    assert admission.admit(Destination("t.c"), 1, 0) is RejectReason.MAX_DESTINATIONS
    assert admission.admit(Destination("x.y"), 1, 0) is RejectReason.NOT_ALLOWED
    admission.note_unmatched("drop")
    admission.record_outcome("t.a", SendOutcome.DELIVERED, 0, records=7)
    admission.record_outcome("t.b", SendOutcome.PERMANENT_FAILURE, 5, error="MESSAGE_TOO_LARGE")
    admission.set_partition_count("t.a", 3)
    return admission


def _views(second_state: Status = Status.DEGRADED) -> list[ConnectorView]:
    return [ConnectorView("gen", "datagen", _status(), _admission()),
            ConnectorView("lines", "file", _status(second_state, last_error="boom"), None),
            ConnectorView("late", "file")]  # still starting: no cycle yet


def _get(target: str, views=None, method: str = "GET"):
    status, content_type, body = respond(method, target, _views() if views is None else views,
                                         1_000)
    return status, content_type, body


def test_health_is_200_unless_a_connector_is_in_error_and_lists_every_state():
    status, content_type, body = _get("/health")
    assert status == 200 and content_type == "application/json"
    assert json.loads(body) == {"status": "ok", "connectors": {
        "gen": "running", "lines": "degraded", "late": "running"}}
    status, _, body = _get("/health", _views(Status.ERROR))
    assert status == 503 and json.loads(body)["connectors"]["lines"] == "error"
    stopped = [ConnectorView("gen", "datagen", _status(Status.STOPPED))]
    assert _get("/health", stopped)[0] == 200


def test_connectors_and_status_come_from_the_views():
    assert json.loads(_get("/connectors")[2]) == {"connectors": [
        {"name": "gen", "connector": "datagen", "kind": "source"},
        {"name": "lines", "connector": "file", "kind": "source"},
        {"name": "late", "connector": "file", "kind": "source"}]}
    status, _, body = _get("/connectors/lines/status?verbose=1")
    assert status == 200
    assert json.loads(body) == {
        "name": "lines", "connector": "file", "state": "degraded", "phase": "polling",
        "last_error": "boom", "position": 41, "records": 40, "batches": 4,
        "consecutive_failures": 0, "dropped": 1, "dead_lettered": 2, "abandoned_batches": 0,
        "abandoned_records": 0, "last_abandon_at_ms": None}
    late = json.loads(_get("/connectors/late/status")[2])
    assert late["state"] == "running" and late["phase"] == "new" and late["records"] == 0
    # a task that ended before its cycle existed reports its final state and error
    failed = [ConnectorView("gen", "datagen", final_state="error", final_error="fenced")]
    document = json.loads(_get("/connectors/gen/status", failed)[2])
    assert document["state"] == "error" and document["last_error"] == "fenced"


def test_a_sink_is_listed_with_its_committed_offsets_as_position():
    status = SinkStatus(state=Status.DEGRADED, phase=SinkPhase.WRITING, last_error="503",
                        position={"t/0": 12}, records=12, batches=3,
                        consecutive_failures=16, abandoned=0)
    views = [ConnectorView("archive", "file", status, kind="sink")]
    assert json.loads(_get("/connectors", views)[2]) == {"connectors": [
        {"name": "archive", "connector": "file", "kind": "sink"}]}
    document = json.loads(_get("/connectors/archive/status", views)[2])
    assert document == {
        "name": "archive", "connector": "file", "state": "degraded", "phase": "writing",
        "last_error": "503", "position": {"t/0": 12}, "records": 12, "batches": 3,
        "consecutive_failures": 16, "dropped": 0, "dead_lettered": 0}
    metrics = _get("/metrics", views)[2].decode()
    assert 'rivven_connect_records_total{connector="archive"} 12' in metrics, metrics


def test_destinations_list_each_admitted_topic_with_its_breaker():
    document = json.loads(_get("/connectors/gen/destinations")[2])
    assert document["max_destinations"] == 2
    assert document["destinations"] == [
        {"topic": "t.a", "breaker": "closed", "consecutive_failures": 0, "opened_at_ms": None,
         "partitions": 3, "routed": 7, "failures": 0, "last_error": None},
        {"topic": "t.b", "breaker": "open", "consecutive_failures": 1, "opened_at_ms": 5,
         "partitions": None, "routed": 0, "failures": 1, "last_error": "MESSAGE_TOO_LARGE"}]
    assert json.loads(_get("/connectors/lines/destinations")[2])["destinations"] == []


def test_unknown_names_and_paths_are_404_and_other_methods_405():
    for target in ("/connectors/nope/status", "/connectors/gen/nope", "/connectors/gen",
                   "/", "/connectors/gen/status/x", "//connectors/gen/status"):
        status, _, body = _get(target)
        assert status == 404 and b"nope" not in body, target
    for method in ("POST", "PUT", "DELETE"):
        assert _get("/health", method=method)[0] == 405
        assert _get("/connectors/gen/status", method=method)[0] == 405
    assert _get("/health", method="HEAD")[0] == 200


def test_metrics_are_prometheus_text_labelled_by_connector_never_by_topic():
    status, content_type, body = _get("/metrics")
    assert status == 200 and content_type == CONTENT_TYPE_METRICS
    text = body.decode()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line and not line.startswith("#")}
    assert samples['rivven_connect_records_total{connector="gen"}'] == 40
    assert samples['rivven_connect_batches_total{connector="lines"}'] == 4
    assert samples['rivven_connect_connector_state{connector="lines",state="degraded"}'] == 1
    assert samples['rivven_connect_connector_state{connector="lines",state="running"}'] == 0
    assert samples['rivven_connect_routed_records_total{connector="gen"}'] == 7
    assert samples['rivven_connect_destinations_active{connector="gen"}'] == 2
    assert samples['rivven_connect_rejected_records_total{connector="gen",'
                   'reason="max_destinations"}'] == 1
    assert samples['rivven_connect_rejected_records_total{connector="gen",'
                   'reason="not_allowed"}'] == 1
    assert samples['rivven_connect_unmatched_records_total{connector="gen",action="drop"}'] == 1
    assert samples['rivven_connect_circuits_open{connector="gen"}'] == 1
    assert "topic=" not in text and "t.a" not in text
    assert "# TYPE rivven_connect_records_total counter" in text
    assert "# TYPE rivven_connect_circuits_open gauge" in text


def test_abandon_batch_is_a_post_answered_202_or_409_with_the_reason():
    asked = []

    def abandon(name):
        asked.append(name)
        return None if name == "gen" else "the batch has failed 1 time(s)"

    sink = ConnectorView("archive", "file", None, kind="sink")
    views = [*_views(), sink]

    def post(target, method="POST"):
        status, content_type, body = respond(method, target, views, 0, abandon=abandon)
        return status, json.loads(body) if content_type == "application/json" else body

    assert post("/connectors/gen/abandon-batch") == (202, {
        "name": "gen", "abandoned": True, "detail": "the batch being retried is committed "
        "without its records; see abandoned_records in its status"})
    assert post("/connectors/lines/abandon-batch") == (409, {
        "name": "lines", "abandoned": False, "reason": "the batch has failed 1 time(s)"})
    status, body = post("/connectors/archive/abandon-batch")
    assert status == 409 and "a sink has no batch" in body["reason"]
    assert asked == ["gen", "lines"]  # GET, unknown names and sinks never reach the driver
    assert post("/connectors/gen/abandon-batch", "GET")[0] == 405
    assert post("/connectors/nope/abandon-batch")[0] == 404
    assert respond("POST", "/connectors/gen/abandon-batch", views, 0)[0] == 409  # no driver


def _samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_a_sources_own_metrics_are_one_family_each_labelled_by_connector_first():
    def cdc(lag: int) -> tuple[Metric, ...]:
        return (Metric("cdc_replication_lag_bytes", "gauge", "WAL read, not confirmed.", lag),
                Metric("cdc_events", "counter", "Changes read.", 3,
                       (("table", "public.orders"), ("op", "c"))))
    views = [*_views(), ConnectorView("pg1", "postgres-cdc", _status(), metrics=cdc(10)),
             ConnectorView("pg2", "postgres-cdc", _status(), metrics=cdc(0))]
    text = _get("/metrics", views)[2].decode()
    samples = _samples(text)
    assert samples['rivven_connect_cdc_replication_lag_bytes{connector="pg1"}'] == 10
    assert samples['rivven_connect_cdc_replication_lag_bytes{connector="pg2"}'] == 0
    assert samples['rivven_connect_cdc_events_total{connector="pg2",table="public.orders",'
                   'op="c"}'] == 3
    assert text.count("# TYPE rivven_connect_cdc_events_total counter") == 1
    assert text.count("# HELP rivven_connect_cdc_replication_lag_bytes WAL read, not "
                      "confirmed.") == 1
    assert 'rivven_connect_records_total{connector="pg1"} 40' in text
    for bad in (lambda: Metric("x", "histogram", "", 1),
                lambda: Metric("x", "gauge", "", 1, (("topic", "t"),)),
                lambda: Metric("Bad-Name", "gauge", "", 1)):
        try:
            bad()
        except AssertionError:
            continue
        raise AssertionError("accepted")


# --- the server over memory streams -----------------------------------------------------------


def _answer(method: str, target: str):
    return respond(method, target, _views(), 0)


async def _exchange(request: bytes, *, read_until_close: bool = True) -> bytes:
    client, server = trio.testing.memory_stream_pair()
    received = bytearray()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(http_server.serve_http_connection, server, _answer)
        await client.send_all(request)
        if read_until_close:
            while data := await client.receive_some(65536):
                received += data
        else:
            received += await client.receive_some(65536)
            await client.aclose()
    return bytes(received)


async def test_the_server_keeps_the_connection_alive_between_requests():
    request = (b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
               b"GET /connectors/nope/status HTTP/1.1\r\nhost: x\r\n\r\n"
               b"POST /health HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close"
               b"\r\n\r\nhi")
    answer = await _exchange(request)
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]
    assert statuses == [200, 404, 405]
    assert b'"gen":"running"' in answer and b"x-content-type-options: nosniff" in answer


async def test_the_server_bounds_heads_and_bodies():
    head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (
        2 * http_server.request_head_bytes_max) + b"\r\n\r\n"
    assert (await _exchange(head)).startswith(b"HTTP/1.1 431")
    size = http_server.request_body_bytes_max + 1
    body = (b"GET /health HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % size) + b"b" * size
    assert (await _exchange(body)).startswith(b"HTTP/1.1 413")
    assert (await _exchange(b"GET /health HTTP/2.0\r\n\r\n")).startswith(b"HTTP/1.1 505")


async def test_a_trickled_or_silent_request_is_cut_off(autojump_clock):
    start = trio.current_time()
    assert await _exchange(b"GET /health HTTP/1.1\r\nhos") == b""  # never completed
    assert trio.current_time() - start == http_server.request_timeout_ms / 1000
    start = trio.current_time()
    assert await _exchange(b"") == b""  # silent
    assert trio.current_time() - start == http_server.idle_timeout_ms / 1000


async def test_the_listener_refuses_connections_over_the_cap(monkeypatch):
    monkeypatch.setattr(http_server, "http_connections_max", 1)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(http_server.serve_http, "127.0.0.1", 0, _answer)
        first = await trio.open_tcp_stream("127.0.0.1", port)
        await first.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await first.receive_some(65536)).startswith(b"HTTP/1.1 200")  # holds a slot
        second = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(5):
            await second.send_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            assert await second.receive_some(65536) == b""  # closed at accept
        await first.aclose()
        await second.aclose()
        nursery.cancel_scope.cancel()


def test_the_cli_refuses_an_http_flag_that_is_not_host_port(tmp_path, capsys):
    from rivven_connect.cli import EXIT_CONFIG, main

    path = tmp_path / "connect.yaml"
    path.write_text('sources: {gen: {connector: datagen, topic: t, config: {count: 1}}}\n')
    assert main(["--config", str(path), "--http", "nowhere"]) == EXIT_CONFIG
    assert "--http: 'nowhere' is not HOST:PORT or off" in capsys.readouterr().err
