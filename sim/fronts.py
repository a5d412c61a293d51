"""The real client's front ends as the simulator's workload processes use them.

Theory of operation
-------------------
``sim/clients.py`` is written once, against the trio client's API (``async with
open_producer(...)``, ``await producer.send(...)``, ``consumer.assign(...)``, ``await
consumer.poll(...)``), and takes its clients from a front chosen by the scenario's
``client``:

- ``"rivven"``: ``rivven_broker.client.trio`` itself.
- ``"rivven-blocking"``: the blocking ``Producer`` and ``Consumer`` (``rivven_broker.client``),
  constructed and called on a ``ProgramThread`` (``sim/program_thread.py``), which runs them
  deterministically against the simulator's loop. A shim changes only the calling
  convention, never what happens: every method call is the blocking method run on the
  program thread (``await program.call(...)`` for what the async twin awaits,
  ``program.call_sync`` for the rest). One thread serves a process, one call at a time, as
  one user thread would: a producer's concurrent senders queue for it, and each waits for
  its record's delivery on the loop's side, through the record future's done-callback (run
  on the loop, where the driver settles futures, as ``on_delivery`` callbacks are), so
  sends still overlap. Leaving the ``async with`` closes the client on the program thread
  (``Producer.close``: flush, then stop; ``Consumer.close``: commit, leave), whatever ended
  the body, as a ``with Producer(...)`` block would.
"""

from __future__ import annotations

from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import trio

import rivven_broker.client as blocking
from rivven_broker.client import trio as trio_client
from sim.program_thread import ProgramThread, open_program_thread

__all__ = ["FRONTS"]


class _TrioFront:
    """``client = "rivven"``: the trio client as it is."""

    def open_producer(self, bootstrap: str, **options: Any) -> Any:
        return trio_client.open_producer(bootstrap, **options)

    def open_consumer(self, bootstrap: str, **options: Any) -> Any:
        return trio_client.open_consumer(bootstrap, **options)


class _BlockingFront:
    """``client = "rivven-blocking"``: the blocking classes on a program thread."""

    @asynccontextmanager
    async def open_producer(self, bootstrap: str, **options: Any) -> AsyncIterator[Any]:
        async with _hosting(blocking.Producer, bootstrap, options) as (program, producer):
            yield _ProducerShim(program, producer)

    @asynccontextmanager
    async def open_consumer(self, bootstrap: str, **options: Any) -> AsyncIterator[Any]:
        async with _hosting(blocking.Consumer, bootstrap, options) as (program, consumer):
            yield _ConsumerShim(program, consumer)


@asynccontextmanager
async def _hosting(kind: type, bootstrap: str, options: dict[str, Any]) -> AsyncIterator[Any]:
    """``kind(bootstrap, **options)`` built on a program thread of its own, closed there."""
    async with open_program_thread(kind.__name__, options["env"].clock) as program:
        client = await program.call(lambda: kind(bootstrap, **options))
        try:
            yield program, client
        finally:
            with trio.CancelScope(shield=True):
                await program.call(client.close)


class _ProducerShim:
    """A blocking ``Producer`` behind the trio producer's calling convention."""

    def __init__(self, program: ProgramThread, producer: blocking.Producer) -> None:
        self._program = program
        self._producer = producer

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   headers: Any = None, partition: int | None = None,
                   timestamp_ms: int | None = None) -> Any:
        future = await self._program.call(self._producer.send, topic, value, key, headers,
                                          partition, timestamp_ms)
        return await _delivered(future)

    async def init_transactions(self) -> None:
        await self._program.call(self._producer.init_transactions)

    async def begin_transaction(self) -> None:
        await self._program.call(self._producer.begin_transaction)

    async def commit_transaction(self) -> None:
        await self._program.call(self._producer.commit_transaction)

    async def abort_transaction(self) -> None:
        await self._program.call(self._producer.abort_transaction)


async def _delivered(future: Future) -> Any:
    """The record's metadata once its future resolved (on the loop; never blocks the thread)."""
    if not future.done():
        resolved = trio.Event()
        future.add_done_callback(lambda _: resolved.set())
        await resolved.wait()
    return future.result()


class _ConsumerShim:
    """A blocking ``Consumer`` behind the trio consumer's calling convention."""

    def __init__(self, program: ProgramThread, consumer: blocking.Consumer) -> None:
        self._program = program
        self._consumer = consumer

    def subscribe(self, topics: list[str]) -> None:
        self._program.call_sync(self._consumer.subscribe, topics)

    def assign(self, partitions: list[Any]) -> None:
        self._program.call_sync(self._consumer.assign, partitions)

    def seek(self, partition: Any, offset: int) -> None:
        self._program.call_sync(self._consumer.seek, partition, offset)

    def assignment(self) -> set[Any]:
        return self._program.call_sync(self._consumer.assignment)

    def group_metadata(self) -> Any:
        return self._program.call_sync(self._consumer.group_metadata)

    async def poll(self, timeout_ms: int = 0) -> list[Any]:
        return await self._program.call(self._consumer.poll, timeout_ms)

    async def commit(self, offsets: Any = None) -> None:
        await self._program.call(self._consumer.commit, offsets)


#: The front of each real client a scenario may name.
FRONTS = {"rivven": _TrioFront(), "rivven-blocking": _BlockingFront()}
