"""Cluster apis (60-79): what a broker knows of the cluster's members.

Theory of operation
-------------------
``DescribeCluster`` asks one broker for its membership view (SWIM, ``rivven_cluster``): every
member it knows with its state, incarnation, boot id, addresses and rack. A broker without
``--peers`` answers with itself alone. The answer is one broker's view: two brokers may differ
for a moment while news spreads. Since v1 it also carries the broker's view of the controller's
Raft log (its role and term, the leader, the commit index and what it applied; on the leader,
each voter's match index); a broker without ``--peers`` leaves those empty.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import (
    I64_MAX,
    ApiKey,
    Request,
    Response,
    Struct,
    boolean,
    choice,
    error_code,
    i32,
    i64,
    structs,
    text,
)

__all__ = [
    "DescribeCluster", "DescribeClusterResponse", "ClusterMember", "RaftVoter", "MEMBER_STATES",
    "RAFT_ROLES",
]

_NAME = limits.wire_name_bytes_max
_HOST = limits.host_bytes_max
#: Member states on the wire (``rivven_cluster.membership.MemberState`` order).
MEMBER_STATES = ("alive", "suspect", "dead", "left")
#: A broker's role in the controller's Raft (v1), by number; "" (0) without --peers.
RAFT_ROLES = ("", "follower", "candidate", "leader", "observer")


@attrs.frozen
class DescribeCluster(Request):
    """This broker's view of the cluster's members."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_CLUSTER
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)  # v1: the controller's Raft view


@attrs.frozen
class ClusterMember(Struct):
    """One member as the answering broker sees it. ``state``: 0 alive, 1 suspect, 2 dead,
    3 left."""

    node_id: int = i32(lo=0)
    client_host: str = text(_HOST)
    client_port: int = i32(lo=0, hi=65535)
    state: int = choice((0, 1, 2, 3), 0)
    incarnation: int = i64(0, lo=0)
    boot_id: int = i64(0, lo=0, hi=I64_MAX)
    cluster_host: str = text(_HOST, "")
    cluster_port: int = i32(0, lo=0, hi=65535)
    rack: str | None = text(_NAME, None, nullable=True)


@attrs.frozen
class RaftVoter(Struct):
    """A voter of the controller's Raft as the answering broker sees it: its match index (known
    on the leader; -1 elsewhere) and whether the link to it is up."""

    node_id: int = i32(lo=0)
    match_index: int = i64(-1, lo=-1)
    connected: bool = boolean(False)


@attrs.frozen
class DescribeClusterResponse(Response):
    """The members (the answering broker included), the answering broker's id and (v1) its
    view of the controller's Raft log."""

    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_CLUSTER
    VERSIONS: ClassVar[tuple[int, int]] = (0, 1)
    error_code: ErrorCode = error_code()
    node_id: int = i32(-1)
    members: tuple[ClusterMember, ...] = structs(ClusterMember)
    raft_role: int = choice((0, 1, 2, 3, 4), 0, since=1)  # RAFT_ROLES[raft_role]
    raft_leader: int = i32(-1, since=1)
    raft_term: int = i64(0, lo=0, since=1)
    raft_commit_index: int = i64(0, lo=0, since=1)
    raft_last_applied: int = i64(0, lo=0, since=1)
    raft_voters: tuple[RaftVoter, ...] = structs(RaftVoter, since=1)
