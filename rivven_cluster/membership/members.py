"""Members, their states, and which claim about a member wins.

Theory of operation
-------------------
A member is one broker process: ``node_id`` (configured), ``boot_id`` (new at every start),
``incarnation`` (raised only by the member itself, to refute a suspicion), a ``state`` and the
addresses and rack it announced. Everything a node hears about a member is a *claim*
``(node_id, boot_id, incarnation, state)``; ``supersedes`` decides whether a claim replaces
what is known, the same way on every node, so views converge whatever order claims arrive in:

- a newer boot wins over an older one, whatever the incarnations (a restarted process starts
  again at incarnation 0); boot ids are ordered by start time (``boot_id`` packs the start's
  wall-clock milliseconds above 16 random bits), so stale gossip about the previous process
  can never displace the new one; a claim about an older boot is ignored;
- within one boot, a higher incarnation wins; at equal incarnation ``left`` > ``dead`` >
  ``suspect`` > ``alive`` (SWIM's rule: an accusation at the current incarnation stands until
  the member refutes it with a higher one);
- a member that left or was declared dead comes back only as a newer boot, or (declared dead
  while alive) by refuting with a higher incarnation.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import attrs

__all__ = ["Address", "MemberState", "Member", "Claim", "supersedes", "make_boot_id"]


class Address(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class MemberState(enum.IntEnum):
    """Ordered by precedence at equal incarnation."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@attrs.frozen
class Member:
    """What one node knows about one member (a read-only snapshot)."""

    node_id: int
    boot_id: int
    incarnation: int
    state: MemberState
    cluster_address: Address
    client_address: Address
    rack: str | None
    #: When this node saw the state begin (its own monotonic clock).
    since_ms: int

    @property
    def up(self) -> bool:
        return self.state in (MemberState.ALIVE, MemberState.SUSPECT)


class Claim(NamedTuple):
    node_id: int
    boot_id: int
    incarnation: int
    state: MemberState


def supersedes(claim: Claim, known: Claim | None) -> bool:
    """Whether ``claim`` replaces ``known`` (see the module docstring). Pure."""
    if known is None:
        return True
    assert claim.node_id == known.node_id
    if claim.boot_id != known.boot_id:
        return claim.boot_id > known.boot_id
    if claim.incarnation != known.incarnation:
        return claim.incarnation > known.incarnation
    return claim.state > known.state


def make_boot_id(start_wall_ms: int, random_bits: int) -> int:
    """A boot id: the start time in ms above 16 random bits (unique, ordered by start)."""
    assert 0 <= random_bits < 1 << 16 and start_wall_ms >= 0
    return (start_wall_ms << 16) | random_bits
