"""Workload processes on the REAL client (trio or blocking front), over ``SimNet``.

Theory of operation
-------------------
``client = "rivven"`` in a ``[[workload.producers]]`` or ``[[workload.consumers]]`` table runs
the project's own trio client (``rivven_broker.client.trio``), handed a small simulated env
(a ``SimClock`` without skew, the process's ``SimNet``, seeded streams), instead of the thin
protocol client of ``workload.py``. The broker and the client are then tested together,
faults and all. ``client = "rivven-blocking"`` runs the same processes on the blocking
``Producer`` and ``Consumer`` instead, each on a program thread that alternates with the
simulator's loop (``sim/fronts.py``, ``sim/program_thread.py``): this module's code is the
same for both fronts, which differ only in how a call reaches the client.

The history is recorded at the client's API, as a user would see it:

- a producer task invokes ``send`` with one unique value, then ``await``s its delivery: ``ok``
  with the offset, or ``info`` on any error. The client retries on its own, so a value may be
  written twice (``"resends": true`` in the invocation tells the checkers duplicates of
  non-idempotent sends are allowed), and any error may follow an attempt that was appended.
- a consumer ``assign``s its partitions and polls; each poll's records are recorded per
  partition with ``from`` = the position the process expected (the offset after the last
  record it saw). A first offset below it (a re-read after a reset) is noted and accepted; a
  first offset above it is a skipped offset for the gap checker. Control records (and, for
  ``read_committed``, aborted records) are not visible at this API: on transactional topics
  disable ``monotonic_gapless``, or read with the thin client.
- a *transactional* producer (``transactional = true``) runs transactions of a few sends
  each, ending each with ``commit`` or ``abort`` (recorded, ``ok`` or ``info``); sends carry
  the ``transactional_id``. A transaction its session left without sending a commit is
  recorded as a *failed* ``abort``: it must never become visible.
- a *group* consumer (``group = "..."``) subscribes as a member of that group and, after
  every poll that returned records, commits the positions it reached (``commit_offsets``:
  ``ok``; ``fail`` when the group refused it, CommitFailedError; ``info`` otherwise). Its
  partitions move between members, so each poll is recorded from its own first offset; the
  first records of a partition just assigned are marked ``assigned`` (they start at the
  group's committed offset). ``restart_every`` closes the consumer and starts a new one now
  and then, so members leave and join and partitions move.
  ``read_group_offsets`` reads every group's committed offsets after the run, for
  ``group_commits_durable``.

When the client raises out of its ``async with`` (a dead connection pool, a closed client),
the process notes it and starts a fresh client after a backoff.
"""

from __future__ import annotations

import random
from typing import Any

import trio

from rivven_broker.client.errors import CommitFailedError, RivvenError
from rivven_broker.client.trio import open_admin
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol.errors import ErrorCode
from sim.clock import SimClock
from sim.fronts import FRONTS
from sim.history import FAIL, INFO, OK, History
from sim.log_context import ACTOR
from sim.net import SimNet
from sim.scenario import ConsumerSpec, ProducerSpec
from sim.trace import Trace
from sim.workload import PollObserver, Target, padded_value, read_value

__all__ = ["ClientProducerProcess", "ClientConsumerProcess", "read_group_offsets"]

_BACKOFF_S = 0.5


class _ClientEnv:
    """What the trio client asks of its env: a clock, a net and named random streams."""

    def __init__(self, seed_prefix: str, net: SimNet) -> None:
        # (the MockClock's own reading, which a blocking client's program thread can call)
        self.clock = SimClock(true_now_s=trio.lowlevel.current_clock().current_time)
        self.net = net
        self._prefix = seed_prefix
        self._streams: dict[str, random.Random] = {}

    def rng(self, name: str) -> random.Random:
        stream = self._streams.get(name)
        if stream is None:
            stream = self._streams[name] = random.Random(f"{self._prefix}/{name}")
        return stream


class _ClientProcess:
    def __init__(self, name: str, client: str, net: SimNet, target: Target, history: History,
                 rng: random.Random, trace: Trace, seed: int) -> None:
        self.name = name
        self.front = FRONTS[client]
        self.target = target
        self.history = history
        self.rng = rng
        self.trace = trace
        self.env = _ClientEnv(f"{seed}/{name}/client", net)
        self.bootstrap = f"{target.host}:{target.port}"

    async def run(self) -> None:
        """Run a client, start a new one whenever it fails. Runs until cancelled."""
        ACTOR.set(self.name)
        while True:
            try:
                await self.session()
            except* (RivvenError, OSError, trio.BrokenResourceError) as group:
                first = group.exceptions[0]
                self.history.note(self.name, "client_failed", {"error": type(first).__name__})
            await trio.sleep(_BACKOFF_S * self.rng.uniform(0.5, 1.5))

    async def session(self) -> None:
        raise NotImplementedError


