"""The client's exceptions: one family, each carrying a wire code name and a retriable flag.

Theory of operation
-------------------
Every error a client method raises (or puts in a future) is a ``RivvenError``. Each carries

- ``.code``: a stable name, the wire ``ErrorCode`` name when the error maps to one
  (``"NOT_LEADER"``), else a client-side name (``"CLIENT_CLOSED"``);
- ``.error_code``: the ``ErrorCode`` member, or ``None`` for purely local errors;
- ``.retriable``: whether the same operation may succeed later unchanged.

Errors the broker reports become ``BrokerError`` through ``error_for(code, message)``, with a
specific subclass for the codes users meet most. Local conditions have their own classes:
``ConnectionFailedError`` (no broker reachable; retriable), ``ClientTimeoutError`` and its
``DeliveryTimeoutError`` (the client gave up waiting), ``BufferExhaustedError`` (``send`` could
not get buffer space within ``max_block_ms``), ``ClosedError`` (the client was closed) and
``FeatureNotAvailableError`` (an API whose broker side arrives with a later milestone).
Exactly-once adds ``ProducerFencedError`` (fatal for the producer instance),
``OutOfOrderSequenceError``, ``UnknownProducerIdError``, ``InvalidTxnStateError`` and
``TransactionAbortedError`` (a record of an aborted transaction that was never sent).
``CommitFailedError`` stands for the group-membership refusals of a commit (UNKNOWN_MEMBER_ID,
ILLEGAL_GENERATION, FENCED_INSTANCE_ID; ``.error_code`` says which).

The client's retry loops retry an error exactly when ``.retriable`` is true and the delivery
timeout has not passed; non-retriable errors are reported at once.
"""

from __future__ import annotations

from rivven_broker.protocol.errors import ErrorCode

__all__ = [
    "RivvenError",
    "BrokerError",
    "UnknownTopicOrPartitionError",
    "NotLeaderError",
    "LeaderNotAvailableError",
    "CorruptMessageError",
    "MessageTooLargeError",
    "OffsetOutOfRangeError",
    "TopicAlreadyExistsError",
    "InvalidTopicNameError",
    "InvalidPartitionsError",
    "InvalidReplicationFactorError",
    "InvalidConfigError",
    "InvalidRequestError",
    "RequestTimedOutError",
    "UnsupportedVersionError",
    "ConnectionFailedError",
    "ClientTimeoutError",
    "DeliveryTimeoutError",
    "BufferExhaustedError",
    "ClosedError",
    "FeatureNotAvailableError",
    "ProducerFencedError",
    "OutOfOrderSequenceError",
    "UnknownProducerIdError",
    "InvalidTxnStateError",
    "TransactionAbortedError",
    "CommitFailedError",
    "error_for",
]


