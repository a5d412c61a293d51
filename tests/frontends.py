"""One test body, three front ends: the blocking client, and the async client under trio and
under asyncio.

Goal: the client is one driver with two fronts (``rivven_broker.client.aio`` and the blocking
classes over it); its tests prove each front by running the same body through it, not by
copies.

``@on_each_front`` turns ``async def test_x(front, fake, ...)`` into a plain test parametrized
by ``front`` ("blocking", "trio", "asyncio"). The body opens clients with
``front.open_producer(...)``, ``front.open_consumer(...)``, ``front.open_admin(...)`` and uses
the async API (``await producer.send(...)``, ``consumer.assign(...)``, ``await
consumer.poll(...)``). Under "trio" and "asyncio" those are ``rivven_broker.client.aio``'s own
objects; under "blocking" the body runs on asyncio and they are the blocking ``Producer``,
``Consumer`` and ``Admin`` behind a shim that only changes the calling convention (awaitable
results of blocking calls, milliseconds for ``flush``'s seconds, a future for a
``Delivery``), never what happens. A body that needs two clients to make progress at once
(two group members in one task group) cannot run on the blocking front (its calls block the
body's loop): such tests use ``tests/loops.py``.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
import pytest

import rivven_broker.client as blocking
from rivven_broker.client import aio

__all__ = ["FRONTS", "Front", "on_each_front"]

FRONTS = ("blocking", "trio", "asyncio")


class _Delivery:
    """A blocking send's future, awaitable like an async ``Delivery``."""

    def __init__(self, future: Any) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def __await__(self):
        return self._wait().__await__()

    async def _wait(self) -> Any:
        return self._future.result()


class _Shim:
    """A blocking client seen through its async twin's calling convention."""

    def __init__(self, client: Any, twin: type) -> None:
        self._client = client
        self._twin = twin

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # private state: the driver behind the blocking front
            return getattr(self._client._async, name)
        attribute = getattr(self._client, name)
        if inspect.iscoroutinefunction(getattr(self._twin, name, None)):
            async def awaited(*args: Any, **kwargs: Any) -> Any:
                return attribute(*args, **kwargs)

            return awaited
        return attribute


class _ProducerShim(_Shim):
    async def send(self, *args: Any, **kwargs: Any) -> Any:
        return self._client.send(*args, **kwargs).result()

    async def enqueue(self, *args: Any, **kwargs: Any) -> _Delivery:
        return _Delivery(self._client.send(*args, **kwargs))

    def send_nowait(self, *args: Any, **kwargs: Any) -> _Delivery:
        return _Delivery(self._client.send(*args, **kwargs))

    async def flush(self, timeout_ms: int | None = None) -> None:
        self._client.flush(None if timeout_ms is None else timeout_ms / 1000)


class _ConsumerShim(_Shim):
    async def aclose(self, autocommit: bool = True) -> None:
        self._client.close(autocommit=autocommit)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        for record in self._client:
            yield record


class Front:
    """How a test body opens clients on one front end (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = "asyncio" if name == "blocking" else name

    def __repr__(self) -> str:
        return f"Front({self.name!r})"

    @asynccontextmanager
    async def open_producer(self, bootstrap: str, **options: Any) -> AsyncIterator[Any]:
        if self.name != "blocking":
            async with aio.open_producer(bootstrap, **options) as producer:
                yield producer
            return
        with blocking.Producer(bootstrap, **options) as producer:
            yield _ProducerShim(producer, aio.AsyncProducer)

    @asynccontextmanager
    async def open_consumer(self, bootstrap: str, **options: Any) -> AsyncIterator[Any]:
        if self.name != "blocking":
            async with aio.open_consumer(bootstrap, **options) as consumer:
                yield consumer
            return
        with blocking.Consumer(bootstrap, **options) as consumer:
            yield _ConsumerShim(consumer, aio.AsyncConsumer)

    @asynccontextmanager
    async def open_admin(self, bootstrap: str, **options: Any) -> AsyncIterator[Any]:
        if self.name != "blocking":
            async with aio.open_admin(bootstrap, **options) as admin:
                yield admin
            return
        with blocking.Admin(bootstrap, **options) as admin:
            yield _Shim(admin, aio.AsyncAdmin)


def on_each_front(body: Callable[..., Awaitable[Any]]) -> Callable[..., None]:
    """A test running ``body(front, ...)`` once per front of ``FRONTS``."""
    parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                  for p in inspect.signature(body).parameters.values() if p.name != "front"]

    def test(*, front: str, **fixtures: Any) -> None:
        chosen = Front(front)
        anyio.run(functools.partial(body, chosen, **fixtures), backend=chosen.loop)

    test.__name__ = test.__qualname__ = body.__name__
    test.__doc__ = body.__doc__
    test.__module__ = body.__module__
    test.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("front", inspect.Parameter.KEYWORD_ONLY), *parameters])
    return pytest.mark.parametrize("front", FRONTS)(test)
