"""TopicGates: a topic closed while it is deleted, and the flag every request reads."""

from __future__ import annotations

from rivven_broker.server.context import TopicGates


def test_any_closed_follows_the_gates() -> None:
    gates = TopicGates()
    assert not gates.any_closed and not gates and gates.get("a") is None
    gates.close("a")
    gates.close("b")
    event = gates.get("a")
    assert gates.any_closed and gates and event is not None and not event.is_set()
    gates.open("a")
    assert event.is_set() and gates.get("a") is None
    assert gates.any_closed and gates  # b is still closed
    gates.open("b")
    assert not gates.any_closed and not gates
