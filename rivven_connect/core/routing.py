"""Routing: where each record of a source goes, and what happens when it may not go there.

Theory of operation
-------------------
A record's destination is decided in a fixed order (the Iggy proposal's dispatch order):

1. **at the source** (``Router.route_at_source``, before transforms): ``routing.by_table``
   renders a topic template from the record's ``{schema}``/``{table}`` (one template for every
   table, or one per table, keyed ``schema.table`` or ``table``); or ``routing.topic_column``
   names a column of the row whose value is the topic (a missing or null value falls back to
   ``default_topic``). ``routing.key_column`` names the column whose value becomes the
   destination key (bytes as they are, strings UTF-8, anything else as JSON; when no
   destination was set here, it replaces the record's own key instead). With
   ``strip_columns`` those two columns are then removed from the row. The row of a CDC
   envelope (a value with ``before``/``after``) is ``after``, or ``before`` for a delete; both
   are stripped;
2. **transforms** run (``transforms.build_chain``, another module); a ``Route`` transform may
   overwrite the destination (config refuses it together with step 1);
3. ``Router.dispatch`` (after transforms): a record without a destination follows
   ``on_missing_destination``: ``default`` renders the source's ``topic`` template, ``drop``
   drops it (counted), ``error`` stops the batch. Then **admission** (``admission.py``) checks
   the destination — the default topic too: a template default is no way around the cap or
   the allowlist. A rejected record follows ``on_admission_failure``: ``drop`` (counted),
   ``dlq`` (the record goes to ``routing.dlq_topic`` with context headers, in the same
   transaction as the batch), or ``error`` (the batch stops; retriable only for an open
   breaker, which closes by itself — every other rejection is a configuration matter).

``dispatch`` returns a ``Verdict``; the batch cycle acts on it. Pure; never blocks.

The encoded path (``records.EncodedRecords``): when nothing per-record is configured —
no transforms, no routing at the source, no key column, and admission failures that do
not go to the DLQ (``encoded_path_allowed``) — every record of one table gets the same
verdict, so a block of them is dispatched once: the ``topic`` template (or
``on_missing_destination``) and admission decide for all of its records, and the counters
count each record as the per-record path would. A dead letter is a record's own (its
position in a header), so a configured DLQ keeps the per-record path.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import attrs

from rivven_connect.core.admission import Admission, RejectReason
from rivven_connect.core.config import SourceConfig, TopicTemplate
from rivven_connect.core.records import Destination, EncodedRecords, Record

__all__ = ["Action", "Router", "Verdict", "DLQ_HEADERS", "dead_letter",
           "encoded_path_allowed"]

#: The context headers of a dead-lettered record, in this order.
DLQ_HEADERS = (
    "rivven.dlq.reason",
    "rivven.dlq.original_topic",
    "rivven.dlq.connector",
    "rivven.dlq.stage",
    "rivven.dlq.error",
    "rivven.dlq.source_position",
)


def encoded_path_allowed(source: SourceConfig) -> bool:
    """Whether ``source``'s records may travel as ``EncodedRecords`` (module docstring)."""
    routing = source.routing
    return (not source.transforms and not routing.routes_at_source
            and routing.key_column is None and routing.on_admission_failure != "dlq")


class Action(enum.Enum):
    SEND = "send"  # ``record`` to its destination
    DROP = "drop"  # counted, not sent
    DLQ = "dlq"  # ``record`` is the dead-letter record (destination: the DLQ topic)
    ERROR = "error"  # stop the batch


@attrs.frozen
class Verdict:
    action: Action
    record: Record | EncodedRecords | None = None
    #: ``RejectReason`` value, ``missing_destination`` or ``transform_error``.
    reason: str | None = None
    error: str | None = None
    #: For ``ERROR``: whether retrying the same batch later may succeed.
    retriable: bool = False

    def __attrs_post_init__(self) -> None:
        assert (self.record is not None) == (self.action in (Action.SEND, Action.DLQ))
        assert self.record is None or self.record.destination is not None
        assert self.action is not Action.ERROR or self.error is not None
        assert self.retriable is False or self.action is Action.ERROR


def dead_letter(
    record: Record, *, dlq_topic: str, connector: str, stage: str, reason: str, error: str,
    original_topic: str | None,
) -> Record:
    """``record`` addressed to the DLQ with the context headers (``DLQ_HEADERS``)."""
    position = record.position
    if not isinstance(position, str):  # a CDC position is a dict: JSON, not Python's repr
        position = json.dumps(position, sort_keys=True, separators=(",", ":"))
    values = (reason, original_topic or "", connector, stage, error, position)
    headers = tuple((name, value.encode()) for name, value in zip(DLQ_HEADERS, values))
    return attrs.evolve(record, headers=(*record.headers, *headers),
                        destination=Destination(dlq_topic))


