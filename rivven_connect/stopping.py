"""What the source and sink runners share about stopping: a call cut short by ``stop``, and the
error that ends a task found inside the exception groups trio nurseries wrap it in."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import trio

__all__ = ["find_error", "interruptible"]


def find_error(error: BaseException, types: tuple[type[BaseException], ...]
               ) -> BaseException | None:
    """``error`` itself if it is one of ``types``, else the first such leaf of the exception
    group it is (trio nurseries wrap what their tasks raise), else None."""
    if isinstance(error, types):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = find_error(inner, types)
            if found is not None:
                return found
    return None


async def interruptible(call: Callable[[], Awaitable[Any]], stop: trio.Event,
                        *, watch: bool = True) -> tuple[bool, Any]:
    """(completed, result) of ``call()``; not completed if ``stop`` came first (only watched
    when ``watch``: a runner already told to stop lets its last call finish)."""
    result: list[Any] = []
    async with trio.open_nursery() as nursery:
        async def watcher() -> None:
            await stop.wait()
            nursery.cancel_scope.cancel()

        async def work() -> None:
            result.append(await call())
            nursery.cancel_scope.cancel()

        if watch:
            nursery.start_soon(watcher)
        nursery.start_soon(work)
    return (bool(result), result[0] if result else None)
