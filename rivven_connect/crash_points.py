"""Test-only crash points of the connector runtime: kill -9 of itself at a named step.

**Test-only.** Off unless ``RIVVEN_CONNECT_CRASH_AT`` is set in the runtime's environment,
which nothing but the crash tests does (``tests/integration/connect/test_crash_process.py``).
When off, a hook is a comparison (and ``before_commit`` one trio checkpoint) per batch.

``RIVVEN_CONNECT_CRASH_AT=POINT[:N]`` makes the process SIGKILL itself (no cleanup, no
``finally``, no flush: what a ``kill -9`` or a power cut leaves) the ``N``-th time (default 1)
one source's driver reaches ``POINT``:

``after_send``
    every ``Send`` of a batch and its offset record is queued with the producer; nothing
    was flushed on purpose (some may have reached the broker, inside the open transaction);
``before_commit``
    the same, after a ``flush``: every record of the batch is in the broker's log, inside
    the open transaction; ``commit_transaction`` is not called;
``after_commit_before_side_effect``
    ``commit_transaction`` returned; the source's side effect has not run.

Just before the kill the hook writes ``rivven-connect: crash point POINT:N reached`` to
stderr (unbuffered), so a test can tell its kill from any other death. The count is per
source (per ``SourceRunner``); the crash tests run one source.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Mapping

import trio

__all__ = ["CRASH_AT_ENV", "POINTS", "CrashPoints"]

CRASH_AT_ENV = "RIVVEN_CONNECT_CRASH_AT"
POINTS = ("after_send", "before_commit", "after_commit_before_side_effect")


class CrashPoints:
    """Where to crash (``point``, at its ``at``-th reach), or nowhere (``point`` None)."""

    def __init__(self, point: str | None = None, at: int = 1) -> None:
        assert point is None or point in POINTS, f"{CRASH_AT_ENV}: unknown point {point!r}"
        assert at >= 1
        self.point, self.at = point, at
        self.reached_count = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> CrashPoints:
        """The points set by ``RIVVEN_CONNECT_CRASH_AT`` (none if unset)."""
        spec = (os.environ if environ is None else environ).get(CRASH_AT_ENV, "")
        if not spec:
            return cls()
        point, _, count = spec.partition(":")
        return cls(point, int(count) if count else 1)

    def _due(self, point: str) -> bool:
        return point == self.point and self.reached_count + 1 == self.at

    def reach(self, point: str) -> None:
        """Count ``point``; SIGKILL this process if it is the configured reach of it."""
        assert point in POINTS
        if point != self.point:
            return
        self.reached_count += 1
        if self.reached_count == self.at:
            os.write(2, f"rivven-connect: crash point {point}:{self.at} reached\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)

    async def before_commit(self, producer: Any) -> None:
        """The hooks between the last ``Send`` and ``commit_transaction``: ``after_send``,
        then (after a ``flush`` only if it is due) ``before_commit``. Raises what ``flush``
        raises. A checkpoint."""
        self.reach("after_send")
        if self._due("before_commit"):
            await producer.flush()
        self.reach("before_commit")
        await trio.lowlevel.checkpoint()
