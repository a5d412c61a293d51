"""Which topic names and group ids are legal.

Theory of operation
-------------------
Messages accept any name up to ``limits.wire_name_bytes_max`` bytes, so that one bad topic in
a request does not spoil the rest: the broker asks these functions, per topic or group, and
answers the offending item with the code returned. Legal names are 1 to 249 bytes (topics) or
1 to 256 bytes (groups) of ASCII letters, digits, ``.``, ``_`` and ``-``, and neither ``.`` nor
``..`` (they would be directory names). Pure functions; they never raise.
"""

from __future__ import annotations

import re

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["topic_name_error", "group_id_error"]

_LEGAL = re.compile(r"[A-Za-z0-9._-]+")
_RESERVED = frozenset({".", ".."})


def _legal(name: object, bytes_max: int) -> bool:
    # Legal characters are ASCII, so characters and bytes count the same.
    return (
        type(name) is str
        and 1 <= len(name) <= bytes_max
        and name not in _RESERVED
        and _LEGAL.fullmatch(name) is not None
    )


def topic_name_error(name: object) -> ErrorCode | None:
    """None when ``name`` is a legal topic name, else ``ErrorCode.INVALID_TOPIC_NAME``."""
    return None if _legal(name, limits.topic_name_bytes_max) else ErrorCode.INVALID_TOPIC_NAME


def group_id_error(group_id: object) -> ErrorCode | None:
    """None when ``group_id`` is a legal group id, else ``ErrorCode.INVALID_GROUP_ID``."""
    return None if _legal(group_id, limits.group_id_bytes_max) else ErrorCode.INVALID_GROUP_ID
