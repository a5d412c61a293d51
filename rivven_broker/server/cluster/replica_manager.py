"""``ReplicaManager``: what this broker does for the partitions it replicates, as leader or
follower.

Theory of operation
-------------------
After every metadata change the controller applies (``ClusterControl``), ``apply`` walks the
partitions that name this broker among their replicas:

- **Leader** (the metadata's leader is this broker): at a new leader epoch the log records
  that the epoch starts at its log end offset (``PartitionLog.become_leader``: appends are
  stamped with it from now on), and a ``LeaderState`` (``rivven_cluster.replication``) starts
  tracking the followers; the partition (``storage/partition.py``) commits by it from now on
  (``Partition.lead``). The high watermark is the smallest durable offset over the ISR (the
  leader's own, which the partition feeds it after each group commit, and each follower's
  from its fetches: a report that moves it calls ``Partition.high_watermark_moved``), so an
  ``acks=all`` produce waits in ``Partition.wait_committed`` until it passes the batch, and
  consumers read below it and wake when it moves.
  Every ``isr_check_ms`` the leader proposes the ISR ``LeaderState.isr_change`` asks for
  (``UpdateIsr``, compare-and-set on the partition epoch): laggards out after
  ``replica.lag.time.max.ms``, caught-up replicas back in. A leadership at an epoch the log
  was ever assigned (``highest_epoch``, kept even when a crash cut all the epoch's records:
  a restarted broker that the controller had not replaced yet) is first claimed again at
  epoch + 1 (``_claim_again``): the same epoch is never led twice.
- **Follower**: one fetcher task per leader broker (``_fetch_loop``) sends a ``ReplicaFetch``
  for all the partitions it follows from that leader over an authenticated replica link
  (``replica_link.py``) and appends what comes back as the leader wrote it (offsets and epochs
  kept; producer state rebuilt from the batches). It then waits for its own group commit of
  that data and long-polls with a fetch that reports the new durable offset, so the leader's
  high watermark never waits for a long-poll; what the leader appends meanwhile comes in that
  fetch's answer, one batch of rounds per fsync. (Fetching again at once, to overlap the
  fsync, was measured: no faster under load, slower for a lone request, and a round trip more
  per append.) When the leader
  says the follower's last epoch diverges, the follower truncates to where that epoch ended
  in the leader's log (or in its own, if earlier) — by epoch, never to a high watermark.
- A leader answers fetches (``serve``) only for partitions it leads, at the epoch the follower
  names: an older one is ``FENCED_LEADER_EPOCH``, a newer one ``UNKNOWN_LEADER_EPOCH`` (its
  metadata is behind), and a broker that no longer leads answers ``NOT_LEADER``. A deposed
  leader stops leading its partition at once (``Partition.stop_leading``), so nothing
  waiting under that leadership is acknowledged by it.

Every ``checkpoint_ms`` the high watermarks known here go to ``replication-offset.checkpoint``
(``storage/high_watermarks.py``), so a broker that leads after a restart starts from its last
high watermark instead of from zero. A full disk skips a round; an I/O error (a failed
fsync) stops the broker, as every failed fsync does (``stop_on_io_error``; the epoch
checkpoint of a new leadership likewise).

Waits are bounded (a fetch long-polls at most ``fetch_wait_ms``; a link opens within
``connect_timeout_s`` and an answer comes within ``answer_timeout_s``), and a failed link is
dialled again after a backoff. Storage errors on one partition are logged and that partition
is retried later; the fetcher goes on with the others.
"""

from __future__ import annotations

import functools
import logging
from typing import Awaitable, Callable, Mapping

