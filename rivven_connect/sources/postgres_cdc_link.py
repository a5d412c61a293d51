"""``postgres-cdc``: the replication connection of the streaming source, kept up — reads,
confirms and reconnects (docs/connect-postgres.md "Reconnects"; when to give up is
``pg.reconnect.ReconnectBudget``'s decision).

Theory of operation
-------------------
``ReplicationLink`` stands between the source's poll loop and ``pg.slot.ReplicationSlot``:

- ``start(lsn)`` starts the stream the first time (at the stored offset or a snapshot's
  consistent LSN); ``read_frames`` reads it and then sends a pending confirm;
- a ``SlotConnectionError`` from a read or a confirm — or one the source hands to
  ``connection_lost`` (an incremental chunk read that lost its connection), or an ordinary
  connection refused because Postgres is shutting down (``let_go_if_shutting_down``;
  ``pg.slot`` "Shutdowns") — means the connection is gone: the link closes it, calls the
  source's ``on_lost`` (which drops the half-received transaction, the relation cache, the
  frames not decoded yet and the chunk reader's connection) and opens one
  ``ReconnectBudget`` for the outage; ``lost`` is true until a reconnect works;
- ``reconnect()`` (the source calls it once the whole transactions it had queued are
  returned) waits ``backoff_delay_ms(n)`` before attempt ``n``, runs the start checks again
  — a slot now missing, lost or ahead of the last committed position, or a publication
  that no longer publishes a configured table, stops the source at once (``SourceError``)
  — then ``START_REPLICATION`` at ``resume_lsn``, the ``end_lsn`` of the last committed
  position. After ``attempts_max`` attempts or ``timeout_ms`` of outage: ``SourceError``;
- ``committed(end_lsn)`` (the source's side effect) moves ``resume_lsn`` and asks for a
  confirm of ``end_lsn - 1``. It is sent when ``ReplicationSlot.may_confirm`` allows it (a
  frame of the current connection starting past it was read), else kept and sent after a
  later read; a later position supersedes it. The slot only ever lags, which is safe.

Postgres resends everything after ``resume_lsn``; the source's assembler drops what it had
already decoded (its replay filter), so what follows a reconnect continues the stream
exactly where it was — which is why an incremental snapshot's open chunk window survives
one (docs/connect-postgres.md "Reconnects").
"""

from __future__ import annotations

import logging
from typing import Callable

import trio

from rivven_connect.http_api import Metric
from rivven_connect.pg.pgoutput import format_lsn
from rivven_connect.pg.reconnect import ReconnectBudget
from rivven_connect.pg.slot import (
    ReplicationSlot, SlotActiveError, SlotConnectionError, SlotError,
)

__all__ = ["ReplicationLink"]

_log = logging.getLogger("rivven_connect.postgres_cdc")


