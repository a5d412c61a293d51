"""``MembershipConfig``: every timing and bound of SWIM, with defaults chosen for detection.

Theory of operation
-------------------
memberlist's LAN profile (probe 1 s, timeout 500 ms, 3 indirect probes, suspicion multiplier 4,
gossip to 3 every 200 ms) declares a crashed member dead after about five seconds or more. The
goal here is every live member knowing within 3 s at p99 (5 members, 1 % loss, 0-10 ms jitter),
without false positives, so the probe period is shortened and the rest kept:

- a crashed member is first probed by one of the other n-1 members within about
  ``probe_interval_ms x (n-1) x (1 - 0.01^(1/(n-1)))`` at p99 (each probes it once per n-1
  periods, at independent phases): 0.55 s for n=5 at 200 ms;
- the prober suspects it at the end of that period (+200 ms: direct probe, then ping-req);
- Lifeguard's suspicion timeout runs from ``min = suspicion_multiplier x log10(n) x interval``
  (0.56 s for n=5) up to ``suspicion_max_multiplier x min``, and shrinks to ``min`` once
  ``suspicion_multiplier - 2`` other members confirm: they confirm as their own probes of the
  member fail, within about a second;
- the ``dead`` gossip then reaches everyone within two or three gossip rounds (200 ms each).

About 2 s in all at p99, with 100 ms left for the probe timeout: a loopback or LAN round trip
plus jitter is far below it, and a node that misses its own deadlines (a busy event loop) slows
itself down through the local health multiplier before it accuses anyone.

Cost per member stays flat with cluster size: one probe per period whatever n, gossip to a
fixed fan-out, and a push-pull whose period grows with n so its bytes per second do not.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["MembershipConfig"]


@attrs.frozen(kw_only=True)
class MembershipConfig:
    """SWIM and Lifeguard settings (every field is a ``[cluster]`` key of the broker)."""

    #: One probe per period (scaled by the local health multiplier).
    probe_interval_ms: int = 200
    #: Wait for a direct ack this long before asking others (scaled too).
    probe_timeout_ms: int = 100
    #: Members asked to probe on our behalf (ping-req) after a direct probe times out.
    indirect_probes: int = 3
    #: Lifeguard: suspicion timeout min = multiplier x log10(n) x probe interval.
    suspicion_multiplier: int = 4
    #: Lifeguard: the timeout starts at max = this x min and shrinks with confirmations.
    suspicion_max_multiplier: int = 6
    #: Piggybacked broadcasts also go to this many random members every gossip interval.
    gossip_fanout: int = 3
    gossip_interval_ms: int = 200
    #: A broadcast is sent at most retransmit_multiplier x ceil(log10(n + 1)) times.
    retransmit_multiplier: int = 4
    #: Full-state exchange with one random member, every this long x max(1, n / 8).
    push_pull_interval_ms: int = 10_000
    #: Joining: push-pull to the seeds again this often until one answers.
    join_retry_ms: int = 1_000
    #: Push-pull with one random member believed dead, this often (a healed partition's two
    #: sides believe each other dead and would otherwise never talk again).
    reconnect_interval_ms: int = 2_000
    #: Lifeguard's local health multiplier ranges over 1 .. awareness_max.
    awareness_max: int = 8
    #: Dead or left members are forgotten this long after they went.
    dead_member_reclaim_ms: int = 3_600_000
    #: Members remembered at most (the broadcast queue holds at most one claim each).
    members_max: int = 1024
    #: Datagram payload budget (the frame adds its header and tag; a datagram stays < 1,400 B).
    payload_bytes_max: int = 1_300
    #: Lifeguard's extensions (local health, dynamic suspicion, nacks). Off: plain SWIM with
    #: a fixed suspicion timeout of min, for comparison.
    lifeguard: bool = True

    def __attrs_post_init__(self) -> None:
        assert 0 < self.probe_timeout_ms < self.probe_interval_ms
        assert 0 <= self.indirect_probes <= 16
        assert self.suspicion_multiplier >= 1 and self.suspicion_max_multiplier >= 1
        assert self.gossip_fanout >= 1 and self.gossip_interval_ms > 0
        assert self.retransmit_multiplier >= 1
        assert self.push_pull_interval_ms > 0 and self.join_retry_ms > 0
        assert self.reconnect_interval_ms > 0
        assert self.awareness_max >= 1
        assert self.members_max >= 2
        assert 200 <= self.payload_bytes_max <= 65_000

    def suspicion_bounds_ms(self, members: int) -> tuple[int, int]:
        """(min, max) suspicion timeout for a cluster of ``members`` (Lifeguard's formula;
        plain SWIM uses min for both)."""
        scale = max(1.0, math.log10(max(1, members)))
        low = int(self.suspicion_multiplier * scale * self.probe_interval_ms)
        if not self.lifeguard:
            return low, low
        return low, low * self.suspicion_max_multiplier

    def dead_within_ms(self, members: int) -> int:
        """How long this node's own view may take to call a crashed member dead, in a cluster
        of ``members`` without faults of its own: its probes visit every other member once per
        ``members - 1`` probe periods (one more for the probe and the indirect probes), then
        the suspicion runs for at most the longest timeout. The controller waits this long
        before it treats a silence of its view as a failure (``replication.liveness``)."""
        return self.probe_interval_ms * max(1, members) + self.suspicion_bounds_ms(members)[1]

    def retransmits(self, members: int) -> int:
        """How many times one broadcast is sent."""
        return self.retransmit_multiplier * max(1, _ceil_log10(members + 1))

    def push_pull_period_ms(self, members: int) -> int:
        return self.push_pull_interval_ms * max(1, members // 8)


def _ceil_log10(value: int) -> int:
    digits = 0
    power = 1
    while power < value:
        power *= 10
        digits += 1
    return digits
