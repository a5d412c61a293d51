"""File descriptors: raise the process's limit at start, and share it out.

Theory of operation
-------------------
Every client connection, HTTP connection, open segment file and index takes a descriptor, and
the usual soft limit is 1,024 while the hard limit is often far higher. At the limit,
``accept`` fails (clients hang in the backlog), ``open`` fails (a topic cannot be created) and
``/metrics`` cannot be reached. So ``rivven-broker`` raises its soft limit to the hard one at
start (``raise_descriptor_limit``), and a broker whose ``connections_max`` is left at -1 takes
its connection cap from the limit then in force (``connections_max_for``): half of what is left
after a fixed reserve (listeners, the lock, the log, pipes, the fsync thread) and the HTTP
cap, so the other half stays for segment files: the storage layer keeps at most that many open
(``files_max_for``, ``storage/handle_cache.py``), whatever the number of partitions and segments.
"""

from __future__ import annotations

import resource

from rivven_broker.protocol import limits

__all__ = ["raise_descriptor_limit", "descriptor_limit", "connections_max_for", "files_max_for"]

#: Descriptors kept for the broker itself: listeners, the data-directory lock, logging,
#: signal pipes, the fsync thread, a spare kept to refuse connections cleanly.
_RESERVED_DESCRIPTORS = 64


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one; return (before, after). Never raises:
    a platform that refuses keeps its limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, target
    return soft, soft


def descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE in force now."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def files_max_for(descriptors: int, http_connections_max: int) -> int:
    """The open-files bound of the storage layer for a process allowed ``descriptors``: the
    half ``connections_max_for`` leaves, at least ``limits.open_files_min``."""
    spare = descriptors - _RESERVED_DESCRIPTORS - http_connections_max
    return max(limits.open_files_min, min(limits.open_files_max, spare // 2))


def connections_max_for(descriptors: int, http_connections_max: int) -> int:
    """The client-connection cap for a process allowed ``descriptors``: half of what is left
    after the reserve and the HTTP cap, at least 1, at most ``limits.connections_max``."""
    spare = descriptors - _RESERVED_DESCRIPTORS - http_connections_max
    return max(1, min(limits.connections_max, spare // 2))
