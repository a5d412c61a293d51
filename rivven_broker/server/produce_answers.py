"""How a produce is answered: a partition's error, and the wait of the commonest produce.

Theory of operation
-------------------
``DataPath`` answers each partition of a produce with a ``ProducePartitionResponse``: appended
(offsets and times from the log), a duplicate of a batch already stored, or an error
(``produce_error``; operating errors map through ``error_of``, and a batch appended here but
never acknowledged is ``unacknowledged``: its outcome is unknown, never "not written").

The commonest produce of all (one topic, one partition, not transactional, acks 1 or all, a
single node under ``sync=always``: ``DataPath._produce_one_partition``) waits for its one
partition's group commit through a ``OnePartitionWait``: the ``Pending`` of the general path
(``ready``, ``wait``, ``deadline``, ``after_progress``, ``provisional``) as one small object
with its fields in slots instead of four closures per request. Its ``payload`` gives the
answer's bytes straight from the cached template (``fast_codec.produce_appended_payload``)
once the append is durable, so the produce lane and the writer answer it without building
the ``ProduceResponse`` and taking it apart again (``_Connection.take_ready_frames``). In
every other case (not yet durable, a failed write, a lost append, a duplicate) ``payload``
is None and ``ready`` decides, as for any ``Pending``. A differential test compares it with
the general path's closures: the same answers from ``ready``, ``wait`` and ``provisional``,
and ``payload`` byte for byte the generic encoding of ``ready``'s answer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.fast_codec import (
    produce_appended_payload,
    produce_partition_appended,
    produce_response_of_one,
)
from rivven_broker.protocol.messages import ProducePartitionResponse, ProduceResponse
from rivven_broker.records.header import BatchError
from rivven_broker.storage.errors import StorageError, SyncFailedError

if TYPE_CHECKING:
    from rivven_broker.storage.partition import Partition
    from rivven_broker.storage.staged_appends import StagedWrite
    from rivven_broker.storage.sync_worker import SyncWorker

__all__ = ["OnePartitionWait", "PartitionError", "error_of", "produce_error", "unacknowledged"]

log = logging.getLogger(__name__)

#: A partition's wire code and message.
PartitionError = tuple[ErrorCode, str]


def error_of(exc: Exception) -> PartitionError:
    """The wire code and message of an operating error on one partition."""
    if isinstance(exc, SyncFailedError):
        raise exc  # never answered: the broker must stop
    if isinstance(exc, BatchError):
        return ErrorCode.CORRUPT_MESSAGE, str(exc)
    if isinstance(exc, StorageError):
        return exc.code, str(exc)
    if isinstance(exc, OSError):
        log.error("storage I/O failed: %s", exc)
        return ErrorCode.KAFKA_STORAGE_ERROR, f"storage I/O failed: {exc.strerror or exc}"
    raise exc


def unacknowledged(deposed: bool) -> PartitionError:
    """Appended here but not acknowledged: the outcome is unknown (the batch may survive on a
    new leader), so never a code that says "not written"."""
    if deposed:
        return (ErrorCode.REQUEST_TIMED_OUT,
                "leadership moved before the in-sync replicas had the data; outcome unknown")
    return ErrorCode.REQUEST_TIMED_OUT, "not acknowledged within timeout_ms"


def produce_error(partition: int, error: PartitionError) -> ProducePartitionResponse:
    """The answer of ``partition`` refused or failed with ``error`` (its message clipped)."""
    code, message = error
    clipped = message.encode()[: limits.error_message_bytes_max].decode("utf-8", "ignore")
    return ProducePartitionResponse(partition, code, error_message=clipped)


class OnePartitionWait:
    """The ``Pending`` of a one-partition produce that appended (or staged) its batch, or
    found it a duplicate, on a single node under ``sync=always`` (see the module docstring).
    Answers once the partition's own copy covers ``last_offset``; a failed staged write or a
    lost append answers its error instead. Never blocks but in ``wait``."""

    __slots__ = ("_partition", "_sync_worker", "_name", "_index", "_base_offset",
                 "_append_time_ms", "_log_start_offset", "_duplicate", "_last_offset",
                 "_staged", "_failure", "deadline", "after_progress")

    serial = False  # (``Pending``'s fields that never vary here)

    def __init__(self, partition: Partition, sync_worker: SyncWorker, name: str, index: int,
                 base_offset: int, append_time_ms: int, log_start_offset: int,
                 duplicate: bool, last_offset: int, staged: StagedWrite | None,
                 deadline: float) -> None:
        self._partition = partition
        self._sync_worker = sync_worker
        self._name = name
        self._index = index
        self._base_offset = base_offset
        self._append_time_ms = append_time_ms  # -1 for a duplicate, as Kafka answers it
        self._log_start_offset = log_start_offset
        self._duplicate = duplicate
        self._last_offset = last_offset
        self._staged = staged  # the pass's write this append waits for, until it is taken
        self._failure: ProducePartitionResponse | None = None
        self.deadline = deadline
        # A fresh append is covered only by progress after it; a duplicate's original may be
        # covered already.
        self.after_progress = not duplicate

    def _take_write(self) -> None:
        """A staged append takes its write's fate: a failed write answers its error, as a
        failed append does (``storage/staged_appends.py``), and waits no more."""
        write, self._staged = self._staged, None
        assert write is not None and write.done, "an answer before its write"
        if write.error is not None:
            self._failure = produce_error(self._index, error_of(write.error))

    def _answer(self) -> ProduceResponse:
        answer = self._failure
        if answer is None:
            if self._duplicate:
                answer = ProducePartitionResponse(
                    self._index, ErrorCode.NONE, self._base_offset, -1, self._log_start_offset,
                    duplicate=True)
            else:
                answer = produce_partition_appended(self._index, self._base_offset,
                                                    self._append_time_ms, self._log_start_offset)
        return produce_response_of_one(self._name, answer)

    def ready(self) -> ProduceResponse | None:
        """The answer if the append is durable here (or never will be); None otherwise."""
        if self._staged is not None:
            self._take_write()
        if self._failure is None and self._partition.local_durable_end <= self._last_offset:
            if not self._partition.lost(self._last_offset):
                return None
            self._failure = produce_error(self._index, unacknowledged(False))
        self._sync_worker.check_healthy()
        return self._answer()

    async def wait(self) -> ProduceResponse:
        """The answer once the append is durable, or its time-out at ``deadline``."""
        if self._staged is not None:
            self._take_write()
        if self._failure is None:
            with trio.CancelScope(deadline=self.deadline):  # move_on_at without contextlib
                await self._partition.wait_durable(self._last_offset)
            if self._partition.local_durable_end <= self._last_offset:
                self._failure = produce_error(self._index, unacknowledged(False))
        return self._answer()

    def provisional(self) -> ProduceResponse:
        """The answer as if the wait had succeeded at once (the simulator's deliberate lane
        bug only)."""
        return self._answer()

    def payload(self, version: int) -> bytes | None:
        """The payload of ``ready``'s answer at ``version``, from the template, when that
        answer is a plain success now (durable, not a duplicate); None otherwise: then ask
        ``ready``."""
        if self._staged is not None:
            self._take_write()
        if self._failure is not None or self._duplicate \
                or self._partition.local_durable_end <= self._last_offset:
            return None
        self._sync_worker.check_healthy()
        return produce_appended_payload(self._name, self._index, version, self._base_offset,
                                        self._append_time_ms, self._log_start_offset)
