"""The cluster in ``/metrics`` (membership, controller, replication), read at scrape time.

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
    from rivven_broker.server.cluster.cluster_control import ClusterControl
    from rivven_broker.server.cluster.membership_driver import MembershipDriver

__all__ = ["MembershipCollector", "ControllerCollector", "ReplicationCollector"]

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


class ControllerCollector:
    """The controller as this broker sees it: its Raft term, commit index and applied index,
    whether it leads, and the Raft links closed or refused, by reason."""

    def __init__(self, control: ClusterControl) -> None:
        self._control = control

    def collect(self) -> Iterator[object]:
        control = self._control
        if control.running:
            status = control.status()
            yield GaugeMetricFamily("rivven_controller_term", "The Raft term this broker is in.",
                                    value=status.term)
            yield GaugeMetricFamily("rivven_controller_commit_index",
                                    "The controller log's commit index as this broker knows it.",
                                    value=status.commit_index)
            yield GaugeMetricFamily("rivven_controller_applied_index",
                                    "The controller log's last index applied here.",
                                    value=status.last_applied)
            yield GaugeMetricFamily("rivven_controller_leader",
                                    "1 while this broker leads the controller's Raft, else 0.",
                                    value=1 if status.state == "leader" else 0)
        faults = CounterMetricFamily(
            "rivven_controller_link_faults",
            "Raft links closed or refused, by reason (bad_mac, unknown_key, sequence, oversized, "
            "malformed, handshake_failed, unexpected_peer, idle_timeout, bad_payload, "
            "observer_message_refused).", labels=["reason"])
        if control.host is not None:
            for reason, count in sorted(control.host.links.faults.items()):
                faults.add_metric([reason], count)
        yield faults


class ReplicationCollector:
    """This broker's replicas: partitions it leads and follows, how many of those it leads are
    under-replicated (ISR smaller than the replicas), the cluster's offline partitions (no
    leader) as the applied metadata says, and the replica manager's events by kind
    (truncations, divergences answered, ISR proposals, refused fetches ...)."""

    def __init__(self, control: ClusterControl) -> None:
        self._control = control

    def collect(self) -> Iterator[object]:
        control = self._control
        replicas = control.replicas
        offline = 0
        for topic in control.image().topics.values():
            offline += sum(1 for part in topic.partitions if part.leader < 0)
        yield GaugeMetricFamily("rivven_offline_partitions",
                                "Partitions with no leader in the applied metadata (no live "
                                "in-sync replica: no unclean election).", value=offline)
        if replicas is None:
            return
        leading = replicas.leading()
        yield GaugeMetricFamily("rivven_partitions_led", "Partitions this broker leads.",
                                value=len(leading))
        yield GaugeMetricFamily("rivven_partitions_followed",
                                "Partitions this broker follows (fetches from their leader).",
                                value=len(replicas.following()))
        yield GaugeMetricFamily(
            "rivven_under_replicated_partitions",
            "Partitions this broker leads whose ISR is smaller than their replica set.",
            value=sum(1 for state in leading.values() if len(state.isr) < len(state.replicas)))
        events = CounterMetricFamily(
            "rivven_replica_events",
            "Replication events by kind (truncations, resets, divergences_answered, "
            "isr_proposals, fetch_<code> refused to followers, fetched_<code> refused by "
            "leaders).", labels=["event"])
        for event, count in sorted(replicas.counters.items()):
            events.add_metric([event], count)
        yield events
