"""What every request handler shares: the logs, the sync worker, wake-ups, gates, settings.

Theory of operation
-------------------
A broker builds one ``ServerContext`` once its logs are open and hands it to the request
handlers (``handlers.py`` for administration, ``data_path.py`` for produce and fetch). Besides
references to the ``LogManager``, the ``SyncWorker``, the metrics and the ``Env``, it holds the
two small coordination devices the handlers need:

- ``PartitionWaker``: a long-polling fetch registers one ``trio.Event`` under every partition it
  reads; whatever moves a partition forward calls ``poke``, which sets and forgets the events
  registered there. Exact wake-ups, one dict lookup per move when nobody waits, and no polling
  loop anywhere. Two of them: ``waker`` is poked when a partition's high watermark moves (or
  its topic is created or deleted) and wakes consumer fetches; ``appends`` is poked at every
  append and wakes the replica fetches a leader holds for its followers (they read above the
  high watermark). The partitions poke both (``storage/partition.py``, ``PartitionEvents``).
- ``TopicGates``: deleting a topic has an ``await`` in the middle (the sync worker must let
  go of the topic's files first). While that runs the topic is *gated*: a
  connection about to handle a request that touches it waits for the gate to open, so no
  append slips in between the final sync and the close.

``Pending`` is what a handler returns when its answer is not ready at once: an async function
producing the response. ``serial`` pendings are awaited by the connection's reader before it
handles the next request (administrative changes keep request order for their effects);
the others run concurrently and are only answered in order.

The high watermark is the partition's (``Partition.high_watermark``): a single node's is its
durable offset under ``sync=always`` (a consumer never reads what a crash could take back)
and its log end offset under ``interval_ms=N`` and ``none``; a clustered broker's leader has
the replicated one (the smallest durable offset over the ISR). ``partition(topic, index)``
finds a partition by name.
"""

from __future__ import annotations

import math

from typing import TYPE_CHECKING, Awaitable, Callable, Iterable, NamedTuple

import attrs
import trio

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import Response
from rivven_broker.storage.partition import Partition, Partitions
from rivven_broker.storage.sync_worker import SyncPolicy, SyncWorker

if TYPE_CHECKING:
    from rivven_cluster.membership import Member
    from rivven_broker.server.cluster.cluster_control import ClusterControl
    from rivven_broker.server.cluster.replica_manager import ReplicaManager
    from rivven_broker.server.control import Control
    from rivven_broker.server.config import BrokerConfig
    from rivven_broker.server.env import Env
    from rivven_broker.server.group_driver import GroupDriver
    from rivven_broker.server.metrics import BrokerMetrics
    from rivven_broker.server.txn_driver import TxnDriver
    from rivven_broker.storage.log_manager import LogManager

__all__ = ["RequestContext", "Pending", "PartitionWaker", "TopicGates", "ServerContext"]

TopicPartition = tuple[str, int]


class RequestContext(NamedTuple):
    """Who sent the request being handled, and when: the connection builds one per request
    and the handlers receive it explicitly (``client_id`` from the connection's Handshake,
    "" before one; ``client_host`` the peer's address; ``now_ms`` the wall clock;
    ``received_at``: trio's clock when the request was read, if the caller read it already
    (the produce lane, once per pass), else None)."""

    now_ms: int
    client_id: str = ""
    client_host: str = ""
    received_at: float | None = None


class Pending(NamedTuple):
    """A response that needs waiting for. ``serial``: the reader awaits it before going on.

    ``ready``, when given, answers without waiting if it can: it returns the response, or
    ``None`` when ``wait`` is still needed. A connection completing a run of pipelined
    produces calls it first, so the answers a group commit made durable are filled in one
    pass, with no checkpoint (and no separate write) per request. ``ready`` returns every
    answer ``wait`` would give before ``deadline`` (trio time); only at the deadline must
    ``wait`` be called (the produce lane hands such a request to its connection's task).
    ``provisional`` is the answer as if the wait had succeeded at once: only the simulator's
    deliberate lane bug (an answer before durability, ``[test] lane_answer_early``) uses it.
    ``after_progress``: ``ready`` answers None until a partition reports progress
    (``PartitionEvents.progressed``: a commit, a failure, a change of leader) after the
    pending was made, so the produce lane need not ask before then.

    ``Pending`` and ``RequestContext`` are frozen ``NamedTuple``s, not attrs classes: one of
    each is made per produce, and a frozen attrs class costs ~2.5x as much to build.
    """

    wait: Callable[[], Awaitable[Response]]
    serial: bool = False
    ready: Callable[[], Response | None] | None = None
    deadline: float = math.inf
    provisional: Callable[[], Response] | None = None
    after_progress: bool = False


