"""``ClusterControl``: what a ``--peers`` broker asks of the controller, and what it does because
of it.

Theory of operation
-------------------
Cluster metadata lives in the controller's Raft log (``controller_host``); every broker holds a
replica of it and answers from what it has applied. This module is the server's one door to it:

- *registration*: once the controller runs, the broker registers itself (node id, this boot's
  id, the client address it advertises, rack, whether it votes) and registers again whenever
  the applied record is not this process's; the Raft leader fences a registration as soon as
  SWIM knows a newer process (boot id) of that broker;
- *admin*: ``create_topic``, ``delete_topic``, ``create_partitions`` and ``alter_configs``
  decide on this broker (placement on the ring over the live registered brokers, a fresh topic
  id from the Env) and propose one compare-and-set command; the answer comes once the command
  is committed and applied here (followers forward to the Raft leader);
- *reconciliation*: the local topic registry is a cache of the applied metadata. After every
  applied command (and once at start, when the log has been applied up to the commit index the
  leader announced), local logs are created for topics the metadata has and deleted for topics
  it does not — nothing else creates or deletes topics on a clustered broker. Before a new
  image's changes reach the disk, its applied index is written durably (``reconciled.checkpoint``
  in the controller's directory: the *reconciled floor*), and a restarted broker reconciles
  nothing older than that floor. The commit index PySyncObj declares the log ready at is the
  one an AppendEntries carried, which a new Raft leader may announce lagging; without the floor
  a restarted broker could act on an image older than one its previous process acted on — bring
  back a topic that process deleted (an empty log: no epoch checkpoint remembers that the topic's
  epoch 0 was led, so it would be led again), or delete a newer topic of the same name;
- *coordinators*: the Raft leader creates ``__consumer_offsets`` (and ``__transaction_state``)
  in the metadata once
  min(3, voters) brokers are live (``_internal_topics_loop``); after every applied change the
  group driver is told which of its partitions this broker leads (``_coordinate``), and
  coordinates exactly their groups; ``__transaction_state`` and the transaction coordinator
  likewise. ``calls`` carries what one broker asks of another (``broker_calls.py``:
  transaction markers, transactional offsets, membership and produce checks);
- *metadata*: ``metadata()`` answers the Metadata api from the applied image: live brokers
  (registered, not fenced, and alive to SWIM), the controller (the Raft leader), and per
  partition its leader, leader epoch, replicas and ISR.
- *failover*: on the Raft leader, ``_election_loop`` moves leaderships off gone brokers and
  takes them out of the ISRs. Gone is ``rivven_cluster.replication.liveness``'s judgement of
  the registration against this broker's SWIM view; a broker the view has no word on yet is
  spared for a grace (as long as SWIM takes to call a crashed member dead) after this broker
  became the controller, so a view still being built is not acted on.

A broker holds a log for every partition of every topic for now (the replica fetcher of the
replication step makes the followers' copies meaningful); which broker leads is the metadata's.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import trio

from rivven_broker.coordinator.offsets_codec import OFFSETS_TOPIC
from rivven_broker.coordinator.txn_log_codec import TRANSACTION_STATE_TOPIC
from rivven_broker.protocol import limits
from rivven_broker.protocol.messages import (
    AlterTopicConfig,
    AlterTopicConfigResponse,
    BrokerMetadata,
    CreatePartitions as CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopic as CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopic as DeleteTopicRequest,
    DeleteTopicResponse,
    Metadata,
    MetadataResponse,
    PartitionMetadata,
    TopicMetadata,
)
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.names import topic_name_error
from rivven_broker.server.cluster.broker_calls import BrokerCalls
from rivven_broker.server.cluster.controller_host import (
    ControllerHost,
    ControllerObserver,
    ControllerUnavailable,
    RaftConfig,
)
from rivven_broker.server.cluster.pysyncobj_host import RaftStatus
from rivven_broker.server.cluster.raft_links import ask_voters
from rivven_broker.server.cluster.replica_manager import ReplicaConfig, ReplicaManager
from rivven_broker.server.context import Pending, ServerContext
from rivven_broker.server.env import Env
from rivven_broker.server.internal_topics import is_internal_topic, offsets_topic_config
from rivven_broker.server.local_control import LocalControl, clip
from rivven_broker.server.local_topics import LocalTopics
from rivven_broker.storage.checkpoint import read_checkpoint, write_checkpoint
from rivven_broker.storage.errors import StorageError, TopicExistsError, stop_on_io_error
from rivven_broker.storage.topic_config import TopicConfig
from rivven_cluster.membership import KeyRing, Member, MembershipConfig, MemberState
from rivven_cluster.metadata import (
    AllocateProducerIds,
    AlterTopicConfigs,
    Command,
    CreatePartitions,
    CreateTopic,
    EMPTY_IMAGE,
    DeleteTopic,
    ElectLeader,
    FenceBroker,
    MetadataImage,
    Outcome,
    PartitionRecord,
    RegisterBroker,
    Status,
    UpdateIsr,
)
from rivven_cluster.placement import PlacementBroker, PlacementError, assign_topic
from rivven_cluster.replication import (
    ControllerLiveness,
    Judgement,
    Registration,
    Sighting,
    leader_after_failure,
    preferred_move,
)

__all__ = ["ClusterControl", "AdminAnswer"]

log = logging.getLogger(__name__)

AdminAnswer = tuple[ErrorCode, str | None]
_OK: AdminAnswer = (ErrorCode.NONE, None)
_CONTROLLER_DIRECTORY = ".controller"
#: The applied index of the newest image whose changes may have reached the local logs.
_RECONCILED_FLOOR_FILE = "reconciled.checkpoint"
#: How soon a reconciliation whose floor could not be written (a full disk) is tried again.
_FLOOR_RETRY_S = 0.5
_REGISTER_RETRY_S = 0.5
_CONFLICT_RETRIES = 3
_AUTO_CREATES_MAX = 64
_FENCE_CHECK_S = 0.5
#: How long a starting broker asks its peers for the voters before it takes --peers + itself.
_ASK_VOTERS_S = 1.0
_ELECTION_CHECK_S = 0.2
_INTERNAL_CHECK_S = 0.5
#: How often leadership moves back to preferred replicas (Kafka checks every 300 s).
_PREFERRED_CHECK_S = 30


class ClusterControl:
    def __init__(self, env: Env, *, node_id: int, rack: str | None,
                 voters: dict[int, tuple[str, int]], ring: Callable[[], KeyRing],
                 local: LocalTopics, members: Callable[[], list[Member]],
                 internal: LocalControl | None = None, auto_create_topics: bool = True,
                 default_partitions: int = 3, default_replication_factor: int = 1,
                 raft: RaftConfig = RaftConfig(), observer: ControllerObserver | None = None,
                 context: ServerContext | None = None,
                 replication: ReplicaConfig = ReplicaConfig(),
                 liveness_grace_ms: int | None = None) -> None:
        self._env = env
        self.node_id = node_id
        self.boot_id = 0
        self._rack = rack
        self._advertised = ("", 0)
        self._voters = dict(voters)
        self._ring = ring
        self._raft = raft
        self._observer = observer
        self._local = local
        self._members = members
        self._internal = internal
        self._auto_create_topics = auto_create_topics
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor
        self._ids = env.rng("topic-ids")
        #: The controller's Raft host, once ``run`` started it.
        self.host: ControllerHost | None = None
        self.reconciled = trio.Event()
        #: The applied index the local logs were last made to match.
        self.reconciled_index = 0
        self._reconciled_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._creating: set[str] = set()
        self._context = context
        self._replication = replication
        #: This broker's replicas (leader and follower roles), once ``run`` started them.
        self.replicas: ReplicaManager | None = None
        #: Calls to and from other brokers (transaction markers, offsets, checks).
        self.calls: BrokerCalls | None = None
        self._allocating = trio.Lock()
        #: How long, as the controller, a silence of SWIM about a registered broker is not
        #: taken for a failure (``replication.liveness``): by default as long as SWIM needs
        #: to call a crashed member dead.
        self.liveness_grace_ms = (MembershipConfig().dead_within_ms(len(self.voters))
                                  if liveness_grace_ms is None else liveness_grace_ms)
        self._liveness = ControllerLiveness(node_id, 0, self.liveness_grace_ms)

    # -- running -----------------------------------------------------------------------------

    async def run(self, *, boot_id: int, advertised: tuple[str, int], listen: tuple[str, int],
                  task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run the controller for this process (``boot_id``), registered at ``advertised``,
        its Raft links on ``listen``; until cancelled."""
        self.boot_id, self._advertised = boot_id, advertised
        self._liveness = ControllerLiveness(self.node_id, boot_id, self.liveness_grace_ms)
        voters = {**self._voters, self.node_id: listen}
        known = await ask_voters(self._env, self.node_id, boot_id, self._voters, self._ring,
                                 _ASK_VOTERS_S)
        if known is not None and self.node_id not in known:
            # Started later, pointed at a running cluster: follow its log without voting.
            voters = {v: self._voters[v] for v in known if v in self._voters}
            unknown = sorted(set(known) - set(voters))
            if unknown:
                log.warning("the cluster's voters include %s, which --peers does not name: "
                            "name every voter", unknown)
            log.info("not a voter (the voters are %s): following the controller's log",
                     list(known))
        self.host = ControllerHost(self._env, node_id=self.node_id, boot_id=boot_id,
                                   voters=voters, ring=self._ring,
                                   directory=_CONTROLLER_DIRECTORY, listen=listen,
                                   config=self._raft)
        self.host.observer = self._observer
        if self._context is not None:
            self.replicas = ReplicaManager(
                self._context, node_id=self.node_id, boot_id=boot_id, ring=self._ring,
                address_of=self._cluster_address, propose=self.propose,
                config=self._replication)
            self._context.replicas = self.replicas
            self.host.links.replica_handler = self.replicas.serve
        self.calls = BrokerCalls(self._env, node_id=self.node_id, boot_id=boot_id,
                                 ring=self._ring, address_of=self._cluster_address)
        if self._context is not None and self._context.txn is not None:
            self.calls.handlers.update(self._context.txn.call_handlers())
        self.host.links.call_handler = self.calls.serve
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.replicas is not None:
                await nursery.start(self.replicas.run)
            await nursery.start(self.host.run)
            nursery.start_soon(self._register_loop)
            nursery.start_soon(self._reconcile_loop)
            nursery.start_soon(self._fence_loop)
            nursery.start_soon(self._election_loop)
            nursery.start_soon(self._internal_topics_loop)
            task_status.started()

    @property
    def running(self) -> bool:
        return self.host is not None and self.host.running

    @property
    def voters(self) -> list[int]:
        if self.host is not None:
            return self.host.voters
        return sorted({*self._voters, self.node_id})

    def status(self) -> RaftStatus:
        assert self.host is not None
        return self.host.status()

    async def propose(self, command: Command) -> Outcome:
        """Commit ``command`` (``ControllerHost.propose``); ControllerUnavailable before the
        controller runs."""
        if self.host is None:
            raise ControllerUnavailable("the controller is not running yet")
        return await self.host.propose(command)

    @property
    def ready(self) -> bool:
        """Applied the log up to the leader's commit index at start, reconciled, and this
        process registered."""
        record = self.image().broker(self.node_id)
        return (self.reconciled.is_set() and record is not None
                and record.boot_id == self.boot_id and not record.fenced)

    def image(self) -> MetadataImage:
        return EMPTY_IMAGE if self.host is None else self.host.image()

    async def _register_loop(self) -> None:
        assert self.host is not None
        command = RegisterBroker(self.node_id, self.boot_id, self._advertised[0],
                                 self._advertised[1], self._rack, voter=self.host.voting)
        while True:
            record = self.image().broker(self.node_id)
            if record is None or record.boot_id != self.boot_id or record.fenced:
                try:
                    outcome = await self.propose(command)
                except ControllerUnavailable as exc:
                    log.info("registration not yet committed: %s", exc)
                    await trio.sleep(_REGISTER_RETRY_S)
                    continue
                if not outcome.ok:
                    log.error("the controller refused this broker's registration: %s",
                              outcome.message)
                    await trio.sleep(_REGISTER_RETRY_S)
                    continue
                log.info("registered with the controller (boot %d)", self.boot_id)
            await self.host.changed()

    async def _fence_loop(self) -> None:
        """On the Raft leader: fence a registration once SWIM knows a newer process of that
        broker (its old process is gone; the new one registers itself)."""
        while True:
            await trio.sleep(_FENCE_CHECK_S)
            if not self.running or self.status().state != "leader":
                continue
            newest = {m.node_id: m.boot_id for m in self._members()}
            for record in list(self.image().brokers.values()):
                seen = newest.get(record.broker_id)
                if not record.fenced and seen is not None and seen > record.boot_id:
                    try:
                        await self.propose(FenceBroker(record.broker_id, record.boot_id))
                    except ControllerUnavailable:
                        break
                    log.info("fenced broker %d's old process (boot %d)", record.broker_id,
                             record.boot_id)

    def _cluster_address(self, broker_id: int) -> tuple[str, int] | None:
        """Where ``broker_id`` takes cluster traffic (its SWIM record, else --peers)."""
        for member in self._members():
            if member.node_id == broker_id:
                return member.cluster_address.host, member.cluster_address.port
        return self._voters.get(broker_id)

    async def _election_loop(self) -> None:
        """On the Raft leader: give every partition whose leader is gone the first live ISR
        member (``leader_after_failure``), take gone brokers out of every other ISR, and every
        ``_PREFERRED_CHECK_S`` move leadership back to preferred replicas that are live and in
        sync. Gone and live are ``judge_liveness``'s: a broker SWIM has no word on yet is
        spared for a grace after this broker became the controller — neither taken out nor
        given anything — so a controller whose view is still being built does not act on it.
        The judgement is made again after every proposal (time passes while one commits, and
        the term may change under it)."""
        preferred_due = self._env.clock.monotonic_ms() + _PREFERRED_CHECK_S * 1000
        while True:
            await trio.sleep(_ELECTION_CHECK_S)
            if not self.running or not self.reconciled.is_set():
                continue
            judged = self.judge_liveness()
            if judged is None:
                continue
            now_ms = self._env.clock.monotonic_ms()
            preferred = now_ms >= preferred_due
            if preferred:
                preferred_due = now_ms + _PREFERRED_CHECK_S * 1000
            partitions = [(name, index, part)
                          for name, record in sorted(self.image().topics.items())
                          for index, part in enumerate(record.partitions)]
            for name, index, part in partitions:
                if judged is None:
                    judged = self.judge_liveness()
                    if judged is None:
                        break  # no longer the controller
                    part = self.image().partition(name, index) or part
                command = self._election_command(name, index, part, judged, preferred)
                if command is None:
                    continue
                judged = None  # judged again after the proposal
                try:
                    outcome = await self.propose(command)
                except ControllerUnavailable:
                    break
                if outcome.ok and isinstance(command, ElectLeader):
                    log.info("%s/%d: leader %d -> %d at epoch %d (ISR %s)", name, index,
                             part.leader, command.leader, part.leader_epoch + 1,
                             list(command.isr))
                elif outcome.ok:
                    log.info("%s/%d: ISR %s without the brokers that are gone",
                             name, index, list(command.isr))

    def _election_command(self, name: str, index: int, part: PartitionRecord, judged: Judgement,
                          preferred: bool) -> Command | None:
        """What the controller proposes for one partition now (None: nothing)."""
        live, kept = judged.live, judged.kept
        if part.leader not in kept:
            eligible = (part.replicas if self._replication.faults.elect_outside_isr
                        else part.isr)
            leader, isr = leader_after_failure(part.replicas, eligible, live, judged.spared)
            if leader != part.leader:
                return ElectLeader(name, index, part.leader_epoch, leader, isr)
        elif any(r not in kept for r in part.isr):  # as Kafka's controller does: a gone
            # follower leaves every ISR at once, so acks=all does not wait out the lag bound
            return UpdateIsr(name, index, part.leader_epoch, part.partition_epoch,
                             tuple(r for r in part.isr if r in kept))
        elif preferred:
            moved = preferred_move(part.replicas, part.leader, part.isr, live)
            if moved is not None:
                return ElectLeader(name, index, part.leader_epoch, moved, part.isr)
        return None

    def judge_liveness(self) -> Judgement | None:
        """As the Raft leader: the brokers that are live and those spared for their grace
        (``replication.liveness``); None when this broker is not the Raft leader."""
        status = self.status() if self.running else None
        if status is None or status.state != "leader":
            self._liveness.follows()
            return None
        now_ms = self._env.clock.monotonic_ms()
        self._liveness.leads(status.term, now_ms)
        seen = {m.node_id: Sighting(m.boot_id, m.state) for m in self._members()}
        registrations = [Registration(b.broker_id, b.boot_id, b.fenced)
                         for b in self.image().brokers.values()]
        return self._liveness.judge(registrations, seen, now_ms)

    async def _internal_topics_loop(self) -> None:
        """On the Raft leader: create ``__consumer_offsets`` and ``__transaction_state`` in
        the metadata once enough brokers are live for their replication factor, min(3,
        voters) (Kafka waits for ``offsets.topic.replication.factor`` brokers the same way;
        until then FindCoordinator answers COORDINATOR_NOT_AVAILABLE)."""
        context = self._context
        if context is None or context.groups is None:
            return
        wanted = {OFFSETS_TOPIC: (context.groups.settings.offsets_topic_partitions,
                                  offsets_topic_config()),
                  TRANSACTION_STATE_TOPIC: (context.config.transaction_state_partitions,
                                            {"cleanup.policy": "compact"})}
        while True:
            await trio.sleep(_INTERNAL_CHECK_S)
            missing = [name for name in sorted(wanted) if self.image().topic(name) is None]
            if (not missing or not self.running or self.status().state != "leader"
                    or not self.reconciled.is_set()):
                continue
            factor = min(3, len(self.voters))
            if len(self.live_brokers()) < factor:
                continue
            for name in missing:
                partitions, configs = wanted[name]
                answer = await self.propose_topic(name, partitions, factor, configs, False)
                if answer[0] not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                    log.warning("could not create %s: %s", name, answer[1])

    async def allocate_producer_ids(self, count: int) -> tuple[int, int] | None:
        """``count`` producer ids no other allocation holds, as ``(start, end)``, from the
        controller's log (compare-and-set on the next free id, one allocation of this broker
        at a time, each with its own request id; a race is retried), or None when the
        controller cannot commit one now."""
        async with self._allocating:
            for _ in range(_CONFLICT_RETRIES * 3):
                expected = self.image().next_producer_id
                request_id = self._ids.getrandbits(63)
                command = AllocateProducerIds(self.node_id, request_id, expected, count)
                try:
                    outcome = await self.propose(command)
                except ControllerUnavailable as exc:
                    log.warning("no producer ids from the controller: %s", exc)
                    return None
                if outcome.ok:
                    return expected, expected + count
                if outcome.status is not Status.CONFLICT:
                    log.warning("no producer ids from the controller: %s", outcome.message)
                    return None
        return None

    def _coordinate(self, image: MetadataImage) -> None:
        """Give the group and transaction coordinators the partitions of their internal
        topics this broker leads now."""
        context = self._context
        if context is None or self.replicas is None:
            return
        leading = self.replicas.leading()
        for name, driver in ((OFFSETS_TOPIC, context.groups),
                             (TRANSACTION_STATE_TOPIC, context.txn)):
            record = image.topic(name)
            if driver is None or record is None:
                continue
            driver.own(len(record.partitions), {
                partition: state.leader_epoch
                for (topic, partition), state in leading.items() if topic == name})

    async def _reconcile_loop(self) -> None:
        assert self.host is not None
        floor = await self._env.run_sync(read_checkpoint, self._env.disk,
                                         _CONTROLLER_DIRECTORY, _RECONCILED_FLOOR_FILE) or 0
        await self.host.ready.wait()
        if self.image().applied_index < floor:
            log.info("waiting for the controller's log to reach index %d, the last one this "
                     "broker reconciled (applied: %d)", floor, self.image().applied_index)
        while self.image().applied_index < floor:
            await self.host.changed()
        while True:
            changed = self.host.next_change()  # taken before reconciling: none is missed
            image = self.image()
            if image.applied_index > floor:
                if not await self._raise_floor(image.applied_index):
                    with trio.move_on_after(_FLOOR_RETRY_S):
                        await changed.wait()
                    continue
                floor = image.applied_index
            await self._reconcile(image)
            if self.replicas is not None:
                self.replicas.apply(image)
                self._coordinate(image)
            self.reconciled_index = image.applied_index
            self.reconciled.set()
            self._reconciled_changed.set()
            self._reconciled_changed = trio.Event()
            await changed.wait()

    async def _raise_floor(self, index: int) -> bool:
        """Make ``index`` the reconciled floor, durably, before any change of its image
        reaches the local logs; False when the disk refused (full: the caller retries)."""
        try:
            await self._env.run_sync(write_checkpoint, self._env.disk, _CONTROLLER_DIRECTORY,
                                     _RECONCILED_FLOOR_FILE, index)
        except (StorageError, OSError) as exc:
            stop_on_io_error(exc, "writing the reconciled floor")
            log.error("could not write the reconciled floor %d (the metadata is applied "
                      "locally once it is written): %s", index, exc)
            return False
        return True

    async def _reconcile(self, image: MetadataImage) -> None:
        local = self._local.topics()
        now_ms = self._env.clock.wall_ms()
        for name, info in sorted(local.items()):
            wanted = image.topic(name)
            if wanted is None and is_internal_topic(name):
                continue  # an internal topic the metadata does not have yet
            if wanted is None or wanted.topic_id != info.topic_id:
                log.info("deleting local topic %s: the cluster metadata %s", name,
                         "has another topic of that name" if wanted else "does not list it")
                try:
                    await self._local.delete(name)
                except (StorageError, OSError) as exc:
                    stop_on_io_error(exc, f"deleting local topic {name}")
                    log.error("could not delete local topic %s: %s", name, exc)
        local = self._local.topics()
        for name, record in sorted(image.topics.items()):
            count = len(record.partitions)
            info = local.get(name)
            try:
                if info is None:
                    self._local.create(name, count, record.replication_factor,
                                       record.configs, now_ms, topic_id=record.topic_id)
                    continue
                if info.partitions < count:
                    self._local.grow(name, count, now_ms)
                self._local.configure(name, record.configs)
            except TopicExistsError:
                pass
            except (StorageError, OSError) as exc:
                stop_on_io_error(exc, f"applying the metadata of topic {name} locally")
                log.error("could not apply the metadata of topic %s locally: %s", name, exc)

    # -- metadata ----------------------------------------------------------------------------

    def live_brokers(self) -> list[int]:
        """Registered, not fenced, and alive to this broker's SWIM view (itself: always)."""
        image = self.image()
        alive = {m.node_id: m.boot_id for m in self._members()
                 if m.state in (MemberState.ALIVE, MemberState.SUSPECT)}
        alive[self.node_id] = self.boot_id
        return sorted(b.broker_id for b in image.brokers.values()
                      if not b.fenced and alive.get(b.broker_id) == b.boot_id)

    def controller_id(self) -> int:
        if not self.running:
            return -1
        leader = self.status().leader
        return -1 if leader is None else leader

    def metadata_of(self, names: tuple[str, ...] | None) -> MetadataResponse:
        image = self.image()
        live = set(self.live_brokers())
        brokers = tuple(BrokerMetadata(b.broker_id, b.host, b.port, b.rack)
                        for b in (image.brokers[i] for i in sorted(live)))
        if names is None:
            names = tuple(sorted(n for n in image.topics if not is_internal_topic(n)))
        described = []
        for name in names:
            record = image.topic(name)
            code = topic_name_error(name)
            if code is None and record is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if code is not None or record is None:
                described.append(TopicMetadata(name, code or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            partitions = []
            for index, part in enumerate(record.partitions):
                leader = part.leader if part.leader in live else -1
                partitions.append(PartitionMetadata(
                    index, ErrorCode.NONE if leader != -1 else ErrorCode.LEADER_NOT_AVAILABLE,
                    leader, part.leader_epoch, part.replicas, part.isr,
                    tuple(r for r in part.replicas if r not in live)))
            described.append(TopicMetadata(name, ErrorCode.NONE, is_internal_topic(name),
                                           tuple(partitions)))
        return MetadataResponse(brokers, self.controller_id(), "rivven-cluster",
                                tuple(described))

    def leader_address(self, topic: str, partition: int) -> tuple[int, str, int] | None:
        """The live leader of ``topic/partition`` and the client address it advertises (None:
        no such partition, or it has no live leader now)."""
        part = self.image().partition(topic, partition)
        if part is None or part.leader not in self.live_brokers():
            return None
        broker = self.image().brokers[part.leader]
        return broker.broker_id, broker.host, broker.port

    def leadership_error(self, topic: str, partition: int) -> AdminAnswer | None:
        """Why this broker may not append to ``topic/partition`` (None: it leads it)."""
        part = self.image().partition(topic, partition)
        if part is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {topic}/{partition}"
        if part.leader != self.node_id:
            return ErrorCode.NOT_LEADER, (f"broker {part.leader} leads {topic}/{partition} "
                                          f"(epoch {part.leader_epoch}); refresh metadata")
        return None

    def auto_create(self, name: str, now_ms: int = 0) -> AdminAnswer:
        """Start creating ``name`` (default layout) in the background, as Kafka does: the
        asker hears LEADER_NOT_AVAILABLE and retries until the topic has leaders."""
        if (self.image().topic(name) is None and name not in self._creating
                and len(self._creating) < _AUTO_CREATES_MAX and self._nursery is not None):
            self._creating.add(name)
            self._nursery.start_soon(self._auto_create, name)
        return ErrorCode.LEADER_NOT_AVAILABLE, f"topic {name!r} is being created"

    async def _auto_create(self, name: str) -> None:
        try:
            factor = max(1, min(self.default_replication_factor, len(self.live_brokers())))
            code, message = await self.propose_topic(name, self.default_partitions, factor, {},
                                                     False)
            if code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                log.warning("auto-creating topic %s failed: %s", name, message)
        finally:
            self._creating.discard(name)

    # -- the handlers' interface (control.Control) -------------------------------------------

    def metadata(self, request: Metadata, now_ms: int) -> MetadataResponse:
        response = self.metadata_of(request.topics)
        if request.allow_auto_topic_creation and self._auto_create_topics:
            for topic in response.topics:
                if topic.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION \
                        and not is_internal_topic(topic.name):
                    self.auto_create(topic.name, now_ms)
        return response

    def create_topic(self, request: CreateTopicRequest,
                     now_ms: int) -> CreateTopicResponse | Pending:
        name = request.name
        if is_internal_topic(name):
            return CreateTopicResponse(name, ErrorCode.POLICY_VIOLATION,
                                       "internal topics are the brokers' own")
        partitions = self.default_partitions if request.partitions == -1 else request.partitions
        factor = (min(self.default_replication_factor, len(self.live_brokers()))
                  if request.replication_factor == -1 else request.replication_factor)

        async def create() -> CreateTopicResponse:
            code, message = await self.propose_topic(
                name, partitions, factor, dict(request.configs), request.validate_only)
            return CreateTopicResponse(name, code, message and clip(message), partitions, factor)
        return Pending(create, serial=True)

    def delete_topic(self, request: DeleteTopicRequest,
                     now_ms: int) -> DeleteTopicResponse | Pending:
        if is_internal_topic(request.name):  # the broker's own: local, never in the metadata
            return self._internal.delete_topic(request, now_ms)

        async def delete() -> DeleteTopicResponse:
            code, message = await self.propose_deletion(request.name)
            return DeleteTopicResponse(request.name, code, message and clip(message))
        return Pending(delete, serial=True)

    def alter_topic_config(self, request: AlterTopicConfig,
                           now_ms: int) -> AlterTopicConfigResponse | Pending:
        if is_internal_topic(request.name):
            return self._internal.alter_topic_config(request, now_ms)

        async def alter() -> AlterTopicConfigResponse:
            code, message = await self.propose_configs(
                request.name, dict(request.configs), request.validate_only)
            return AlterTopicConfigResponse(request.name, code, message and clip(message))
        return Pending(alter, serial=True)

    def create_partitions(self, request: CreatePartitionsRequest,
                          now_ms: int) -> CreatePartitionsResponse | Pending:
        name = request.name
        if is_internal_topic(name):
            return self._internal.create_partitions(request, now_ms)

        async def grow() -> CreatePartitionsResponse:
            code, message = await self.propose_partitions(name, request.count,
                                                          request.validate_only)
            record = self.image().topic(name)
            count = len(record.partitions) if record is not None else -1
            return CreatePartitionsResponse(name, code, message and clip(message), count)
        return Pending(grow, serial=True)

    # -- admin -------------------------------------------------------------------------------

    async def _propose(self, command: Command) -> Outcome | AdminAnswer:
        try:
            return await self.propose(command)
        except ControllerUnavailable as exc:
            return ErrorCode.REQUEST_TIMED_OUT, f"the controller did not answer: {exc}"

    def _placement(self, name: str, partitions: int, factor: int, first: int = 0
                   ) -> tuple[tuple[int, ...], ...] | AdminAnswer:
        image = self.image()
        live = self.live_brokers()
        if not 1 <= factor <= len(live):
            return (ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor {factor} needs as many live brokers; "
                    f"{len(live)} are live ({', '.join(map(str, live))})")
        brokers = [PlacementBroker(b, image.brokers[b].rack) for b in live]
        try:
            assignment = assign_topic(brokers, name, first + partitions, factor)
        except PlacementError as exc:
            return ErrorCode.INVALID_REPLICATION_FACTOR, str(exc)
        return assignment[first:]

    async def propose_topic(self, name: str, partitions: int, factor: int,
                           configs: dict[str, str], validate_only: bool) -> AdminAnswer:
        if topic_name_error(name) is not None:
            return ErrorCode.INVALID_TOPIC_NAME, "invalid topic name"
        if not 1 <= partitions <= limits.partitions_per_topic_max:
            return (ErrorCode.INVALID_PARTITIONS,
                    f"partitions must be 1..{limits.partitions_per_topic_max}")
        try:
            TopicConfig.parse(configs)
        except ValueError as exc:
            return ErrorCode.INVALID_CONFIG, str(exc)
        if self.image().topic(name) is not None:
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
        assignment = self._placement(name, partitions, factor)
        if isinstance(assignment, tuple) and assignment and isinstance(assignment[0], ErrorCode):
            return assignment  # type: ignore[return-value]
        if validate_only:
            return _OK
        topic_id = self._ids.randbytes(16).hex()
        outcome = await self._propose(CreateTopic(name, topic_id, assignment, configs))
        answer = self._answer(outcome, name)
        if answer == _OK:
            log.info("created topic %s: %d partitions, replication factor %d", name,
                     partitions, factor)
            await self._reconciled_to(self.image().applied_index)
        return answer

    async def propose_deletion(self, name: str) -> AdminAnswer:
        record = self.image().topic(name)
        if record is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
        answer = self._answer(await self._propose(DeleteTopic(name, record.topic_id)), name)
        if answer == _OK:
            await self._reconciled_to(self.image().applied_index)
        return answer

    async def propose_partitions(self, name: str, count: int,
                                 validate_only: bool) -> AdminAnswer:
        record = self.image().topic(name)
        if record is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
        current = len(record.partitions)
        if count <= current:
            return (ErrorCode.INVALID_PARTITIONS,
                    f"topic {name!r} has {current} partitions; the count can only grow")
        if count > limits.partitions_per_topic_max:
            return (ErrorCode.INVALID_PARTITIONS,
                    f"partitions must be at most {limits.partitions_per_topic_max}")
        added = self._placement(name, count - current, record.replication_factor, current)
        if isinstance(added, tuple) and added and isinstance(added[0], ErrorCode):
            return added  # type: ignore[return-value]
        if validate_only:
            return _OK
        command = CreatePartitions(name, record.topic_id, current, added)
        answer = self._answer(await self._propose(command), name)
        if answer == _OK:
            await self._reconciled_to(self.image().applied_index)
        return answer

    async def propose_configs(self, name: str, configs: dict[str, str | None],
                            validate_only: bool) -> AdminAnswer:
        for _ in range(_CONFLICT_RETRIES):
            record = self.image().topic(name)
            if record is None:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
            merged = {k: v for k, v in {**record.configs, **configs}.items() if v is not None}
            try:
                TopicConfig.parse(merged)
            except ValueError as exc:
                return ErrorCode.INVALID_CONFIG, str(exc)
            if validate_only:
                return _OK
            command = AlterTopicConfigs(name, record.topic_id, record.config_version, merged)
            outcome = await self._propose(command)
            if isinstance(outcome, Outcome) and outcome.status is Status.CONFLICT:
                continue  # another alteration won: merge into what it made
            answer = self._answer(outcome, name)
            if answer == _OK:
                await self._reconciled_to(self.image().applied_index)
            return answer
        return ErrorCode.INVALID_REQUEST, f"the configs of {name!r} keep changing; retry"

    def _answer(self, outcome: Outcome | AdminAnswer, name: str) -> AdminAnswer:
        if not isinstance(outcome, Outcome):
            return outcome
        if outcome.ok:
            return _OK
        if outcome.status is Status.CONFLICT and "exists" in outcome.message:
            return ErrorCode.TOPIC_ALREADY_EXISTS, outcome.message
        if outcome.status is Status.CONFLICT:  # another change won the race
            return ErrorCode.INVALID_REQUEST, f"{outcome.message} (changed concurrently; retry)"
        if outcome.status is Status.NOT_FOUND:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, outcome.message
        return ErrorCode.INVALID_REQUEST, f"{name}: {outcome.message}"

    async def _reconciled_to(self, index: int) -> None:
        """Wait until the local logs reflect the metadata at ``index`` (bounded)."""
        with trio.move_on_after(5):
            while self.reconciled_index < index:
                await self._reconciled_changed.wait()
