"""The runtime's HTTP API as plain functions: a request (method, target) and a snapshot of the
connectors in, ``(status, content type, body)`` out. No I/O; ``http_server.py`` serves it.

Theory of operation
-------------------
The driver builds one ``ConnectorView`` per configured source at request time (its cycle's
``CycleStatus``, its ``Admission``, or its final ``state``/``error`` when the task ended
before a cycle existed) and calls ``respond(method, target, views, now_ms)``. Routes:

``GET /health``
    200 while no connector is in ``error``, else 503; the body lists every connector's state
    (``{"status": "ok" | "error", "connectors": {NAME: STATE}}``). A readiness check: the
    process answering at all is the liveness signal.
``GET /metrics``
    Prometheus text (format 0.0.4). Every family is labelled by ``connector`` (plus
    ``state``, ``reason`` or ``action`` where named), never by topic: the destinations are
    unbounded in open mode, the metric cardinality must not be. A source may add its own
    families (``Source.metrics()`` -> ``Metric``s, carried by the view): they get the
    ``connector`` label too, and any label of their own must have a bounded value set
    (postgres-cdc's ``table`` is one of the configured tables).
``GET /connectors``
    ``{"connectors": [{"name", "connector", "kind"}]}``: the sources, then the sinks
    (``kind`` ``source`` or ``sink``), in configuration order.
``GET /connectors/NAME/status``
    The cycle's status: ``state`` (running | degraded | error | stopped), ``phase``,
    ``last_error``, ``position``, ``records``, ``batches``, ``consecutive_failures``,
    ``dropped``, ``dead_lettered``; a source's also ``abandoned_batches``,
    ``abandoned_records``, ``last_abandon_at_ms`` (abandon-batch). A sink's ``position`` is its committed offsets
    (``{"topic/partition": next offset}``); it drops and dead-letters nothing (0).
``GET /connectors/NAME/destinations``
    Every admitted topic with its breaker state and counts, sorted by topic.

``POST /connectors/NAME/abandon-batch``
    The one way to skip data: asks the driver (the injected ``abandon(name)``, which
    answers why not, or None) to commit the position of the batch a degraded source keeps
    failing, without its records (``batch_cycle`` "AbandonRequested"). 202 when accepted
    (it is carried out at once, and logged), 409 with ``{"reason"}`` when refused (not
    degraded, a failing side effect, a halted source, a sink).

Any other path is 404 (the path is not echoed); a method other than GET or HEAD is 405
(POST only on ``abandon-batch``, which answers GET with 405).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Sequence

import attrs

from rivven_connect.core.admission import Admission, RejectReason
from rivven_connect.core.batch_cycle import CycleStatus, Phase, Status
from rivven_connect.core.sink_cycle import SinkStatus

__all__ = ["CONTENT_TYPE_JSON", "CONTENT_TYPE_METRICS", "ConnectorView", "Metric", "Response",
           "render_metrics", "respond"]

CONTENT_TYPE_JSON = "application/json"
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"

#: (status, content type, body)
Response = tuple[int, str, bytes]

_STATES = tuple(status.value for status in Status)


@attrs.frozen
class Metric:
    """One sample of a source's own metric family (``rivven_connect_{name}``; a counter's
    sample name gets ``_total``). ``labels`` are the sample's labels besides ``connector``:
    only labels with a bounded value set (never a topic)."""

    name: str
    kind: str  # gauge | counter
    help_text: str
    value: int
    labels: tuple[tuple[str, str], ...] = ()

    def __attrs_post_init__(self) -> None:
        assert self.kind in ("gauge", "counter"), self.kind
        assert self.name.replace("_", "").isalnum() and self.name.islower(), self.name
        assert all(key not in ("connector", "topic") for key, _ in self.labels), self.labels


@attrs.frozen
class ConnectorView:
    """One source as the HTTP API sees it at the moment of a request."""

    name: str
    connector: str  # datagen, file, postgres-cdc; file, stdout, http-webhook ...
    #: The cycle's status, once the cycle exists (a sink's: ``SinkStatus``).
    status: CycleStatus | SinkStatus | None = None
    admission: Admission | None = None
    #: The final state and error when the task ended without a cycle status to say so
    #: (a start failure); overrides ``status``.
    final_state: str | None = None
    final_error: str | None = None
    kind: str = "source"  # or "sink"
    #: The source's own metrics (``Source.metrics()``; empty for most).
    metrics: tuple[Metric, ...] = ()

    @property
    def state(self) -> str:
        if self.final_state is not None:
            return self.final_state
        return Status.RUNNING.value if self.status is None else self.status.state.value


def _json(status: int, document: object) -> Response:
    body = json.dumps(document, separators=(",", ":"), sort_keys=True, default=str)
    return status, CONTENT_TYPE_JSON, body.encode() + b"\n"


def _text(status: int, text: str) -> Response:
    return status, "text/plain; charset=utf-8", text.encode() + b"\n"


def respond(method: str, target: str, views: Sequence[ConnectorView], now_ms: int, *,
            abandon: Callable[[str], str | None] | None = None) -> Response:
    """The answer to ``method target`` (HEAD is answered as GET; the server drops the body).
    ``abandon(name)`` carries out ``abandon-batch`` (why not, or None; never blocks)."""
    path = target.split("?", 1)[0]
    parts = path.split("/")
    if len(parts) == 4 and parts[0] == "" and parts[1] == "connectors" and (
            parts[3] == "abandon-batch"):
        view = next((v for v in views if v.name == parts[2]), None)
        if view is None:
            return _text(404, "no such page")
        if method != "POST":
            return _text(405, "abandon-batch takes POST")
        return _abandon(view, abandon)
    if method not in ("GET", "HEAD"):
        return _text(405, "only GET and HEAD")
    if path == "/health":
        return _health(views)
    if path == "/metrics":
        return 200, CONTENT_TYPE_METRICS, render_metrics(views, now_ms).encode()
    if path == "/connectors":
        return _json(200, {"connectors": [{"name": v.name, "connector": v.connector,
                                            "kind": v.kind}
                                          for v in views]})
    if len(parts) == 4 and parts[0] == "" and parts[1] == "connectors":
        view = next((v for v in views if v.name == parts[2]), None)
        if view is not None and parts[3] == "status":
            return _json(200, _status(view))
        if view is not None and parts[3] == "destinations":
            return _json(200, _destinations(view))
    return _text(404, "no such page")


def _abandon(view: ConnectorView, abandon: Callable[[str], str | None] | None) -> Response:
    if view.kind != "source":
        reason: str | None = "a sink has no batch to abandon (abandon-batch is for sources)"
    elif abandon is None:
        reason = "abandon-batch is not available here"
    else:
        reason = abandon(view.name)
    if reason is not None:
        return _json(409, {"name": view.name, "abandoned": False, "reason": reason})
    return _json(202, {"name": view.name, "abandoned": True,
                       "detail": "the batch being retried is committed without its records; "
                                 "see abandoned_records in its status"})


def _health(views: Sequence[ConnectorView]) -> Response:
    states = {view.name: view.state for view in views}
    failed = any(state == Status.ERROR.value for state in states.values())
    return _json(503 if failed else 200,
                 {"status": "error" if failed else "ok", "connectors": states})


def _status(view: ConnectorView) -> dict[str, Any]:
    status = view.status
    document: dict[str, Any] = {"name": view.name, "connector": view.connector,
                                "state": view.state}
    if status is None:
        document.update(phase=Phase.NEW.value if view.final_state is None else "done",
                        last_error=view.final_error, position=None, records=0, batches=0,
                        consecutive_failures=0, dropped=0, dead_lettered=0)
        if view.kind == "source":
            document.update(abandoned_batches=0, abandoned_records=0, last_abandon_at_ms=None)
        return document
    document.update(
        phase=status.phase.value, last_error=view.final_error or status.last_error,
        position=status.position, records=status.records, batches=status.batches,
        consecutive_failures=status.consecutive_failures, dropped=_dropped(status),
        dead_lettered=_dead_lettered(status))
    if isinstance(status, CycleStatus):  # (a sink's own "abandoned" is another thing)
        document.update(abandoned_batches=status.abandoned_batches,
                        abandoned_records=status.abandoned_records,
                        last_abandon_at_ms=status.last_abandon_at_ms)
    return document


def _dropped(status: CycleStatus | SinkStatus | None) -> int:
    return status.dropped if isinstance(status, CycleStatus) else 0  # (a sink drops none)


def _dead_lettered(status: CycleStatus | SinkStatus | None) -> int:
    return status.dead_lettered if isinstance(status, CycleStatus) else 0


def _destinations(view: ConnectorView) -> dict[str, Any]:
    admission = view.admission
    if admission is None:
        return {"name": view.name, "max_destinations": None, "destinations": []}
    rows = [{"topic": s.topic, "breaker": s.breaker.value,
             "consecutive_failures": s.consecutive_failures, "opened_at_ms": s.opened_at_ms,
             "partitions": s.partitions, "routed": s.routed, "failures": s.failures,
             "last_error": s.last_error}
            for _, s in sorted(admission.destinations.items())]
    return {"name": view.name, "max_destinations": admission.config.max_destinations,
            "destinations": rows}


# --- /metrics ---------------------------------------------------------------------------------


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Family:
    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help_text = name, kind, help_text
        self.samples: list[tuple[dict[str, str], int]] = []

    def add(self, value: int, **labels: str) -> None:
        self.samples.append((labels, value))

    def lines(self) -> Iterable[str]:
        sample_name = self.name + ("_total" if self.kind == "counter" else "")
        yield f"# HELP {sample_name} {self.help_text}"
        yield f"# TYPE {sample_name} {self.kind}"
        for labels, value in self.samples:
            text = ",".join(f'{key}="{_label(val)}"' for key, val in labels.items())
            yield f"{sample_name}{{{text}}} {value}"


def render_metrics(views: Sequence[ConnectorView], now_ms: int) -> str:
    """The Prometheus text of every connector's figures (docs/connect.md "Metrics")."""
    families = {name: _Family(f"rivven_connect_{name}", kind, text) for name, kind, text in (
        ("records", "counter", "Records committed to their destinations."),
        ("batches", "counter", "Batches committed (records and source position in one "
                               "transaction)."),
        ("dropped_records", "counter", "Records dropped (filtered, or by drop policies)."),
        ("dead_lettered_records", "counter", "Records committed to the dead-letter topic."),
        ("abandoned_records", "counter", "Records skipped by abandon-batch."),
        ("consecutive_failures", "gauge", "Failed attempts in a row of the batch in flight."),
        ("connector_state", "gauge", "1 for the connector's current state, else 0."),
        ("routed_records", "counter", "Records committed to admitted destinations."),
        ("destinations_active", "gauge", "Destination topics admitted (each holds a slot)."),
        ("destinations_max", "gauge", "The max_destinations cap."),
        ("rejected_records", "counter", "Records refused by admission, by reason."),
        ("unmatched_records", "counter", "Records without a destination, by the action "
                                         "taken."),
        ("circuits_open", "gauge", "Destination breakers open (rejecting) now."),
    )}
    for view in views:
        name = view.name
        status = view.status
        families["records"].add(0 if status is None else status.records, connector=name)
        families["batches"].add(0 if status is None else status.batches, connector=name)
        families["dropped_records"].add(_dropped(status), connector=name)
        families["dead_lettered_records"].add(_dead_lettered(status), connector=name)
        families["abandoned_records"].add(
            status.abandoned_records if isinstance(status, CycleStatus) else 0, connector=name)
        families["consecutive_failures"].add(
            0 if status is None else status.consecutive_failures, connector=name)
        for state in _STATES:
            families["connector_state"].add(int(view.state == state), connector=name,
                                            state=state)
        admission = view.admission
        if admission is None:
            continue
        counters = admission.counters
        families["routed_records"].add(counters.routed, connector=name)
        families["destinations_active"].add(admission.destinations_active, connector=name)
        families["destinations_max"].add(admission.config.max_destinations, connector=name)
        for reason in RejectReason:
            families["rejected_records"].add(counters.rejected[reason], connector=name,
                                             reason=reason.value)
        for action, count in sorted(counters.unmatched.items()):
            families["unmatched_records"].add(count, connector=name, action=action)
        families["circuits_open"].add(admission.circuits_open(now_ms), connector=name)
    for view in views:
        for metric in view.metrics:
            family = families.get(metric.name)
            if family is None:
                family = families[metric.name] = _Family(
                    f"rivven_connect_{metric.name}", metric.kind, metric.help_text)
            assert family.kind == metric.kind, (metric, family.kind)
            family.add(metric.value, connector=view.name, **dict(metric.labels))
    lines = [line for family in families.values() for line in family.lines()]
    return "\n".join(lines) + "\n"
