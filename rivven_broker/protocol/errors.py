"""Wire error codes: numbers with stable names and a retriable flag.

Theory of operation
-------------------
Every operating error that crosses the wire is an ``ErrorCode``. Numbers follow Kafka's
protocol where the meaning is the same, so a Kafka user reading ``6`` or ``NOT_LEADER`` in a
log knows what happened; codes that exist only in Rivven live at 1000 and above. Names are
Rivven's (``NOT_LEADER`` rather than Kafka's ``NOT_LEADER_OR_FOLLOWER``). A code's number and
name never change once released; new codes are only ever added. ``docs/protocol.md`` lists them
all, and a test keeps that table and this one equal.

Inside the process, protocol failures are two exception types, as in h11:
``LocalProtocolError`` (we were asked to send something invalid: a programmer or user error on
our side) and ``RemoteProtocolError`` (the peer sent something we cannot accept). Both carry the
``ErrorCode`` to put on the wire.
"""

from __future__ import annotations

import enum

__all__ = [
    "ErrorCode",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
]


class ErrorCode(enum.IntEnum):
    """A wire error code. ``.retriable`` says whether the same request may succeed later."""

    retriable: bool
    description: str

    def __new__(cls, value: int, retriable: bool, description: str) -> ErrorCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.retriable = retriable
        member.description = description
        return member

    NONE = (0, False, "Success.")
    UNKNOWN_SERVER_ERROR = (-1, False, "The broker failed in a way it could not classify.")
    OFFSET_OUT_OF_RANGE = (1, False, "The offset is outside the partition's retained range.")
    CORRUPT_MESSAGE = (2, True, "A record batch failed its size, magic or CRC check.")
    UNKNOWN_TOPIC_OR_PARTITION = (3, True, "The topic or partition does not exist on this broker.")
    INVALID_FETCH_SIZE = (4, False, "A fetch asked for a negative or zero byte budget.")
    LEADER_NOT_AVAILABLE = (5, True, "The partition has no leader at the moment.")
    NOT_LEADER = (6, True, "This broker does not lead the partition; refresh metadata.")
    REQUEST_TIMED_OUT = (7, True, "The request did not complete within its timeout.")
    MESSAGE_TOO_LARGE = (10, False, "A frame or batch exceeds the configured maximum size.")
    NETWORK_EXCEPTION = (13, True, "The connection failed before the response arrived.")
    COORDINATOR_LOAD_IN_PROGRESS = (14, True, "The coordinator is loading its state.")
    COORDINATOR_NOT_AVAILABLE = (15, True, "The coordinator is not available.")
    NOT_COORDINATOR = (16, True, "This broker is not the coordinator for the group or id.")
    INVALID_TOPIC_NAME = (17, False, "The topic name is empty, too long or has bad characters.")
    RECORD_LIST_TOO_LARGE = (18, False, "A produce request holds more than allowed.")
    NOT_ENOUGH_REPLICAS = (19, True, "Fewer in-sync replicas than min.insync.replicas.")
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (20, True, "Appended, but the ISR shrank below minimum.")
    INVALID_REQUIRED_ACKS = (21, False, "acks must be 0, 1 or -1 (all).")
    ILLEGAL_GENERATION = (22, False, "The group generation is stale; rejoin the group.")
    INCONSISTENT_GROUP_PROTOCOL = (23, False, "The member's protocols do not match the group's.")
    INVALID_GROUP_ID = (24, False, "The group id is empty, too long or has bad characters.")
    UNKNOWN_MEMBER_ID = (25, False, "The member id is not known to the group; rejoin.")
    INVALID_SESSION_TIMEOUT = (26, False, "The session timeout is outside the allowed range.")
    REBALANCE_IN_PROGRESS = (27, False, "The group is rebalancing; rejoin.")
    INVALID_COMMIT_OFFSET_SIZE = (28, False, "The commit metadata is too large.")
    UNSUPPORTED_VERSION = (35, False, "The api or version is not supported by this broker.")
    TOPIC_ALREADY_EXISTS = (36, False, "A topic with this name already exists.")
    INVALID_PARTITIONS = (37, False, "The partition count is out of range.")
    INVALID_REPLICATION_FACTOR = (38, False, "The replication factor is out of range.")
    INVALID_CONFIG = (40, False, "A configuration key or value is invalid.")
    NOT_CONTROLLER = (41, True, "This broker is not the controller.")
    INVALID_REQUEST = (42, False, "The request could not be decoded or is malformed.")
    POLICY_VIOLATION = (44, False, "The request violates a broker policy.")
    OUT_OF_ORDER_SEQUENCE = (45, False, "The producer sequence has a gap.")
    DUPLICATE_SEQUENCE = (46, False, "The batch is a duplicate of an earlier one.")
    INVALID_PRODUCER_EPOCH = (47, False, "The producer epoch is not the current one.")
    INVALID_TXN_STATE = (48, False, "The transaction is not in a state that allows this.")
    INVALID_PRODUCER_ID_MAPPING = (49, False, "The producer id does not match the txn id.")
    INVALID_TRANSACTION_TIMEOUT = (50, False, "The transaction timeout is out of range.")
    CONCURRENT_TRANSACTIONS = (51, True, "A previous transaction is still completing.")
    KAFKA_STORAGE_ERROR = (56, True, "The broker's disk failed for this partition.")
    UNKNOWN_PRODUCER_ID = (59, False, "The broker has no state for this producer id.")
    NON_EMPTY_GROUP = (68, False, "The group still has members.")
    GROUP_ID_NOT_FOUND = (69, False, "The group does not exist.")
    FENCED_LEADER_EPOCH = (74, True, "The leader epoch in the request is older than current.")
    UNKNOWN_LEADER_EPOCH = (75, True, "The leader epoch in the request is newer than current.")
    MEMBER_ID_REQUIRED = (79, False, "Rejoin with the member id the broker assigned.")
    GROUP_MAX_SIZE_REACHED = (81, False, "The group already has the maximum number of members.")
    FENCED_INSTANCE_ID = (82, False, "Another member took this group instance id.")
    PRODUCER_FENCED = (90, False, "A newer producer with the same transactional id exists.")
    TRANSACTIONAL_ID_NOT_FOUND = (105, False, "The transactional id is not known.")
    # Rivven-only codes.
    UNSUPPORTED_FORMAT = (1000, False, "The frame's format byte names an unsupported codec.")
    BROKER_SHUTTING_DOWN = (1001, True, "The broker is stopping; try another or retry later.")
    THROTTLED = (1002, True, "Too many requests in flight on this connection.")

    @classmethod
    def from_wire(cls, value: int) -> ErrorCode:
        """Map a wire number to a code; unknown numbers become ``UNKNOWN_SERVER_ERROR``."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


class ProtocolError(Exception):
    """A frame or message broke the protocol. Carries the ``ErrorCode`` for the wire."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> None:
        super().__init__(message)
        assert isinstance(code, ErrorCode)
        assert code != ErrorCode.NONE
        self.code = code


class LocalProtocolError(ProtocolError):
    """We were asked to build something the protocol forbids (our side's mistake)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids."""
