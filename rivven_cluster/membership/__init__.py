"""Cluster membership: SWIM with Lifeguard, sans-I/O, over authenticated datagrams.

Theory of operation
-------------------
``swim.Membership`` is the state machine (events in, instructions out, time given);
``messages`` packs what it says into datagram payloads; ``frame`` seals payloads into
authenticated datagrams and opens them again (MAC, timestamp and replay checks); ``key_ring``
holds the shared secrets; ``members`` the member records and which claim about a member wins;
``config`` every timing. The broker's driver (``rivven_broker.server.cluster``) owns the
socket, the clock and the key file.
"""

from rivven_cluster.membership.config import MembershipConfig
from rivven_cluster.membership.frame import (
    DATAGRAM_BYTES_MAX,
    FRAME_OVERHEAD_BYTES,
    FrameHeader,
    Reason,
    Rejection,
    ReplayGuard,
    open_frame,
    seal,
)
from rivven_cluster.membership.key_ring import (
    DEVELOPMENT_KEY,
    KeyFileError,
    KeyRing,
    generate_key,
    key_id_of,
)
from rivven_cluster.membership.members import (
    Address,
    Claim,
    Member,
    MemberState,
    make_boot_id,
    supersedes,
)
from rivven_cluster.membership.messages import unpack
from rivven_cluster.membership.swim import (
    Leave,
    MemberChanged,
    Membership,
    MembershipStatistics,
    Received,
    Send,
    Start,
    Tick,
)

__all__ = [
    "MembershipConfig",
    "DATAGRAM_BYTES_MAX", "FRAME_OVERHEAD_BYTES", "FrameHeader", "Reason", "Rejection",
    "ReplayGuard", "open_frame", "seal",
    "DEVELOPMENT_KEY", "KeyFileError", "KeyRing", "generate_key", "key_id_of",
    "Address", "Claim", "Member", "MemberState", "make_boot_id", "supersedes",
    "unpack",
    "Leave", "MemberChanged", "Membership", "MembershipStatistics", "Received", "Send", "Start",
    "Tick",
]