class ReplicationLink:
    """The replication connection of one source (see the module docstring)."""

    def __init__(self, slot: ReplicationSlot, *, attempts_max: int, timeout_ms: int,
                 jitter: Callable[[], float], on_lost: Callable[[], None]) -> None:
        self.slot = slot
        self.attempts_max, self.timeout_ms = attempts_max, timeout_ms
        self.jitter, self.on_lost = jitter, on_lost
        #: The outage in progress (None while connected) and the error that began it.
        self.outage: ReconnectBudget | None = None
        self.lost_error: SlotError | None = None
        #: Where a reconnect starts (the end_lsn of the last committed position); the
        #: confirm asked for but not sent yet; the last one sent.
        self.resume_lsn = 0
        self.confirm_lsn: int | None = None
        self.confirmed_lsn: int | None = None
        self.reconnects = 0
        self.attempts_failed = 0

    @property
    def lost(self) -> bool:
        return self.outage is not None

    async def start(self, start_lsn: int) -> None:
        """Start the stream the first time. Raises ``SlotError``."""
        assert not self.slot.started
        self.resume_lsn = max(self.resume_lsn, start_lsn)
        await trio.to_thread.run_sync(lambda: self.slot.start(start_lsn))

    async def read_frames(self, max_frames: int, wait_s: float) -> list[tuple[int, bytes]]:
        """The stream's next frames (``ReplicationSlot.read_frames``), then the pending
        confirm. A lost connection returns none and leaves ``lost`` true. Raises
        ``SlotError`` (not a lost connection). A checkpoint."""
        assert not self.lost
        try:
            frames = await self.slot.read_frames(max_frames, wait_s)
        except SlotConnectionError as error:
            self.connection_lost(error)
            return []
        self.send_confirm()
        return frames

    # --- confirms -----------------------------------------------------------------------------
    def committed(self, end_lsn: int) -> None:
        """The batch ending at ``end_lsn`` is committed: a reconnect starts there, and the
        slot may be confirmed at ``end_lsn - 1`` (now or after a later read). Raises
        ``SlotError`` (a confirm that failed for another reason than the connection)."""
        self.resume_lsn = max(self.resume_lsn, end_lsn)
        if self.confirmed_lsn is not None and end_lsn - 1 <= self.confirmed_lsn:
            return  # confirmed already (the side effect is retried, or a replay)
        self.confirm_lsn = max(self.confirm_lsn or 0, end_lsn - 1)
        self.send_confirm()  # (not before the stream's first frame: ``may_confirm``)

    def send_confirm(self) -> None:
        """Send the pending confirm if the connection allows it now
        (``ReplicationSlot.may_confirm``); a lost connection keeps it for later."""
        lsn = self.confirm_lsn
        if lsn is None or not self.slot.may_confirm(lsn):
            return
        try:
            self.slot.confirm(lsn)
        except SlotConnectionError as error:
            self.connection_lost(error)
            return
        self.confirmed_lsn, self.confirm_lsn = lsn, None

    # --- losses and reconnects ----------------------------------------------------------------
    def connection_lost(self, error: SlotError) -> None:
        """The connection is gone (or let go): close it, let the source drop what Postgres
        resends, open the outage's budget (once per outage)."""
        self.slot.close()
        self.on_lost()
        if self.outage is None:
            _log.warning("postgres-cdc %s: the replication connection was lost: %s; "
                         "reconnecting", self.slot.slot_name, error)
            self.lost_error = error
            self.outage = ReconnectBudget(self.attempts_max, self.timeout_ms,
                                          self._monotonic_ms())

    def let_go_if_shutting_down(self, error: SlotConnectionError) -> None:
        """An ordinary connection was refused because Postgres is shutting down: close the
        replication connection, which the shutdown would otherwise wait for (``pg.slot``
        "Shutdowns"), and reconnect once it is back."""
        if error.shutting_down and self.slot.started:
            self.connection_lost(error)

    @staticmethod
    def _monotonic_ms() -> int:
        return int(trio.current_time() * 1000)

    async def reconnect(self) -> None:
        """Attempts with backoff until one works (the stream starts again at
        ``resume_lsn``) or the budget is spent (``SourceError``). A checkpoint."""
        from rivven_connect.sources import SourceError

        outage, name = self.outage, self.slot.slot_name
        assert outage is not None and not self.slot.started
        last_error: SlotError | None = self.lost_error
        while True:
            now_ms = self._monotonic_ms()
            delay_ms = outage.next_delay_ms(now_ms, self.jitter())
            if delay_ms is None:
                raise SourceError(
                    f"postgres-cdc {name}: the replication connection was lost "
                    f"({self.lost_error}) and could not be re-established: "
                    f"{outage.describe(now_ms)}; the last error: {last_error}")
            await trio.sleep(delay_ms / 1000)
            try:
                await self._restart_stream()
            except (SlotConnectionError, SlotActiveError) as error:
                self.attempts_failed += 1
                last_error = error
                _log.info("postgres-cdc %s: reconnect attempt %d failed: %s", name,
                          outage.attempts, error)
                continue
            self.reconnects += 1
            _log.warning("postgres-cdc %s: reconnected (%s), streaming from %s", name,
                         outage.describe(self._monotonic_ms()), format_lsn(self.resume_lsn))
            self.outage = self.lost_error = None
            return

    async def _restart_stream(self) -> None:
        """The start checks again, then ``START_REPLICATION`` at ``resume_lsn``. Raises
        ``SlotConnectionError``/``SlotActiveError`` (worth another attempt), ``SlotError``
        or ``SourceError`` (not)."""
        from rivven_connect.sources import SourceError

        info = await trio.to_thread.run_sync(self.slot.prepare)
        name, resume_lsn = self.slot.slot_name, self.resume_lsn
        if info.state != "ok":
            raise SourceError(f"postgres-cdc {name}: after the replication connection was "
                              f"lost the slot is {info.state} (dropped, or its WAL removed): "
                              f"changes after {format_lsn(resume_lsn)} are gone")
        confirmed = info.confirmed_flush_lsn
        if resume_lsn and confirmed is not None and confirmed > resume_lsn:
            raise SourceError(f"postgres-cdc {name}: the slot ran ahead while the replication "
                              f"connection was lost: its confirmed_flush_lsn "
                              f"{format_lsn(confirmed)} is past the last committed end_lsn "
                              f"{format_lsn(resume_lsn)}")
        if info.unpublished:
            raise SourceError(f"postgres-cdc {name}: while the replication connection was "
                              f"lost, publication {self.slot.publication_name} stopped "
                              f"publishing {', '.join(f'{s}.{t}' for s, t in info.unpublished)}"
                              f" (their changes were not streamed); add them back and restart")
        await trio.to_thread.run_sync(lambda: self.slot.start(resume_lsn))

    def metrics(self) -> list[Metric]:
        return [Metric("cdc_reconnects", "counter",
                       "Replication connections re-established after one was lost.",
                       self.reconnects),
                Metric("cdc_reconnect_failures", "counter",
                       "Reconnect attempts that failed (the source stops when an outage "
                       "outlasts reconnect_attempts_max or reconnect_timeout_ms).",
                       self.attempts_failed)]
