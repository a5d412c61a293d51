"""Which brokers the controller may act on as gone: SWIM's word, and a grace for no word. Pure.

Theory of operation
-------------------
The controller (the Raft leader) takes brokers that are not live out of every ISR and moves
their leaderships (``election``). What it knows of liveness is its own SWIM view, and a view
can be silent about a broker that is in fact up: a broker that became the controller moments
after it restarted may not have heard its peers yet (its join answered late), and a broker
that re-registered as a new process may not have reached this view's gossip yet. Acting on
that silence takes healthy, in-sync brokers out of every ISR (``acks=all`` producers then get
NOT_ENOUGH_REPLICAS) and leaderships away from them, or leaves partitions offline.

So each registered broker is judged one of three ways (``judge``):

- ``LIVE``: SWIM has the registered process (its boot id) alive or suspect;
- ``GONE``: the registration is fenced, or SWIM says the registered process is dead or left,
  or SWIM already knows a newer process of that broker (the registered one was replaced: the
  restart is a failure of the old process, as Kafka treats a re-registration);
- ``UNKNOWN``: SWIM has no word on the registered process — it does not know the broker, or
  knows only an older process of it.

``ControllerLiveness`` turns that into the controller's two sets. ``live`` are the LIVE
brokers (the controller itself always): only they may be given leadership. ``spared`` are the
UNKNOWN brokers whose *grace* has not run out: they are not taken out of an ISR and keep their
leaderships, but are given nothing. The grace runs from the later of the moment this broker
became the controller (the term it leads) and the moment it first saw that registration (a
new boot id), and lasts ``grace_ms``: as long as SWIM needs to call a crashed member dead
(``MembershipConfig.dead_within_ms``), so a view that has been running for the grace and
still has no word on a broker is not waiting for news. Kafka's controller likewise gives every
registered broker a full session timeout after it takes over before it fences one.

A broker that really died is failed over exactly as fast as before: SWIM declares it dead
(GONE) in the time it always took, and the grace never delays a GONE broker.
"""

from __future__ import annotations

import enum
from typing import Iterable, Mapping, NamedTuple

import attrs

from rivven_cluster.membership.members import MemberState

__all__ = ["Liveness", "Registration", "Sighting", "judge", "ControllerLiveness", "Judgement"]


class Liveness(enum.Enum):
    LIVE = "live"
    UNKNOWN = "unknown"
    GONE = "gone"


class Registration(NamedTuple):
    """A broker as the metadata registers it."""

    broker_id: int
    boot_id: int
    fenced: bool


class Sighting(NamedTuple):
    """What this broker's SWIM view holds of a broker: its newest process and that one's state."""

    boot_id: int
    state: MemberState


def judge(registration: Registration, seen: Sighting | None) -> Liveness:
    """LIVE, GONE or UNKNOWN (see the module docstring)."""
    if registration.fenced:
        return Liveness.GONE
    if seen is None or seen.boot_id < registration.boot_id:
        return Liveness.UNKNOWN
    if seen.boot_id > registration.boot_id:
        return Liveness.GONE
    if seen.state in (MemberState.ALIVE, MemberState.SUSPECT):
        return Liveness.LIVE
    return Liveness.GONE


@attrs.frozen
class Judgement:
    """The controller's sets for one round of decisions."""

    #: Positively live: may keep or be given leadership and ISR membership.
    live: frozenset[int]
    #: Unknown within their grace: keep what they have, are given nothing.
    spared: frozenset[int]

    @property
    def kept(self) -> frozenset[int]:
        """Brokers the controller must not take out of an ISR or a leadership."""
        return self.live | self.spared


class ControllerLiveness:
    """The grace bookkeeping of one broker's controller role (see the module docstring)."""

    def __init__(self, node_id: int, boot_id: int, grace_ms: int) -> None:
        assert grace_ms >= 0
        self.node_id = node_id
        self.boot_id = boot_id
        self.grace_ms = grace_ms
        #: The term this broker leads and since when (its own monotonic ms); None: not leading.
        self._leading: tuple[int, int] | None = None
        #: broker id -> (registered boot id, when this controller first saw that registration)
        self._registered_since: dict[int, tuple[int, int]] = {}

    def leads(self, term: int, now_ms: int) -> None:
        """This broker is the Raft leader of ``term`` now (a new term restarts the grace)."""
        if self._leading is None or self._leading[0] != term:
            self._leading = (term, now_ms)

    def follows(self) -> None:
        """This broker is not the Raft leader (any more)."""
        self._leading = None

    def judge(self, registrations: Iterable[Registration], seen: Mapping[int, Sighting],
              now_ms: int) -> Judgement:
        """The live and spared brokers now. Only meaningful while leading."""
        assert self._leading is not None, "only the controller judges"
        leading_since_ms = self._leading[1]
        live: set[int] = set()
        spared: set[int] = set()
        known: dict[int, tuple[int, int]] = {}
        for registration in registrations:
            broker = registration.broker_id
            boot, since_ms = self._registered_since.get(broker, (registration.boot_id, now_ms))
            if boot != registration.boot_id:
                since_ms = now_ms
            known[broker] = (registration.boot_id, since_ms)
            if broker == self.node_id and registration.boot_id == self.boot_id:
                verdict = Liveness.GONE if registration.fenced else Liveness.LIVE
            else:
                verdict = judge(registration, seen.get(broker))
            if verdict is Liveness.LIVE:
                live.add(broker)
            elif (verdict is Liveness.UNKNOWN
                  and now_ms - max(leading_since_ms, since_ms) < self.grace_ms):
                spared.add(broker)
        self._registered_since = known
        return Judgement(frozenset(live), frozenset(spared))