class ClientProducerProcess(_ClientProcess):
    """Sends unique values through the real producer; one task per in-flight send."""

    def __init__(self, name: str, spec: ProducerSpec, partitions: int, **kwargs: Any) -> None:
        super().__init__(name, spec.client, **kwargs)
        self.spec = spec
        self.partitions = partitions
        self._sequence = 0

    async def session(self) -> None:
        spec = self.spec
        options: dict[str, Any] = {}
        if spec.transactional:
            options["transactional_id"] = f"{self.name}-txn"
        async with self.front.open_producer(
                self.bootstrap, env=self.env, acks=spec.acks, linger_ms=2,
                request_timeout_ms=spec.request_timeout_ms,
                delivery_timeout_ms=4 * spec.request_timeout_ms,
                allow_auto_topic_creation=False, **options) as producer:
            if spec.transactional:
                await self._transactions(producer, options["transactional_id"])
                return
            async with trio.open_nursery() as nursery:
                for _ in range(spec.in_flight):
                    nursery.start_soon(self._sender, producer)

    async def _transactions(self, producer: Any, transactional_id: str) -> None:
        """Transactions one after another until the session fails (see the module docs)."""
        spec = self.spec
        interval_s = 1 / spec.rate_per_s
        await producer.init_transactions()
        while True:
            await producer.begin_transaction()
            ended = False
            try:
                for _ in range(self.rng.randint(1, spec.transaction_sends_max)):
                    await trio.sleep(interval_s * self.rng.uniform(0.5, 1.5))
                    await self._send_one(producer, transactional_id)
                end = "abort" if self.rng.random() < spec.abort_probability else "commit"
                invocation = self.history.invoke(self.name, end,
                                                 {"transactional_id": transactional_id})
                ended = True
                outcome: tuple[str, dict[str, Any]] = (INFO, {"error": "cancelled"})
                try:
                    if end == "commit":
                        await producer.commit_transaction()
                    else:
                        await producer.abort_transaction()
                    outcome = (OK, {})
                except RivvenError as exc:
                    outcome = (INFO, {"error": type(exc).__name__})
                    raise  # a new session: its init_transactions fences this one
                finally:
                    self.history.complete(invocation, *outcome)
            finally:
                if not ended:  # no commit was ever sent: it must never become visible
                    invocation = self.history.invoke(self.name, "abort",
                                                     {"transactional_id": transactional_id})
                    self.history.complete(invocation, FAIL, {"error": "no commit sent"})

    async def _sender(self, producer: Any) -> None:
        interval_s = self.spec.in_flight / self.spec.rate_per_s
        while True:
            await trio.sleep(interval_s * self.rng.uniform(0.5, 1.5))
            await self._send_one(producer)

    async def _send_one(self, producer: Any, transactional_id: str | None = None) -> None:
        partition = self.rng.randrange(self.partitions)
        self._sequence += 1
        value = f"{self.name}-{self._sequence}"
        details: dict[str, Any] = {
            "topic": self.spec.topic, "partition": partition, "values": [value],
            "acks": self.spec.acks, "idempotent": self.spec.idempotent, "resends": True,
        }
        if transactional_id is not None:  # idempotent: a retry is never stored twice
            details.update(transactional_id=transactional_id, idempotent=True, resends=False)
        invocation = self.history.invoke(self.name, "send", details)
        outcome: tuple[str, dict[str, Any]] = (INFO, {"error": "cancelled"})
        try:
            meta = await producer.send(self.spec.topic,
                                       value=padded_value(value, self.spec.value_bytes),
                                       partition=partition)
            outcome = (INFO, {"error": "acks=0"}) if self.spec.acks == 0 else (OK, {"offset": meta.offset})
        except RivvenError as exc:
            outcome = (INFO, {"error": type(exc).__name__})
        finally:
            self.history.complete(invocation, *outcome)