import attrs
import trio

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.header import BatchError
from rivven_broker.server.cluster.controller_host import ControllerUnavailable
from rivven_broker.server.cluster.replica_link import LinkClosed, ReplicaLink, open_replica_link
from rivven_broker.server.context import ServerContext
from rivven_broker.server.internal_topics import is_internal_topic
from rivven_broker.storage.high_watermarks import read_high_watermarks, write_high_watermarks
from rivven_broker.storage.errors import (
    InvalidConfigError,
    OffsetOutOfRangeError,
    StorageError,
    SyncFailedError,
    UnknownTopicOrPartitionError,
    stop_on_io_error,
)
from rivven_broker.storage.partition import CommitRule, Partition
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.topic_config import TopicConfig
from rivven_cluster.membership import KeyRing
from rivven_cluster.metadata import Command, ElectLeader, MetadataImage, Outcome, UpdateIsr
from rivven_cluster.replication import LeaderState
from rivven_cluster.replication.messages import (
    NO_DIVERGENCE,
    FetchedPartition,
    PartitionFetch,
    ReplicaFetch,
    ReplicaFetchAnswer,
    ReplicaMessageError,
    answer_parts,
    decode_answer,
    decode_fetch,
    encode,
)

__all__ = ["ReplicaConfig", "ReplicaManager", "ReplicaView", "ReplicationFaults"]

log = logging.getLogger(__name__)

Key = tuple[str, int]
_Refusal = tuple[ErrorCode, str]


@attrs.frozen
class ReplicationFaults:
    """Deliberate bugs, so the simulator can show its checkers catch them (its
    ``[test] replication_bug`` switch). All off everywhere else."""

    #: The high watermark is the leader's own durable offset: acks=all before the followers.
    high_watermark_ignores_followers: bool = False
    #: A new follower truncates to the high watermark it knows, and never by epoch.
    truncate_to_high_watermark: bool = False
    #: The controller elects any live replica, in sync or not.
    elect_outside_isr: bool = False
    #: A new leader of a ``__consumer_offsets`` partition coordinates its groups without
    #: loading them from the log (committed offsets start over).
    coordinator_skips_load: bool = False
    #: A restarted broker decides whether it led an epoch before from the epochs its log
    #: still holds, not from the highest it ever had: after a crash cut an epoch's every
    #: record, two processes of one broker lead that epoch.
    lead_same_epoch_again: bool = False
    #: A leader stamps its batches with the first epoch this process led the partition at
    #: (a stale cached value), not the epoch it leads now: the epochs of a log go back.
    stamp_first_epoch: bool = False
    #: A leader leaves a quiet partition out of its answers even when its high watermark
    #: moved: a follower learns the high watermark only with records, so it never learns the
    #: last one.
    high_watermark_untold: bool = False


@attrs.frozen
class ReplicaView:
    """What this broker knows of one of its replicas (reports and the simulator's checkers)."""

    leading: bool
    leader: int
    leader_epoch: int
    #: As this broker serves it (leader), or as the leader last told it (follower).
    high_watermark: int


@attrs.frozen
class ReplicaConfig:
    lag_max_ms: int = 10_000
    isr_check_ms: int = 250
    fetch_wait_ms: int = 500
    fetch_bytes_max: int = 8 * 1024 * 1024
    partition_bytes_max: int = 1024 * 1024
    connect_timeout_s: float = 2.0
    answer_timeout_s: float = 5.0
    backoff_s: float = 0.2
    checkpoint_ms: int = 5_000
    faults: ReplicationFaults = ReplicationFaults()


@attrs.define
class _Following:
    leader: int
    leader_epoch: int
    #: The leader's high watermark from its last answer (a follower serves no reads).
    high_watermark: int = 0
    #: After an error on this partition: not fetched again before this (monotonic ms).
    retry_at_ms: int = 0


@attrs.define
class _Leading:
    key: Key
    partition: Partition
    state: LeaderState
    #: What the partition commits by: the state (or the planted high_watermark bug's rule).
    rule: CommitRule
    min_insync: int


class _LocalOnly:
    """The planted ``high_watermark_ignores_followers`` bug: the leader's own durable end."""

    def __init__(self) -> None:
        self.high_watermark = 0

    def on_local_durable(self, durable_offset: int) -> bool:
        moved = durable_offset > self.high_watermark
        self.high_watermark = max(self.high_watermark, durable_offset)
        return moved


