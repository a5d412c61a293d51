"""The trio driver of sinks: one task per sink runs its ``SinkCycle``.

Theory of operation
-------------------
``run_sinks(config, bootstrap, sinks, stop, results, rng)`` starts one ``SinkRunner`` per
configured sink and puts each one's ``SinkResult`` into ``results`` (under ``sinks.NAME``)
when it halts. A ``SinkRunner`` holds no protocol state of its own — the cycle has it. It

1. opens a consumer in the sink's ``consumer_group`` (``isolation_level=read_committed``:
   aborted transactions of sources never reach a sink; ``enable_auto_commit`` off;
   ``auto_offset_reset=earliest``: a new group starts at the beginning) and subscribes to
   the sink's ``topics``;
2. executes the cycle's instructions and feeds back one event each: ``Poll`` →
   ``consumer.poll`` (at most ``poll_records_max`` records, waiting up to
   ``poll_timeout_ms``) → ``Polled``; ``Write`` → ``sink.write`` → ``WriteCompleted`` /
   ``WriteFailed(retriable)``; ``Commit`` → ``consumer.commit(offsets)`` →
   ``CommitCompleted`` / ``CommitFailed`` (``CommitFailedError``: the group moved on, the
   batch is abandoned and written again by the partitions' owner; other client errors by
   their ``retriable`` flag); ``WakeAt`` → ``trio.sleep_until`` → ``TimerFired``;
   ``Halt`` ends the task.

``stop`` (SIGTERM/SIGINT) becomes one ``StopRequested``: a poll or a backoff wait is cut
short; a write or a commit in flight finishes (a written batch is committed), then the cycle
halts ``stopped`` and the consumer leaves its group. A poll error that is not retriable, or
an exception the sink should not raise, stops this sink in ``error``; other connectors go on.
"""

from __future__ import annotations

import random
from typing import Any, Mapping

import attrs
import trio

from rivven_broker.client.errors import CommitFailedError, RivvenError
from rivven_broker.client.trio import open_consumer
from rivven_broker.client.types import TopicPartition
from rivven_connect.core import sink_cycle as sc
from rivven_connect.core.config import ConnectConfig, SinkConfig
from rivven_connect.sinks import Sink, SinkError
from rivven_connect.stopping import find_error, interruptible

__all__ = ["SinkResult", "SinkRunner", "run_sinks"]

#: Records asked of the consumer per poll (one batch of the cycle).
poll_records_max = 500
poll_timeout_ms = 500
#: A commit's own bound (the cycle retries it after that).
commit_timeout_ms = 30_000


def now_ms() -> int:
    return int(trio.current_time() * 1000)


@attrs.frozen
class SinkResult:
    name: str
    state: str  # running | degraded | error | stopped
    error: str | None
    position: dict[str, int]  # "topic/partition" -> next offset committed
    records: int

    def describe(self) -> str:
        line = (f"rivven-connect: sink {self.name}: {self.state} at {self.position!r}, "
                f"{self.records} records committed")
        return line + (f": {self.error}" if self.error else "")


class _SinkStopped(Exception):
    """The runner cannot go on with this sink (its message says why)."""


