"""``EventRouter``: the transactional outbox (Debezium's outbox event router) over CDC.

The application writes, in the same transaction as its business change, a row to an outbox
table ``(id, aggregatetype, aggregateid, type, payload)``; CDC on that table yields envelopes.
This transform turns each *inserted* outbox row into the event it describes:

- topic: ``topic_template`` filled from the row's columns (default ``outbox.event.
  {aggregatetype}``, so ``Order`` rows go to ``outbox.event.Order``); the result must be a
  legal topic name (else ``ValueError``), and then goes through admission like any other;
- key: the ``aggregateid`` column (so one aggregate's events stay in order on one partition);
- value: the ``payload`` column; a JSON string is parsed (``expand_json_payload``, default on)
  and kept as the string when it is not valid JSON; a ``null`` payload gives a tombstone;
- headers: ``id`` (the event id) and ``type`` (the event type), then each of
  ``additional_headers`` (column names; ``null`` columns are skipped), as UTF-8 text (objects
  and lists as compact JSON).

Only inserts (``c``, and ``r`` from a snapshot) are routed. Deletes (the application may delete
the row in the same transaction) and tombstones are dropped; updates are dropped too
(``on_update: drop``, default, as Debezium's ``warn``) or raise (``on_update: error``). A value
that is not an envelope is taken as the row itself, with ``Record.op`` (``None`` = insert), so
a polling outbox source can use the same transform. A missing id, type, key, payload or
template column raises ``KeyError``; the chain wraps it for the DLQ.
"""

from __future__ import annotations

import json
import string
from typing import Any, ClassVar

import attrs

from rivven_connect.core.records import Destination, Record
from rivven_connect.core.transforms import options as opt
from rivven_connect.core.transforms.cdc import is_envelope
from rivven_connect.core.transforms.errors import TransformConfigError

__all__ = ["DEFAULT_TOPIC_TEMPLATE", "EventRouter", "header_bytes"]

#: Debezium's default: one topic per aggregate type.
DEFAULT_TOPIC_TEMPLATE = "outbox.event.{aggregatetype}"


def _template(raw: Any, where: str) -> tuple[str, tuple[str, ...]]:
    template = opt.text(raw, where)
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as error:
        raise TransformConfigError(where, f"bad template {template!r}: {error}") from None
    columns = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise TransformConfigError(where, f"placeholder {{{name}}} must be a bare column "
                                              f"name")
        columns.append(name)
    return template, tuple(columns)


def header_bytes(value: Any) -> bytes:
    """A column value as header bytes: UTF-8 text, JSON for objects/lists."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return str(value).encode("utf-8")


def _column(row: dict, name: str) -> Any:
    if name not in row:
        raise KeyError(f"the outbox row has no column {name!r}")
    return row[name]


@attrs.frozen
class EventRouter:
    """Route outbox rows to per-aggregate topics (see the module docstring)."""

    TYPE: ClassVar[str] = "EventRouter"
    topic_template: str = DEFAULT_TOPIC_TEMPLATE
    template_columns: tuple[str, ...] = ("aggregatetype",)
    field_event_id: str = "id"
    field_event_key: str = "aggregateid"
    field_event_type: str = "type"
    field_payload: str = "payload"
    expand_json_payload: bool = True
    additional_headers: tuple[str, ...] = ()
    on_update: str = "drop"

    @classmethod
    def from_options(cls, options: opt.Options) -> EventRouter:
        """Options ``topic_template``, ``field_event_id``, ``field_event_key``,
        ``field_event_type``, ``field_payload``, ``expand_json_payload``,
        ``additional_headers``, ``on_update`` (``drop``/``error``); all have defaults."""
        template, columns = options.optional(
            "topic_template", _template, _template(DEFAULT_TOPIC_TEMPLATE, "default"))
        return cls(
            topic_template=template,
            template_columns=columns,
            field_event_id=options.optional("field_event_id", opt.text, "id"),
            field_event_key=options.optional("field_event_key", opt.text, "aggregateid"),
            field_event_type=options.optional("field_event_type", opt.text, "type"),
            field_payload=options.optional("field_payload", opt.text, "payload"),
            expand_json_payload=options.optional("expand_json_payload", opt.boolean, True),
            additional_headers=options.optional("additional_headers", opt.text_list, ()),
            on_update=options.optional("on_update", opt.choice("drop", "error"), "drop"),
        )

    def apply(self, record: Record) -> Record | None:
        """The routed event, or ``None`` for deletes, tombstones and (by default) updates."""
        if record.value is None:
            return None
        if is_envelope(record.value):
            op, row = record.value["op"], record.value["after"]
        else:
            op, row = record.op or "c", record.value
        if op == "d":
            return None
        if op == "u":
            if self.on_update == "drop":
                return None
            raise ValueError("an outbox row was updated; outbox rows are insert-only")
        if not isinstance(row, dict):
            raise TypeError(f"an outbox row must be an object, not {type(row).__name__}")
        return self._event(record, row)

    def _event(self, record: Record, row: dict) -> Record:
        filled = {}
        for name in self.template_columns:
            column = _column(row, name)
            if column is None:
                raise ValueError(f"the outbox row's {name!r} is null; no topic to route to")
            filled[name] = header_bytes(column).decode("utf-8")
        topic = self.topic_template.format(**filled)
        problem = opt.topic_name_problem(topic)
        if problem is not None:
            raise ValueError(f"EventRouter made an illegal topic: {problem}")
        headers = [("id", header_bytes(_column(row, self.field_event_id))),
                   ("type", header_bytes(_column(row, self.field_event_type)))]
        headers += [(name, header_bytes(row[name])) for name in self.additional_headers
                    if row.get(name) is not None]
        return attrs.evolve(
            record,
            key=_column(row, self.field_event_key),
            value=self._payload(_column(row, self.field_payload)),
            headers=(*record.headers, *headers),
            destination=Destination(topic),
        )

    def _payload(self, payload: Any) -> Any:
        if isinstance(payload, str) and self.expand_json_payload:
            try:
                return json.loads(payload)
            except json.JSONDecodeError:
                return payload
        return payload