class Router:
    """Routing of one source (see the module docstring)."""

    def __init__(self, source: SourceConfig, admission: Admission) -> None:
        assert admission.config == source.routing.admission
        self.source = source
        self.routing = source.routing
        self.admission = admission

    # --- step 1: at the source ----------------------------------------------------------------
    def route_at_source(self, record: Record) -> Record:
        """``record`` with the destination its own columns or table give (or unchanged)."""
        routing = self.routing
        if not routing.routes_at_source and routing.key_column is None:
            return record
        row = _row(record.value)
        topic: str | None = None
        if routing.by_table is not None:
            template = self._table_template(record)
            topic = None if template is None else template.render(record.schema, record.table)
        elif routing.topic_column is not None:
            column = None if row is None else row.get(routing.topic_column)
            if column is not None:
                topic = str(column)
            else:
                assert routing.default_topic is not None
                topic = routing.default_topic.render(record.schema, record.table)
        key = None
        if routing.key_column is not None and row is not None:
            key = _key_bytes(row.get(routing.key_column))
        if routing.strip_columns:
            record = attrs.evolve(record, value=_stripped(
                record.value, (routing.topic_column, routing.key_column)))
        if topic is None:  # no destination from the source: the key column keys the record
            return record if key is None else attrs.evolve(record, key=key)
        return record.with_destination(Destination(topic, key=key))

    def _table_template(self, record: Record) -> TopicTemplate | None:
        by_table = self.routing.by_table
        if isinstance(by_table, TopicTemplate):
            return by_table
        assert by_table is not None
        wanted = (f"{record.schema}.{record.table}", record.table)
        for name, template in by_table:
            if name in wanted:
                return template
        return None

    # --- step 3: after transforms -------------------------------------------------------------
    def dispatch(self, record: Record | EncodedRecords, batch_id: int, now_ms: int
                 ) -> Verdict:
        """What to do with ``record`` (transformed; or a block of them: each gets the
        verdict) in batch ``batch_id``."""
        destination = record.destination
        count = record.record_count
        if destination is None:
            action = self.routing.on_missing_destination
            self.admission.note_unmatched(action, count)
            if action == "drop":
                return Verdict(Action.DROP, reason="missing_destination")
            if action == "error":
                return Verdict(Action.ERROR, reason="missing_destination",
                               error=f"no destination for the record at position "
                                     f"{record.position!r} (on_missing_destination: error)")
            topic = self.source.topic.render(record.schema, record.table)
            if topic is None:
                self.admission.counters.rejected[RejectReason.INVALID_TOPIC] += count
                return self._rejected(record, RejectReason.INVALID_TOPIC, self.source.topic.text)
            destination = Destination(topic)
        rejection = self.admission.admit(destination, batch_id, now_ms, records=count)
        if rejection is not None:
            return self._rejected(record, rejection, destination.topic)
        if destination is not record.destination:
            record = record.with_destination(destination)
        return Verdict(Action.SEND, record)

    def _rejected(self, record: Record | EncodedRecords, reason: RejectReason, topic: str
                  ) -> Verdict:
        message = f"destination {topic!r} not admitted: {reason.value}"
        policy = self.routing.on_admission_failure
        if policy == "drop":
            return Verdict(Action.DROP, reason=reason.value)
        if policy == "dlq":
            assert isinstance(record, Record), "a block never meets a DLQ policy"
            return Verdict(Action.DLQ, self.dead_letter(
                record, stage="admission", reason=reason.value, error=message,
                original_topic=topic), reason=reason.value)
        return Verdict(Action.ERROR, reason=reason.value, error=message,
                       retriable=reason is RejectReason.CIRCUIT_OPEN)

    def dead_letter(self, record: Record, *, stage: str, reason: str, error: str,
                    original_topic: str | None) -> Record:
        assert self.routing.dlq_topic is not None
        return dead_letter(record, dlq_topic=self.routing.dlq_topic, connector=self.source.name,
                           stage=stage, reason=reason, error=error,
                           original_topic=original_topic)


# --- rows -------------------------------------------------------------------------------------


def _is_envelope(value: Any) -> bool:
    return isinstance(value, dict) and ("after" in value or "before" in value)


def _row(value: Any) -> dict[str, Any] | None:
    """The row a column is looked up in: a CDC envelope's ``after`` (``before`` for a
    delete), or the value itself when it is a mapping."""
    if _is_envelope(value):
        row = value.get("after") if value.get("after") is not None else value.get("before")
        return row if isinstance(row, dict) else None
    return value if isinstance(value, dict) else None


def _stripped(value: Any, columns: tuple[str | None, ...]) -> Any:
    drop = {column for column in columns if column is not None}

    def strip(row: Any) -> Any:
        if not isinstance(row, dict):
            return row
        return {name: cell for name, cell in row.items() if name not in drop}

    if _is_envelope(value):
        return {**value, **{side: strip(value[side]) for side in ("before", "after")
                            if side in value}}
    return strip(value)


def _key_bytes(cell: Any) -> bytes | None:
    if cell is None:
        return None
    if isinstance(cell, bytes):
        return cell
    if isinstance(cell, str):
        return cell.encode()
    return json.dumps(cell, sort_keys=True, separators=(",", ":")).encode()