@attrs.define
class SinkRunner:
    """Runs one sink's cycle (see the module docstring)."""

    config: SinkConfig
    sink: Sink
    bootstrap: str
    stop: trio.Event
    rng: random.Random = attrs.field(factory=lambda: random.Random(0))
    cycle: sc.SinkCycle = attrs.field(init=False)
    _stop_told: bool = False

    def __attrs_post_init__(self) -> None:
        self.cycle = sc.SinkCycle(self.rng.random)

    async def run(self) -> sc.SinkStatus:
        """Run until the cycle halts; its final status. Raises ``_SinkStopped`` and the
        client's errors while starting."""
        try:
            async with open_consumer(self.bootstrap, group_id=self.config.consumer_group,
                                     isolation_level="read_committed",
                                     enable_auto_commit=False,
                                     auto_offset_reset="earliest") as consumer:
                consumer.subscribe(list(self.config.topics))
                await self._drive(consumer)
        finally:
            self.sink.close()
        return self.cycle.status()

    async def _drive(self, consumer: Any) -> None:
        instructions = self.cycle.start()
        while instructions:
            [instruction] = instructions  # the sink cycle issues one at a time
            if isinstance(instruction, sc.Halt):
                return
            event = await self._execute(instruction, consumer)
            if self.stop.is_set() and not self._stop_told and not isinstance(
                    event, sc.StopRequested):
                self._stop_told = True
                if self.cycle.handle(sc.StopRequested(now_ms())):
                    return  # halted at once (polling or backing off)
            if isinstance(event, sc.StopRequested):
                self._stop_told = True
            instructions = self.cycle.handle(event)

    async def _execute(self, instruction: sc.Instruction, consumer: Any) -> sc.Event:
        if isinstance(instruction, sc.Poll):
            return await self._poll(consumer)
        if isinstance(instruction, sc.Write):
            try:
                await self.sink.write(instruction.records)
            except SinkError as error:
                return sc.WriteFailed(instruction.batch_id, str(error), error.retriable,
                                      now_ms())
            return sc.WriteCompleted(instruction.batch_id, now_ms())
        if isinstance(instruction, sc.Commit):
            offsets = {TopicPartition(topic, partition): offset
                       for (topic, partition), offset in instruction.offsets}
            try:
                await consumer.commit(offsets, timeout_ms=commit_timeout_ms)
            except CommitFailedError as error:
                return sc.CommitFailed(instruction.batch_id, str(error), False, now_ms(),
                                       reassigned=True)
            except RivvenError as error:
                return sc.CommitFailed(instruction.batch_id, str(error), error.retriable,
                                       now_ms())
            return sc.CommitCompleted(instruction.batch_id, now_ms())
        assert isinstance(instruction, sc.WakeAt), instruction
        done, _ = await self._interruptible(
            lambda: trio.sleep_until(instruction.at_ms / 1000))
        return sc.TimerFired(now_ms()) if done else sc.StopRequested(now_ms())

    async def _poll(self, consumer: Any) -> sc.Event:
        while True:
            try:
                done, records = await self._interruptible(
                    lambda: consumer.poll(timeout_ms=poll_timeout_ms,
                                          max_records=poll_records_max))
            except RivvenError as error:
                if not error.retriable:
                    raise _SinkStopped(f"poll failed: {error}") from error
                await trio.sleep(poll_timeout_ms / 1000)  # the client reconnects meanwhile
                continue
            if not done:
                return sc.StopRequested(now_ms())
            return sc.Polled(tuple(records), now_ms())

    async def _interruptible(self, call: Any) -> tuple[bool, Any]:
        """(completed, result) of ``call()``; not completed if ``stop`` came first."""
        return await interruptible(call, self.stop, watch=not self._stop_told)


#: What ends one sink's task (in ``error``) without ending the others.
_STOPS_SINK = (_SinkStopped, RivvenError, trio.TooSlowError, SinkError)


def _find(error: BaseException) -> BaseException | None:
    return find_error(error, _STOPS_SINK)


def sink_runners(config: ConnectConfig, bootstrap: str, sinks: Mapping[str, Sink],
                 stop: trio.Event, rng: random.Random) -> dict[str, SinkRunner]:
    """One ``SinkRunner`` per sink of ``config``, in configuration order (not started)."""
    return {sink_config.name: SinkRunner(sink_config, sinks[sink_config.name], bootstrap, stop,
                                         rng=random.Random(rng.random()))
            for sink_config in config.sinks.values()}


async def run_sinks(runners: Mapping[str, SinkRunner], results: dict[str, Any]) -> None:
    """Run every sink until it halts (``stop`` set, or an error); each one's ``SinkResult``
    goes into ``results["sinks.NAME"]``. Never raises for one sink's failure."""

    async def run_one(runner: SinkRunner) -> None:
        sink_config = runner.config
        try:
            status = await runner.run()
        except (*_STOPS_SINK, BaseExceptionGroup) as caught:
            error = _find(caught)
            if error is None:
                raise
            status = runner.cycle.status()
            results[f"sinks.{sink_config.name}"] = SinkResult(
                sink_config.name, "error", str(error), status.position, status.records)
            return
        results[f"sinks.{sink_config.name}"] = SinkResult(
            sink_config.name, status.state.value, status.last_error, status.position,
            status.records)

    async with trio.open_nursery() as nursery:
        for runner in runners.values():
            nursery.start_soon(run_one, runner)