class ClientConsumerProcess(_ClientProcess):
    """Polls assigned partitions through the real consumer and records what it returns."""

    def __init__(self, name: str, spec: ConsumerSpec, partitions: tuple[int, ...],
                 skip_probability: float = 0.0, *, observer: PollObserver | None = None,
                 **kwargs: Any) -> None:
        super().__init__(name, spec.client, **kwargs)
        self.spec = spec
        self.positions = {p: 0 for p in partitions}
        self.observer = observer
        self.skip_probability = skip_probability

    async def session(self) -> None:
        restart_ms = self.spec.restart_every_ms
        if not restart_ms:
            await self._consume()
            return
        with trio.move_on_after(restart_ms * self.rng.uniform(0.5, 1.5) / 1000):
            await self._consume()  # then closed (a member leaves its group), and started again

    async def _consume(self) -> None:
        spec = self.spec
        async with self.front.open_consumer(
                self.bootstrap, env=self.env, group_id=spec.group,
                auto_offset_reset="earliest", enable_auto_commit=False,
                isolation_level=spec.isolation, fetch_max_wait_ms=spec.max_wait_ms,
                request_timeout_ms=spec.request_timeout_ms,
                session_timeout_ms=spec.session_timeout_ms,
                heartbeat_interval_ms=spec.heartbeat_interval_ms) as consumer:
            if spec.group is not None:
                consumer.subscribe([spec.topic])
            else:
                consumer.assign([TopicPartition(spec.topic, p) for p in self.positions])
                for partition, position in self.positions.items():
                    consumer.seek(TopicPartition(spec.topic, partition), position)
            held: set[int] = set()  # (a group member's partitions, as of its last poll)
            fresh: set[int] = set()  # assigned since, no record read from them yet
            while True:
                invoke_ms = trio.current_time() * 1000
                records = await consumer.poll(timeout_ms=spec.max_wait_ms)
                generation = -1
                if spec.group is not None:
                    now_held = {tp.partition for tp in consumer.assignment()}
                    fresh = (fresh & now_held) | (now_held - held)
                    held = now_held
                    generation = consumer.group_metadata().generation_id
                by_partition: dict[int, list[list[Any]]] = {}
                for record in records:
                    value = read_value(record.value)
                    by_partition.setdefault(record.partition, []).append([record.offset, value])
                for partition in sorted(by_partition):
                    assigned = None
                    if spec.group is not None:  # partitions move: from its own first offset
                        self.positions[partition] = by_partition[partition][0][0]
                        assigned = partition in fresh  # read from the group's committed offset
                        fresh.discard(partition)
                    owned = generation if partition in held else -1
                    self._record(partition, by_partition[partition], invoke_ms, assigned, owned)
                if spec.group is not None and by_partition:
                    await self._commit(consumer, {p: self.positions[p] for p in by_partition})

    async def _commit(self, consumer: Any, reached: dict[int, int]) -> None:
        spec = self.spec
        offsets = {f"{spec.topic}/{p}": offset for p, offset in sorted(reached.items())}
        value = {"group": spec.group, "offsets": offsets}
        invocation = self.history.invoke(self.name, "commit_offsets", value)
        outcome: tuple[str, dict[str, Any]] = (INFO, {"error": "cancelled"})
        try:
            await consumer.commit({TopicPartition(spec.topic, p): o for p, o in reached.items()})
            outcome = (OK, value)
        except CommitFailedError as exc:  # the group refused it: nothing committed
            outcome = (FAIL, {"error": type(exc).__name__})
        except RivvenError as exc:
            outcome = (INFO, {"error": type(exc).__name__})
        finally:
            self.history.complete(invocation, *outcome)

    def _record(self, partition: int, records: list[list[Any]], invoke_ms: float,
                assigned: bool | None = None, generation: int = -1) -> None:
        expected = self.positions[partition]
        first = records[0][0]
        if first < expected:
            self.history.note(self.name, "reread", {"partition": partition, "from": first,
                                                    "expected": expected})
            expected = first
        if self.skip_probability and len(records) > 1 and self.rng.random() < self.skip_probability:
            del records[self.rng.randrange(len(records))]  # test-only: a fetch that skips one
        end = max(offset for offset, _ in records) + 1
        value: dict[str, Any] = {
            "topic": self.spec.topic, "partition": partition, "from": expected, "to": end,
            "records": records, "control": [], "isolation": self.spec.isolation,
        }
        if assigned:  # the first records of a partition the group just gave this member
            value.update(group=self.spec.group, assigned=True)
        if generation >= 0:  # a group member's read of a partition it owns in that generation
            value.update(group=self.spec.group, generation=generation)
        _, done = self.history.record(self.name, "poll", value, invoke_ms=invoke_ms)
        self.positions[partition] = end
        if self.observer is not None:
            self.observer(self.name, self.spec.topic, partition, end - 1, done.index)


async def read_group_offsets(net: SimNet, target: Target, groups: list[str], seed: int,
                             deadline: float) -> dict[str, dict[str, int]]:
    """Every group's committed offsets (``{"topic/partition": offset}``) after the run, from
    its coordinator, through the real trio Admin client (which finds it again while it
    moves). Raises ``RivvenError`` when one cannot be read by ``deadline``."""
    env = _ClientEnv(f"{seed}/audit-groups/client", net)
    found: dict[str, dict[str, int]] = {}
    with trio.fail_after(max(deadline - trio.current_time(), 0.001)):
        async with open_admin(f"{target.host}:{target.port}", env=env) as admin:
            for group in groups:
                try:
                    description = await admin.describe_group(group)
                except RivvenError as exc:
                    if exc.error_code != ErrorCode.GROUP_ID_NOT_FOUND:
                        raise
                    found[group] = {}  # it never committed anything
                    continue
                found[group] = {f"{p.topic}/{p.partition}": p.committed_offset
                                for p in description.partitions
                                if p.committed_offset is not None}
    return found
