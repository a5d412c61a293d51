"""Run an async test body under every event loop the async client supports: trio and asyncio.

Goal: the async client (``rivven_broker.client.aio``, on AnyIO) is one code path for both
loops; its tests prove it by running the same body under each, not by copies.

``@on_each_loop`` turns ``async def test_x(fake, ...)`` into a plain test parametrized by
``loop`` ("trio", "asyncio") that runs the body with ``anyio.run(..., backend=loop)``; the
body's other arguments stay pytest fixtures (sync ones: pytest-trio's trio fixtures belong
to trio-only tests). Bound waits in the body with ``anyio.fail_after``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Awaitable, Callable

import anyio
import pytest

__all__ = ["LOOPS", "on_each_loop"]

LOOPS = ("trio", "asyncio")


def on_each_loop(body: Callable[..., Awaitable[Any]]) -> Callable[..., None]:
    """A test running ``body`` once per loop of ``LOOPS`` (see the module docstring)."""
    parameters = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                  for p in inspect.signature(body).parameters.values()]

    def test(*, loop: str, **fixtures: Any) -> None:
        anyio.run(functools.partial(body, **fixtures), backend=loop)

    test.__name__ = test.__qualname__ = body.__name__
    test.__doc__ = body.__doc__
    test.__module__ = body.__module__
    test.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("loop", inspect.Parameter.KEYWORD_ONLY), *parameters])
    return pytest.mark.parametrize("loop", LOOPS)(test)