class ReplicaManager:
    """This broker's replicas (see the module docstring)."""

    def __init__(self, context: ServerContext, *, node_id: int, boot_id: int,
                 ring: Callable[[], KeyRing], address_of: Callable[[int], tuple[str, int] | None],
                 propose: Callable[[Command], Awaitable[Outcome]],
                 config: ReplicaConfig = ReplicaConfig()) -> None:
        self._context = context
        self._env = context.env
        self.node_id = node_id
        self.boot_id = boot_id
        self._ring = ring
        self._address_of = address_of
        self._propose = propose
        self.config = config
        self._leading: dict[Key, _Leading] = {}
        self._following: dict[Key, _Following] = {}
        self._fetchers: set[int] = set()
        self._claiming: set[Key] = set()
        self._first_led: dict[Key, int] = {}  # (only for the planted stamp_first_epoch)
        self._checkpointed: dict[Key, int] = {}
        self._nursery: trio.Nursery | None = None
        #: What happened, for /metrics: truncations, fenced fetches, ISR proposals ...
        self.counters: dict[str, int] = {}

    # -- running -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        disk = self._env.disk
        self._checkpointed = await self._env.run_sync(read_high_watermarks, disk)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._isr_loop)
            nursery.start_soon(self._checkpoint_loop)
            task_status.started()

    async def _checkpoint_loop(self) -> None:
        """Every ``checkpoint_ms``: the high watermarks known here to disk, if they moved."""
        while True:
            await trio.sleep(self.config.checkpoint_ms / 1000)
            known = {key: leading.state.high_watermark
                     for key, leading in self._leading.items()}
            for key, following in self._following.items():  # (never below what was saved)
                known[key] = max(self._checkpointed.get(key, 0), following.high_watermark)
            if known == self._checkpointed:
                continue
            try:
                await self._env.run_sync(write_high_watermarks, self._env.disk, known)
            except OSError as exc:
                stop_on_io_error(exc, "the high-watermark checkpoint")
                log.error("could not write the high-watermark checkpoint: %s", exc)
                continue
            self._checkpointed = known

    def apply(self, image: MetadataImage) -> None:
        """Take the roles the applied metadata gives this broker. Blocks on the fsyncs of a
        new epoch's checkpoint (once per leader change)."""
        now_ms = self._env.clock.monotonic_ms()
        seen: set[Key] = set()
        for name, topic in image.topics.items():
            min_insync = _min_insync(topic.configs)
            for index, part in enumerate(topic.partitions):
                if self.node_id not in part.replicas:
                    continue
                key = (name, index)
                seen.add(key)
                try:
                    partition = self._context.partition(name, index)
                except UnknownTopicOrPartitionError:
                    continue  # not reconciled yet: the next apply takes it
                except (StorageError, OSError) as exc:
                    stop_on_io_error(exc, f"{name}-{index}: opening the partition")
                    log.error("%s-%d: cannot open: %s", name, index, exc)
                    continue
                if part.leader == self.node_id:
                    self._following.pop(key, None)
                    self._lead(key, partition, part.leader_epoch, part.replicas, part.isr,
                               part.partition_epoch, min_insync, now_ms)
                else:
                    self._resign(key)
                    self._follow(key, part.leader, part.leader_epoch)
        for key in [k for k in self._leading if k not in seen]:
            self._resign(key)
        for key in [k for k in self._following if k not in seen]:
            del self._following[key]

    def _lead(self, key: Key, partition: Partition, epoch: int, replicas: tuple[int, ...],
              isr: tuple[int, ...], partition_epoch: int, min_insync: int, now_ms: int) -> None:
        current = self._leading.get(key)
        if current is not None and current.state.leader_epoch == epoch and \
                current.partition is partition:
            current.min_insync = min_insync
            if current.state.partition_epoch != partition_epoch:
                if current.state.isr_committed(isr, partition_epoch):
                    partition.high_watermark_moved()
            return
        if current is not None:
            self._resign(key)
        plog = partition.log
        known = (plog.epochs.latest_epoch if self.config.faults.lead_same_epoch_again
                 else plog.epochs.highest_epoch)
        if epoch <= known:
            self._claim_again(key, epoch, isr)
            return
        try:
            plog.become_leader(epoch)
        except StorageError as exc:
            stop_on_io_error(exc, f"{key[0]}-{key[1]}: the epoch checkpoint")
            log.error("%s-%d: cannot lead epoch %d: %s", *key, epoch, exc)
            return
        if self.config.faults.stamp_first_epoch:
            plog.leader_epoch = self._first_led.setdefault(key, epoch)
        state = LeaderState(
            leader_id=self.node_id, leader_epoch=epoch, replicas=replicas, isr=isr,
            partition_epoch=partition_epoch, epoch_start_offset=plog.log_end_offset,
            high_watermark=min(self._known_high_watermark(key, plog),
                               partition.local_durable_end),
            now_ms=now_ms, lag_max_ms=self.config.lag_max_ms)
        rule: CommitRule = (_LocalOnly() if self.config.faults.high_watermark_ignores_followers
                            else state)
        self._leading[key] = _Leading(key, partition, state, rule, min_insync)
        log.info("%s-%d: leading at epoch %d (ISR %s, log end %d)", *key, epoch, list(isr),
                 plog.log_end_offset)
        partition.lead(rule)  # fed the local durable end from now on

    def _claim_again(self, key: Key, epoch: int, isr: tuple[int, ...]) -> None:
        """This broker's log was assigned ``epoch`` before: an earlier process of it led (or
        followed in) that epoch, and what that process appended without an fsync may be gone
        while followers kept it. Leading the same epoch again could give those offsets other
        records, so ask the controller for the leadership at a new epoch first (Kafka's
        controller does the same for a restarted broker)."""
        if key in self._claiming or self._nursery is None:
            return
        self._claiming.add(key)
        self._nursery.start_soon(self._propose_claim, key, epoch, isr)

    async def _propose_claim(self, key: Key, epoch: int, isr: tuple[int, ...]) -> None:
        try:
            log.info("%s-%d: leader again after a restart: asking for epoch %d", *key,
                     epoch + 1)
            outcome = await self._propose(ElectLeader(key[0], key[1], epoch, self.node_id, isr))
            if not outcome.ok:
                log.info("%s-%d: new epoch refused: %s", *key, outcome.message)
        except ControllerUnavailable as exc:  # the next apply asks again
            log.info("%s-%d: new epoch not committed: %s", *key, exc)
        finally:
            self._claiming.discard(key)

    def _known_high_watermark(self, key: Key, plog: PartitionLog) -> int:
        following = self._following.get(key)
        known = max(self._checkpointed.get(key, 0),
                    following.high_watermark if following is not None else 0)
        return max(min(known, plog.log_end_offset), plog.log_start_offset)

    def _resign(self, key: Key) -> None:
        leading = self._leading.pop(key, None)
        if leading is None:
            return
        if leading.partition.rule is leading.rule:
            leading.partition.stop_leading()  # waiting produces end: not acknowledged by us
        self._context.appends.poke(key)  # followers waiting here: NOT_LEADER now
        log.info("%s-%d: no longer leading epoch %d", *key, leading.state.leader_epoch)

    def _follow(self, key: Key, leader: int, epoch: int) -> None:
        current = self._following.get(key)
        if current is not None and (current.leader, current.leader_epoch) == (leader, epoch):
            return
        hw = current.high_watermark if current is not None else 0
        self._following[key] = _Following(leader, epoch, hw)
        if self.config.faults.truncate_to_high_watermark:
            try:
                partition = self._context.partition(*key)
                if hw < partition.log.log_end_offset:
                    partition.truncate_to(hw)
            except (StorageError, OSError, UnknownTopicOrPartitionError):
                pass
        if leader >= 0 and leader not in self._fetchers and self._nursery is not None:
            self._fetchers.add(leader)
            self._nursery.start_soon(self._fetch_loop, leader)

    # -- the data path's questions -----------------------------------------------------------

    def leads_partition(self, key: Key) -> bool:
        return key in self._leading

    def produce_error(self, key: Key, acks_all: bool) -> _Refusal | None:
        """Why this broker may not append to ``key`` now (None: go ahead)."""
        leading = self._leading.get(key)
        if leading is None:
            following = self._following.get(key)
            who = f"broker {following.leader}" if following is not None else "another broker"
            return ErrorCode.NOT_LEADER, f"{who} leads {key[0]}/{key[1]}; refresh metadata"
        isr = leading.state.isr
        if acks_all and len(isr) < leading.min_insync:
            return (ErrorCode.NOT_ENOUGH_REPLICAS,
                    f"{key[0]}/{key[1]} has {len(isr)} in-sync replicas {list(isr)}; "
                    f"min.insync.replicas is {leading.min_insync}")
        return None

    def read_error(self, key: Key, client_epoch: int = -1) -> ErrorCode | None:
        """Clients read from the leader only (the broker's own internal topics: locally), at
        the leader epoch they name, if they name one (KIP-320)."""
        leading = self._leading.get(key)
        if leading is not None:
            epoch = leading.state.leader_epoch
            if client_epoch < 0 or client_epoch == epoch:
                return None
            return (ErrorCode.FENCED_LEADER_EPOCH if client_epoch < epoch
                    else ErrorCode.UNKNOWN_LEADER_EPOCH)
        if is_internal_topic(key[0]) and key not in self._following:
            return None  # a broker-local internal topic (__transaction_state for now)
        return ErrorCode.NOT_LEADER

    # -- leader: the ISR ---------------------------------------------------------------------

    async def _isr_loop(self) -> None:
        while True:
            await trio.sleep(self.config.isr_check_ms / 1000)
            now_ms = self._env.clock.monotonic_ms()
            for key, leading in list(self._leading.items()):
                proposal = leading.state.isr_change(now_ms)
                if proposal is not None:
                    assert self._nursery is not None
                    self._nursery.start_soon(self._propose_isr, key, leading, proposal)

    async def _propose_isr(self, key: Key, leading: _Leading, isr: tuple[int, ...]) -> None:
        state = leading.state
        command = UpdateIsr(key[0], key[1], state.leader_epoch, state.partition_epoch, isr)
        log.info("%s-%d: proposing ISR %s (was %s)", *key, list(isr), list(state.isr))
        self._count("isr_proposals")
        try:
            outcome = await self._propose(command)
        except ControllerUnavailable as exc:  # proposed again at a later check
            log.info("%s-%d: ISR change not committed: %s", *key, exc)
            outcome = None
        if outcome is None or not outcome.ok:
            if outcome is not None:
                log.info("%s-%d: ISR change refused: %s", *key, outcome.message)
            state.isr_refused()
        # committed: ``apply`` hands the new ISR to the state

    # -- leader: serving followers -----------------------------------------------------------

    async def serve(self, link: ReplicaLink) -> None:
        """Answer one follower's fetches until the link closes."""
        follower = link.peer.node_id
        told: dict[Key, tuple[int, int]] = {}  # what this link last said of a quiet partition
        try:
            while True:
                request = decode_fetch(await link.receive())
                if request.replica_id != follower:
                    self._count("replica_id_mismatch")
                    return
                answer = await self._answer(follower, request, told)
                await link.send(*answer_parts(answer))
        except (LinkClosed, ReplicaMessageError) as exc:
            log.debug("replica link from %d closed: %s", follower, exc)
        finally:
            await link.aclose()

    async def _answer(self, follower: int, request: ReplicaFetch,
                      told: dict[Key, tuple[int, int]]) -> ReplicaFetchAnswer:
        wait_ms = min(request.max_wait_ms, self.config.fetch_wait_ms)
        keys = [(p.topic, p.partition) for p in request.partitions]
        with trio.move_on_after(wait_ms / 1000):
            while True:
                answer, has_data = self._read_for(follower, request, told, last=wait_ms == 0)
                if has_data or wait_ms == 0:
                    return answer
                event = trio.Event()
                self._context.appends.register(event, keys)  # poked at appends
                try:
                    await event.wait()
                finally:
                    self._context.appends.unregister(event, keys)
        return self._read_for(follower, request, told, last=True)[0]

    def _read_for(self, follower: int, request: ReplicaFetch, told: dict[Key, tuple[int, int]],
                  *, last: bool = False) -> tuple[ReplicaFetchAnswer, bool]:
        """Read every partition the follower asks for; the answer names those with news. A
        quiet one (no records, error or divergence) is left out while its high watermark and
        log start are what this link last told the follower (``told``, updated only when
        the answer is the one sent: with news, or the ``last`` read of a long poll). Most
        of a follower's partitions are quiet at any moment, and it keeps what it was told
        (Kafka's incremental fetch sessions, KIP-227, on the answer's side). ``told`` lives
        as long as the link: an answer lost with its link is never counted as said."""
        budget = min(request.max_bytes, self.config.fetch_bytes_max)
        now_ms = self._env.clock.monotonic_ms()
        answers, has_data = [], False
        saying: list[tuple[Key, tuple[int, int]]] = []
        untold = self.config.faults.high_watermark_untold  # (the planted bug; off)
        for part in request.partitions:
            answer = self._read_partition(follower, part, budget, now_ms)
            key = (part.topic, part.partition)
            if answer.records or answer.error_code != 0 \
                    or answer.diverging_epoch != NO_DIVERGENCE:
                budget = max(budget - len(answer.records), 0)
                has_data = True
                saying.append((key, (-1, -1)))  # said, but not as a quiet partition
            else:
                said = (answer.high_watermark, answer.log_start_offset)
                if told.get(key) == said or untold:
                    continue
                saying.append((key, said))
            answers.append(answer)
        if has_data or last:
            told.update(saying)
        return ReplicaFetchAnswer(tuple(answers)), has_data

    def _read_partition(self, follower: int, part: PartitionFetch, budget: int,
                        now_ms: int) -> FetchedPartition:
        key = (part.topic, part.partition)
        leading = self._leading.get(key)

        def refuse(code: ErrorCode) -> FetchedPartition:
            self._count(f"fetch_{code.name.lower()}")
            return FetchedPartition(part.topic, part.partition, int(code))

        if leading is None:
            return refuse(ErrorCode.NOT_LEADER)
        state = leading.state
        if part.leader_epoch < state.leader_epoch:
            return refuse(ErrorCode.FENCED_LEADER_EPOCH)
        if part.leader_epoch > state.leader_epoch:
            return refuse(ErrorCode.UNKNOWN_LEADER_EPOCH)
        if follower not in state.followers:
            return refuse(ErrorCode.NOT_LEADER)
        plog = leading.partition.log
        end = plog.log_end_offset
        if part.last_fetched_epoch >= 0:
            epoch, epoch_end = plog.epochs.end_offset_for(part.last_fetched_epoch, end)
            if epoch < part.last_fetched_epoch or epoch_end < part.fetch_offset:
                self._count("divergences_answered")
                return FetchedPartition(part.topic, part.partition, 0, state.high_watermark,
                                        plog.log_start_offset, epoch, epoch_end)
        if not plog.log_start_offset <= part.fetch_offset <= end:
            return FetchedPartition(part.topic, part.partition,
                                    int(ErrorCode.OFFSET_OUT_OF_RANGE), state.high_watermark,
                                    plog.log_start_offset)
        durable = max(min(part.durable_offset, part.fetch_offset), 0)
        if state.on_fetch(follower, part.fetch_offset, durable, end, now_ms) and \
                leading.rule is state:
            leading.partition.high_watermark_moved()
        records = b""
        if budget > 0 and part.fetch_offset < end:
            try:
                read = plog.read(part.fetch_offset, min(budget, self.config.partition_bytes_max),
                                 zero_copy=True)
            except OffsetOutOfRangeError:
                return refuse(ErrorCode.OFFSET_OUT_OF_RANGE)
            except (StorageError, OSError) as exc:
                log.error("%s-%d: read for follower %d failed: %s", *key, follower, exc)
                return refuse(ErrorCode.KAFKA_STORAGE_ERROR)
            # A view of the read's buffer (the link copies it once), or for large batches a
            # region of the segment file (the link reads it for the tag; the kernel sends it).
            records = read.records
        return FetchedPartition(part.topic, part.partition, 0, state.high_watermark,
                                plog.log_start_offset, NO_DIVERGENCE, -1, records)

    # -- follower: fetching ------------------------------------------------------------------

    async def _fetch_loop(self, leader: int) -> None:
        """Fetch every partition this broker follows from ``leader``, until it follows none."""
        config = self.config
        link: ReplicaLink | None = None
        try:
            while True:
                followed = sorted(k for k, f in self._following.items() if f.leader == leader)
                if not followed:
                    return
                if link is None:
                    address = self._address_of(leader)
                    try:
                        if address is None:
                            raise LinkClosed(f"no address known for broker {leader}")
                        link = await open_replica_link(
                            self._env, address, node_id=self.node_id, boot_id=self.boot_id,
                            ring=self._ring, timeout_s=config.connect_timeout_s)
                    except LinkClosed as exc:
                        log.debug("replica link to %d: %s", leader, exc)
                        await trio.sleep(config.backoff_s)
                        continue
                try:
                    request = self._fetch_request(leader, followed)
                    if not request.partitions:
                        await trio.sleep(config.backoff_s)
                        continue
                    await link.send(encode(request))
                    with trio.fail_after(config.answer_timeout_s + config.fetch_wait_ms / 1000):
                        answer = decode_answer(await link.receive())
                except (LinkClosed, ReplicaMessageError, trio.TooSlowError) as exc:
                    log.info("replica link to %d failed: %s", leader, exc)
                    await link.aclose()
                    link = None
                    await trio.sleep(config.backoff_s)
                    continue
                appended = await self._take(leader, answer)
                with trio.move_on_after(config.answer_timeout_s):  # (the next fetch reports it)
                    await self._wait_durable(appended)
        finally:
            self._fetchers.discard(leader)
            if link is not None:
                await link.aclose()

    async def _wait_durable(self, appended: list[tuple[Partition, int]]) -> None:
        """Until what one answer appended is durable. Another fetcher of this broker (for the
        partition's next leader) may truncate it meanwhile: that ends the wait (a failed
        fsync raises: the broker stops)."""
        for partition, last_offset in appended:
            if not await partition.wait_durable(last_offset):
                self._count("appends_cut_while_syncing")

    def _fetch_request(self, leader: int, followed: list[Key]) -> ReplicaFetch:
        now_ms = self._env.clock.monotonic_ms()
        partitions = []
        for key in followed:
            following = self._following.get(key)  # (the metadata may have moved since)
            if following is None or following.leader != leader or following.retry_at_ms > now_ms:
                continue
            try:
                partition = self._context.partition(*key)
            except (UnknownTopicOrPartitionError, StorageError, OSError):
                continue
            plog = partition.log
            end = plog.log_end_offset
            last_epoch = plog.epochs.latest_epoch if end > plog.log_start_offset else -1
            if self.config.faults.truncate_to_high_watermark:
                last_epoch = -1  # (the bug: no divergence check)
            partitions.append(PartitionFetch(key[0], key[1], following.leader_epoch, end,
                                             last_epoch, min(partition.local_durable_end, end)))
        return ReplicaFetch(self.node_id, self.config.fetch_wait_ms,
                            self.config.fetch_bytes_max, tuple(partitions))

    async def _take(self, leader: int,
                    answer: ReplicaFetchAnswer) -> list[tuple[Partition, int]]:
        """Apply one answer; returns what it appended, ``(log, last offset)``."""
        context = self._context
        now_ms = context.env.clock.wall_ms()
        appended: list[tuple[Partition, int]] = []
        backoff = False
        for fetched in answer.partitions:
            key = (fetched.topic, fetched.partition)
            following = self._following.get(key)
            if following is None or following.leader != leader:
                continue  # the metadata moved on while the fetch was out
            try:
                code = ErrorCode(fetched.error_code)
            except ValueError:
                code = ErrorCode.UNKNOWN_SERVER_ERROR
            if code not in (ErrorCode.NONE, ErrorCode.OFFSET_OUT_OF_RANGE):
                self._count(f"fetched_{code.name.lower()}")
                following.retry_at_ms = context.env.clock.monotonic_ms() + 100
                backoff = True
                continue
            try:
                partition = context.partition(*key)
                following.high_watermark = max(following.high_watermark, fetched.high_watermark)
                if fetched.diverging_epoch != NO_DIVERGENCE:
                    self._truncate_diverged(key, partition, fetched)
                    continue
                if code is ErrorCode.OFFSET_OUT_OF_RANGE:
                    self._reset_out_of_range(key, partition, fetched)
                    continue
                if fetched.records:
                    info = partition.append_as_follower(fetched.records, now_ms)
                    appended.append((partition, info.last_offset))
            except SyncFailedError:
                raise
            except (StorageError, BatchError, OSError) as exc:
                stop_on_io_error(exc, f"{key[0]}-{key[1]}: replicating from {leader}")
                log.error("%s-%d: replicating from %d failed: %s", *key, leader, exc)
                following.retry_at_ms = context.env.clock.monotonic_ms() + 1000
        if backoff and not appended:
            await trio.sleep(self.config.backoff_s)
        return appended

    def _truncate_diverged(self, key: Key, partition: Partition,
                           fetched: FetchedPartition) -> None:
        plog = partition.log
        end = plog.log_end_offset
        own_epoch, own_end = plog.epochs.end_offset_for(fetched.diverging_epoch, end)
        cut = fetched.diverging_end_offset
        if own_epoch == fetched.diverging_epoch:
            cut = min(cut, own_end)
        cut = max(min(cut, end), 0)
        log.warning("%s-%d: diverged from the leader at epoch %d: truncating from %d to %d",
                    *key, fetched.diverging_epoch, end, cut)
        self._count("truncations")
        partition.truncate_to(cut)

    def _reset_out_of_range(self, key: Key, partition: Partition,
                            fetched: FetchedPartition) -> None:
        end = partition.log.log_end_offset
        if fetched.log_start_offset > end:  # the leader deleted what we lack
            log.warning("%s-%d: the leader's log starts at %d, past ours (%d): starting over "
                        "there", *key, fetched.log_start_offset, end)
            self._count("resets")
            partition.truncate_to(fetched.log_start_offset)
        else:
            self._following[key].retry_at_ms = self._env.clock.monotonic_ms() + 1000

    def _count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1

    # -- reporting ---------------------------------------------------------------------------

    def leading(self) -> dict[Key, LeaderState]:
        return {key: leading.state for key, leading in self._leading.items()}

    def following(self) -> dict[Key, int]:
        return {key: following.leader for key, following in self._following.items()}

    def views(self) -> dict[Key, ReplicaView]:
        """Every replica's role, epoch and high watermark; changes nothing."""
        views = {key: ReplicaView(False, f.leader, f.leader_epoch, f.high_watermark)
                 for key, f in self._following.items()}
        for key, leading in self._leading.items():
            views[key] = ReplicaView(True, self.node_id, leading.state.leader_epoch,
                                     leading.partition.high_watermark)
        return views


def _min_insync(configs: Mapping[str, str]) -> int:
    """The topic's ``min.insync.replicas`` (read at every apply of every topic: only that key
    is parsed, once per distinct value)."""
    return _parse_min_insync(configs.get("min.insync.replicas"))


@functools.lru_cache(maxsize=64)
def _parse_min_insync(text: str | None) -> int:
    try:
        return TopicConfig.parse({} if text is None else
                                 {"min.insync.replicas": text}).min_insync_replicas
    except InvalidConfigError:  # (validated when it was set; never fewer than one)
        return 1
