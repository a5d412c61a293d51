"""Membership in ``/metrics``: read from the driver and its core at scrape time.

Theory of operation
-------------------
Nothing is counted twice: the core keeps its own statistics (probes, suspicions,
refutations ...) and the driver its datagram counters; this collector turns both into
Prometheus families when ``/metrics`` is scraped, so the hot paths pay nothing for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from rivven_cluster.membership import MemberState

if TYPE_CHECKING:
    from rivven_broker.server.cluster.membership_driver import MembershipDriver

__all__ = ["MembershipCollector"]

_COUNTERS = (
    ("probes", "rivven_cluster_probes", "Direct probes (pings) sent."),
    ("probes_failed", "rivven_cluster_probes_failed", "Probes that got no ack in their period."),
    ("indirect_probes", "rivven_cluster_indirect_probes", "Ping-req sent to other members."),
    ("suspicions", "rivven_cluster_suspicions", "Members this broker began to suspect."),
    ("refutations", "rivven_cluster_refutations",
     "Suspicions of this broker it refuted (false suspicions)."),
    ("declared_dead", "rivven_cluster_declared_dead",
     "Members this broker declared dead when a suspicion ran out."),
    ("push_pulls", "rivven_cluster_push_pulls", "Periodic full-state exchanges started."),
    ("datagrams_sent", "rivven_cluster_datagrams_sent", "Datagrams sent."),
)


class MembershipCollector:
    def __init__(self, driver: MembershipDriver) -> None:
        self._driver = driver

    def collect(self) -> Iterator[object]:
        driver = self._driver
        members = GaugeMetricFamily("rivven_cluster_members",
                                    "Members this broker knows, by state.", labels=["state"])
        counts = {state: 0 for state in MemberState}
        for member in driver.members():
            counts[member.state] += 1
        for state, count in counts.items():
            members.add_metric([state.label], count)
        yield members
        core = driver.core
        if core is not None:
            stats = core.statistics()
            for field, name, documentation in _COUNTERS:
                yield CounterMetricFamily(name, documentation, value=getattr(stats, field))
            yield GaugeMetricFamily(
                "rivven_cluster_local_health",
                "Lifeguard's local health multiplier minus one (0: healthy; probes slow down "
                "by this + 1).", value=stats.awareness)
        rejected = CounterMetricFamily(
            "rivven_cluster_datagrams_rejected",
            "Datagrams dropped unread, by reason (truncated, oversized, unknown_version, "
            "unknown_key, bad_mac, stale_timestamp, replay, malformed_payload).",
            labels=["reason"])
        for reason, count in sorted(driver.rejected.items()):
            rejected.add_metric([reason], count)
        yield rejected
        yield CounterMetricFamily("rivven_cluster_datagrams_received",
                                  "Datagrams received (accepted or not).",
                                  value=driver.datagrams_received)
        yield CounterMetricFamily("rivven_cluster_received_bytes", "Bytes of datagrams received.",
                                  value=driver.bytes_received)
        yield CounterMetricFamily("rivven_cluster_sent_bytes", "Bytes of datagrams sent.",
                                  value=driver.bytes_sent)
