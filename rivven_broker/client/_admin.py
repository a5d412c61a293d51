"""The blocking ``Admin``: the async ``AsyncAdmin`` through a portal, method for method.

Theory of operation
-------------------
An ``Admin`` hosts one ``AsyncAdmin`` (``_aio_admin.py``) on a ``LoopThread``; each public
method of this class is generated from the async one of the same name (same signature and
docstring) and runs it on the loop, blocking the caller until the answer (bounded by
``request_timeout_ms``, with retries of retriable failures inside it). Every request, answer
reader and retry decision is the async admin's: nothing is written twice.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from rivven_broker.client._aio_admin import AsyncAdmin, open_admin
from rivven_broker.client._loop_thread import start_loop_thread
from rivven_broker.client.config import bootstrap_and_topics
from rivven_broker.client.errors import ClosedError

__all__ = ["Admin"]


class Admin:
    """Administers a Rivven cluster. Thread-safe; every method blocks on the network.

    ``Admin(bootstrap, client_id=..., request_timeout_ms=30000, connect_attempts_max=3, ...)``.
    Construction does not touch the network. Methods: those of ``AsyncAdmin``, not awaited.
    """

    def __init__(self, bootstrap: str | None = None, **options: Any) -> None:
        bootstrap, _ = bootstrap_and_topics(() if bootstrap is None else (bootstrap,), None,
                                            options, takes_topics=False)
        self._loop = start_loop_thread("rivven-admin")
        try:
            self._async = self._loop.host(open_admin, bootstrap, bridge=self._loop.bridge,
                                          **options)
        except BaseException:
            self._loop.close()
            raise
        self._closed = False

    def _run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ClosedError("the admin client is closed")
        method = getattr(self._async, name)
        return self._loop.call(functools.partial(method, *args, **kwargs))

    def close(self) -> None:
        """Close connections. Idempotent; later calls raise ``ClosedError``."""
        if not self._closed:
            self._closed = True
            self._loop.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _blocking(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Admin, *args: Any, **kwargs: Any) -> Any:
        return self._run(name, *args, **kwargs)

    return call


for _name, _method in inspect.getmembers(AsyncAdmin, inspect.iscoroutinefunction):
    if not _name.startswith("_"):
        setattr(Admin, _name, _blocking(_name, _method))