class RivvenError(Exception):
    """Base of every client error. See the module docstring for ``code``/``retriable``."""

    #: Defaults for subclasses that stand for one code; instances may override.
    default_error_code: ErrorCode | None = None
    default_code: str = "UNKNOWN_SERVER_ERROR"
    default_retriable: bool = False

    def __init__(
        self,
        message: str = "",
        *,
        error_code: ErrorCode | None = None,
        code: str | None = None,
        retriable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.error_code = error_code if error_code is not None else self.default_error_code
        if code is not None:
            self.code = code
        elif self.error_code is not None:
            self.code = self.error_code.name
        else:
            self.code = self.default_code
        if retriable is not None:
            self.retriable = retriable
        elif self.error_code is not None:
            self.retriable = self.error_code.retriable
        else:
            self.retriable = self.default_retriable

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    def __reduce__(self):  # keep the keyword-only fields through pickling (Spark, processes)
        return (
            _rebuild,
            (type(self), self.message, self.error_code, self.code, self.retriable),
        )


def _rebuild(cls, message, error_code, code, retriable):
    return cls(message, error_code=error_code, code=code, retriable=retriable)


class BrokerError(RivvenError):
    """The broker answered with an error code. Built by ``error_for``."""


class UnknownTopicOrPartitionError(BrokerError):
    default_error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class NotLeaderError(BrokerError):
    default_error_code = ErrorCode.NOT_LEADER


class LeaderNotAvailableError(BrokerError):
    default_error_code = ErrorCode.LEADER_NOT_AVAILABLE


class CorruptMessageError(BrokerError):
    """A batch failed its CRC or framing check (on the broker, or in the consumer)."""

    default_error_code = ErrorCode.CORRUPT_MESSAGE


class MessageTooLargeError(BrokerError):
    default_error_code = ErrorCode.MESSAGE_TOO_LARGE


class OffsetOutOfRangeError(BrokerError):
    default_error_code = ErrorCode.OFFSET_OUT_OF_RANGE


class TopicAlreadyExistsError(BrokerError):
    default_error_code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidTopicNameError(BrokerError):
    default_error_code = ErrorCode.INVALID_TOPIC_NAME


class InvalidPartitionsError(BrokerError):
    default_error_code = ErrorCode.INVALID_PARTITIONS


class InvalidReplicationFactorError(BrokerError):
    default_error_code = ErrorCode.INVALID_REPLICATION_FACTOR


class InvalidConfigError(BrokerError):
    default_error_code = ErrorCode.INVALID_CONFIG


class InvalidRequestError(BrokerError):
    default_error_code = ErrorCode.INVALID_REQUEST


class RequestTimedOutError(BrokerError):
    default_error_code = ErrorCode.REQUEST_TIMED_OUT


class UnsupportedVersionError(BrokerError):
    default_error_code = ErrorCode.UNSUPPORTED_VERSION


class ProducerFencedError(BrokerError):
    """A newer producer with the same transactional id exists, or the coordinator aborted this
    one's transaction (timeout): fatal for this producer instance; close it."""

    default_error_code = ErrorCode.PRODUCER_FENCED


class OutOfOrderSequenceError(BrokerError):
    """The broker saw a gap in the producer's sequence it could not bridge by retrying."""

    default_error_code = ErrorCode.OUT_OF_ORDER_SEQUENCE


class UnknownProducerIdError(BrokerError):
    """The partition has no state for this producer id (it expired or was never there)."""

    default_error_code = ErrorCode.UNKNOWN_PRODUCER_ID


class InvalidTxnStateError(BrokerError):
    """The call does not fit the transaction's state (a programming error, or a partition
    or group the transaction did not register): abort the transaction."""

    default_error_code = ErrorCode.INVALID_TXN_STATE


class CommitFailedError(BrokerError):
    """A commit was refused because the committer is no longer a member of the group's current
    generation (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION or FENCED_INSTANCE_ID): its partitions may
    have a new owner. Inside a transaction (``send_offsets_to_transaction`` with
    ``group_metadata()``) the transaction must be aborted; poll again and retry."""

    default_error_code = ErrorCode.ILLEGAL_GENERATION


class ConnectionFailedError(RivvenError):
    """No connection to any broker could be made or kept (retriable)."""

    default_error_code = ErrorCode.NETWORK_EXCEPTION


class ClientTimeoutError(RivvenError):
    """The client gave up waiting (``timeout`` / ``max_block_ms`` / a request deadline)."""

    default_code = "CLIENT_TIMEOUT"
    default_retriable = True


class DeliveryTimeoutError(ClientTimeoutError):
    """A record was not acknowledged within ``delivery_timeout_ms`` (retries included)."""

    default_code = "DELIVERY_TIMEOUT"
    default_retriable = False


class BufferExhaustedError(ClientTimeoutError):
    """``send`` found the producer buffer full for longer than ``max_block_ms``, or
    ``commit_async`` found ``limits.async_commits_pending_max`` commits already queued."""

    default_code = "BUFFER_EXHAUSTED"
    default_retriable = True


class ClosedError(RivvenError):
    """The client was closed; pending operations fail with this."""

    default_code = "CLIENT_CLOSED"


class TransactionAbortedError(RivvenError):
    """The record was not delivered: its transaction was aborted before it was sent."""

    default_code = "TRANSACTION_ABORTED"


class FeatureNotAvailableError(RivvenError):
    """The API exists in the client but its broker side arrives with a later milestone."""

    default_code = "FEATURE_NOT_AVAILABLE"


_BY_CODE: dict[ErrorCode, type[BrokerError]] = {
    cls.default_error_code: cls
    for cls in (
        UnknownTopicOrPartitionError,
        NotLeaderError,
        LeaderNotAvailableError,
        CorruptMessageError,
        MessageTooLargeError,
        OffsetOutOfRangeError,
        TopicAlreadyExistsError,
        InvalidTopicNameError,
        InvalidPartitionsError,
        InvalidReplicationFactorError,
        InvalidConfigError,
        InvalidRequestError,
        RequestTimedOutError,
        UnsupportedVersionError,
        ProducerFencedError,
        OutOfOrderSequenceError,
        UnknownProducerIdError,
        InvalidTxnStateError,
    )
}
#: The membership refusals of a commit share one class (``.error_code`` tells them apart).
_BY_CODE.update(
    {
        code: CommitFailedError
        for code in (
            ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID,
        )
    }
)


def error_for(code: ErrorCode | int, message: str = "") -> BrokerError:
    """The exception for a wire error code (never raises; ``NONE`` is a programmer error).

    Unknown numbers map to ``UNKNOWN_SERVER_ERROR``. The result's class is the specific
    subclass for common codes, else ``BrokerError``.
    """
    error_code = code if isinstance(code, ErrorCode) else ErrorCode.from_wire(code)
    assert error_code != ErrorCode.NONE, "error_for(NONE): success is not an error"
    cls = _BY_CODE.get(error_code, BrokerError)
    return cls(message or error_code.description, error_code=error_code)