class PartitionWaker:
    """Events of long-polling fetches, by partition. Never blocks."""

    def __init__(self) -> None:
        self._events: dict[TopicPartition, set[trio.Event]] = {}

    def register(self, event: trio.Event, partitions: Iterable[TopicPartition]) -> None:
        for key in partitions:
            self._events.setdefault(key, set()).add(event)

    def unregister(self, event: trio.Event, partitions: Iterable[TopicPartition]) -> None:
        for key in partitions:
            waiting = self._events.get(key)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._events[key]

    def poke(self, key: TopicPartition) -> None:
        """Wake every fetch waiting on ``key``."""
        waiting = self._events.pop(key, None)
        if waiting:
            for event in waiting:
                event.set()

    def poke_topic(self, topic: str) -> None:
        """Wake every fetch waiting on any partition of ``topic``."""
        for key in [key for key in self._events if key[0] == topic]:
            self.poke(key)

    @property
    def waiting_partitions(self) -> int:
        return len(self._events)


class TopicGates:
    """Topics closed for a moment while they are being deleted. Never blocks."""

    def __init__(self) -> None:
        self._gates: dict[str, trio.Event] = {}
        #: Some topic is closed (``bool(self)``, as an attribute: every request reads it).
        self.any_closed = False

    def close(self, topic: str) -> None:
        assert topic not in self._gates, topic
        self._gates[topic] = trio.Event()
        self.any_closed = True

    def open(self, topic: str) -> None:
        self._gates.pop(topic).set()
        self.any_closed = bool(self._gates)

    def get(self, topic: str) -> trio.Event | None:
        """The event to wait for before touching ``topic``, or None when it is open."""
        return self._gates.get(topic)

    def __bool__(self) -> bool:
        return bool(self._gates)


@attrs.define
class ServerContext:
    """Everything the handlers of one broker share (see the module docstring)."""

    env: Env
    config: BrokerConfig
    logs: LogManager
    sync_worker: SyncWorker
    metrics: BrokerMetrics
    #: The address clients are told to use (the bound client port).
    advertised_host: str
    advertised_port: int
    #: Consumer fetches wait here for a high watermark to move.
    waker: PartitionWaker = attrs.field(factory=PartitionWaker)
    #: A leader's replica fetches wait here for appends.
    appends: PartitionWaker = attrs.field(factory=PartitionWaker)
    gates: TopicGates = attrs.field(factory=TopicGates)
    #: Every partition: producer state (idempotence, open transactions, LSO), high watermark
    #: and waits; every append goes through it (``storage/partition.py``).
    partitions: Partitions = attrs.field(factory=Partitions)
    #: The transaction coordinator's driver, once the broker started it (``txn_driver.py``).
    txn: TxnDriver | None = None
    #: The group coordinator's driver, once the broker opened it (``group_driver.py``).
    groups: GroupDriver | None = None
    #: This broker's view of the cluster's members (SWIM, with --peers; None: single node).
    members: Callable[[], list[Member]] | None = None
    #: Who decides topics: the broker alone (``LocalControl``) or the cluster's controller
    #: (``ClusterControl``, with --peers). Set by the broker before it serves.
    control: Control | None = None
    #: The controller of a clustered broker (None: a single node decides alone). The produce
    #: path asks it whether this broker leads a partition.
    cluster: ClusterControl | None = None
    #: The replicas of a clustered broker: leadership, the replicated high watermark and
    #: ``acks=all`` waits (None: a single node).
    replicas: ReplicaManager | None = None

    @property
    def policy(self) -> SyncPolicy:
        return self.sync_worker.policy

    def read_refusal(self, key: TopicPartition, client_epoch: int = -1) -> ErrorCode | None:
        """Why a client may not read ``key`` here now (None: it may). A clustered broker
        serves reads only as the partition's leader (``ReplicaManager.read_error``), and
        none at all while its cluster is starting: its client port opens before the
        controller and replicas run, and until then it leads nothing (a read answered from
        the local log could pass the cluster's high watermark)."""
        if self.replicas is not None:
            return self.replicas.read_error(key, client_epoch)
        if self.cluster is not None:
            return ErrorCode.NOT_LEADER
        return None

    def partition(self, topic: str, index: int) -> Partition:
        """The partition ``topic``/``index`` (opened now if new: blocks on its files then).

        Raises:
            UnknownTopicOrPartitionError: no such partition.
        """
        return self.partitions.get(topic, index, self.logs.get_log(topic, index))
