"""What goes into the transaction coordinator (events) and what comes out (instructions).

Theory of operation
-------------------
``TransactionCoordinator.handle(event, now_ms)`` returns a list of instructions and does
nothing else; the driver (a trio task in the server, a test, the simulator) owns sockets,
timers and logs and obeys. The contract, in full:

Events in

- ``TxnRequestReceived(token, request)``: a decoded InitProducerId, AddPartitionsToTxn,
  AddOffsetsToTxn, TxnOffsetCommit or EndTxn; ``token`` is anything hashable that lets the
  driver find the connection and correlation id when the ``TxnReply`` comes, possibly later.
- ``TxnLogAppended(append_id)`` / ``TxnLogAppendFailed(append_id)``: the outcome of an
  ``AppendTxnLog``.
- ``ProducerIdsGranted(append_id, block_start, block_end)``: the controller gave the ids of a
  ``RequestProducerIds`` (a clustered coordinator's blocks; a refusal is fed as
  ``TxnLogAppendFailed(append_id)``).
- ``MarkersWritten(transactional_id, producer_id, producer_epoch, committed)``: every marker
  (and, on commit, every offset) of a ``WriteMarkers`` is written.
- ``TxnTick()``: time passed; feed one when ``next_deadline_ms()`` is reached.

Instructions out

- ``TxnReply(token, response)``: send the response.
- ``AppendTxnLog(append_id, key, value)``: append the record to ``__transaction_state`` in
  emission order; once DURABLE feed ``TxnLogAppended(append_id)``, or ``TxnLogAppendFailed``
  if it cannot be written. Replies that depend on it are held until then.
- ``RequestProducerIds(append_id, count)``: (a clustered coordinator, instead of appending a
  block record) ask the controller for ``count`` producer ids no other broker holds; feed
  ``ProducerIdsGranted`` or ``TxnLogAppendFailed``.
- ``WriteMarkers(...)``: append a COMMIT or ABORT control batch with the producer id and epoch
  to every listed partition (retrying until each is written), on commit write the offsets to
  their groups, then feed ``MarkersWritten``.
"""

from __future__ import annotations

from typing import Hashable, Union

import attrs

from rivven_broker.coordinator.txn_log_codec import PendingOffset
from rivven_broker.protocol.message_base import Response
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    EndTxn,
    InitProducerId,
    TxnOffsetCommit,
)

__all__ = [
    "TxnRequest",
    "TxnRequestReceived",
    "TxnLogAppended",
    "TxnLogAppendFailed",
    "MarkersWritten",
    "ProducerIdsGranted",
    "RequestProducerIds",
    "TxnTick",
    "TxnEvent",
    "TxnReply",
    "AppendTxnLog",
    "WriteMarkers",
    "TxnInstruction",
]

TxnRequest = Union[InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn]


# --- events ----------------------------------------------------------------------------------


@attrs.frozen
class TxnRequestReceived:
    """A client request; ``token`` (anything hashable) identifies it in the ``TxnReply``."""

    token: Hashable
    request: TxnRequest


@attrs.frozen
class TxnLogAppended:
    """The ``AppendTxnLog`` with this ``append_id`` is durable."""

    append_id: int


@attrs.frozen
class TxnLogAppendFailed:
    """The ``AppendTxnLog`` with this ``append_id`` failed (not known to be durable)."""

    append_id: int


@attrs.frozen
class ProducerIdsGranted:
    """The controller gave the ids ``[block_start, block_end)`` for ``RequestProducerIds``."""

    append_id: int
    block_start: int
    block_end: int

    def __attrs_post_init__(self) -> None:
        assert 0 < self.block_start < self.block_end, self


@attrs.frozen
class MarkersWritten:
    """Every marker (and, on commit, every offset) of a ``WriteMarkers`` is written."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool


@attrs.frozen
class TxnTick:
    """Time passed: abort timed-out transactions, expire idle ids, retry failed appends."""


TxnEvent = Union[
    TxnRequestReceived, TxnLogAppended, TxnLogAppendFailed, ProducerIdsGranted, MarkersWritten,
    TxnTick,
]


# --- instructions ----------------------------------------------------------------------------


@attrs.frozen
class TxnReply:
    """Send ``response`` to the request with ``token``."""

    token: Hashable
    response: Response


@attrs.frozen
class AppendTxnLog:
    """Append ``(key, value)`` to ``__transaction_state``, in emission order; report
    ``TxnLogAppended(append_id)`` once durable."""

    append_id: int
    key: bytes
    value: bytes | None


@attrs.frozen
class RequestProducerIds:
    """Ask the controller for ``count`` producer ids; report ``ProducerIdsGranted``."""

    append_id: int
    count: int


@attrs.frozen
class WriteMarkers:
    """End the transaction in every partition (and commit its offsets when ``committed``)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    partitions: tuple[tuple[str, int], ...]
    offsets: tuple[PendingOffset, ...]


TxnInstruction = Union[TxnReply, AppendTxnLog, RequestProducerIds, WriteMarkers]
