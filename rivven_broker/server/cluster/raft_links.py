"""The Raft links: PySyncObj's transport over authenticated Env streams.

Theory of operation
-------------------
Every pair of controllers keeps one TCP connection on the cluster address (the TCP side of
``--cluster-listen``; SWIM uses its UDP side): the broker with the larger id dials, the other
accepts, and a broken link is dialled again after ``reconnect_s``. Both ends open with a hello
and frame everything with ``rivven_cluster.link_frame`` (tagged under the cluster key ring, one
sequence per direction). Any frame that fails — bad MAC, unknown key, a sequence gap, an
oversized frame — closes the connection and is counted by reason; PySyncObj is told the peer
disconnected, which is the only way it ever loses a message (its Raft is only safe on such a
channel). A connection whose hello names the replica channel is a follower's replica link
(``replica_link.py``): it is handed to ``replica_handler`` and never reaches PySyncObj; one
naming the call channel carries broker-to-broker calls (``broker_calls.py``) and is handed to
``call_handler``.
Payloads are unpickled only after their tag verifies, and with an unpickler that
refuses every class (Raft messages are dicts, lists, tuples, bytes and numbers).

``RaftTransport.send`` does not write: it appends to the outbox. The Raft host takes the outbox
after a tick or a delivery, makes the journal durable, and only then ``release``s the batch to
the links — so no vote, AppendEntries answer or entry leaves before what it promises is on disk.
A message is released only on the connection it was queued for: if that connection closed in
between, the message is lost together with the connection, as TCP would lose it.

A link idle for ``idle_timeout_s`` (a stalled or silently partitioned peer) is closed; an idle
sender writes an empty keep-alive frame every ``keepalive_s`` so a quiet but healthy link is not.
"""

from __future__ import annotations

import functools
import io
import logging
import pickle
from typing import Any, Awaitable, Callable

import attrs
import trio
from pysyncobj.node import Node
from pysyncobj.transport import Transport

from rivven_broker.server.cluster.replica_link import ReplicaLink
from rivven_broker.server.env import Env
from rivven_cluster.link_frame import (
    CHANNEL_CALL,
    CHANNEL_REPLICA,
    NONCE_BYTES,
    Hello,
    LinkError,
    LinkReader,
    LinkSealer,
    seal_hello,
)
from rivven_cluster.membership import KeyRing

__all__ = ["LinkConfig", "RaftLinks", "RaftTransport", "ask_voters"]

log = logging.getLogger(__name__)

_OUTGOING_FRAMES_MAX = 4096
#: What a node that does not vote sends: answers to AppendEntries, forwarded commands.
_OBSERVER_SENDS = frozenset({"next_node_idx", "apply_command"})
_RECEIVE_BYTES = 65536


@attrs.frozen
class LinkConfig:
    reconnect_s: float = 0.2
    connect_timeout_s: float = 2.0
    idle_timeout_s: float = 3.0
    keepalive_s: float = 0.5


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a Raft message may not name {module}.{name}")


def _loads(payload: bytes) -> Any:
    return _NoClasses(io.BytesIO(payload)).load()


class _Link:
    """One open, authenticated connection to one peer."""

    def __init__(self, peer_id: int, sealer: LinkSealer) -> None:
        self.peer_id = peer_id
        self.sealer = sealer
        self.open = True
        self.send_channel, self.receive_channel = trio.open_memory_channel[bytes](
            _OUTGOING_FRAMES_MAX)

    def push(self, payload: bytes) -> bool:
        try:
            self.send_channel.send_nowait(payload)
            return True
        except (trio.WouldBlock, trio.ClosedResourceError):
            return False


class RaftTransport(Transport):  # type: ignore[misc]
    """What PySyncObj sees: ``send`` queues, the links deliver and report connections."""

    def __init__(self, links: RaftLinks, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803
        super().__init__(syncObj, selfNode, otherNodes)
        self._links = links
        links.transport = self

    def send(self, node: Node, message: Any) -> bool:
        return self._links.enqueue(node.id, message)

    # the links call these
    def connected(self, peer_id: int) -> None:
        self._onNodeConnected(Node(peer_id))

    def disconnected(self, peer_id: int) -> None:
        self._onNodeDisconnected(Node(peer_id))

    def observer_connected(self, peer_id: int) -> None:
        self._onReadonlyNodeConnected(Node(peer_id))

    def observer_disconnected(self, peer_id: int) -> None:
        self._onReadonlyNodeDisconnected(Node(peer_id))

    def deliver(self, peer_id: int, message: Any) -> None:
        self._onMessageReceived(Node(peer_id), message)


class RaftLinks:
    """``peers``: the voters to link with (all but this node), with their cluster addresses.
    A voter dials the voters with smaller ids and accepts the others, and accepts any other
    authenticated broker as a non-voter (PySyncObj's read-only node). A non-voter
    (``voting=False``) dials every voter."""

    def __init__(self, env: Env, node_id: int, boot_id: int, peers: dict[int, tuple[str, int]],
                 ring: Callable[[], KeyRing], wake: Callable[[], None],
                 config: LinkConfig = LinkConfig(), voting: bool = True) -> None:
        self._env = env
        self._node_id = node_id
        self._boot_id = boot_id
        self._peers = dict(peers)
        self._voting = voting
        self._voters = tuple(sorted({*peers, node_id} if voting else peers))
        self._observers: set[int] = set()
        self._ring = ring
        self._wake = wake
        self._config = config
        self._rng = env.rng("raft-link")
        self._links: dict[int, _Link] = {}
        self._outbox: list[tuple[_Link, bytes]] = []
        self.transport: RaftTransport | None = None
        #: Serves accepted replica links (``CHANNEL_REPLICA`` hellos): the replica manager.
        self.replica_handler: Callable[[Any], Awaitable[None]] | None = None
        #: Serves accepted call links (``CHANNEL_CALL`` hellos): ``BrokerCalls.serve``.
        self.call_handler: Callable[[Any], Awaitable[None]] | None = None
        #: Links closed or refused, by reason (``LinkFault`` values, handshake_failed,
        #: unexpected_peer, idle_timeout, bad_payload, observer_message_refused): a metric.
        self.faults: dict[str, int] = {}

    @property
    def transport_class(self) -> Callable[..., RaftTransport]:
        return functools.partial(RaftTransport, self)

    def connected_peers(self) -> list[int]:
        return sorted(self._links)

    # -- the outbox --------------------------------------------------------------------------

    def enqueue(self, peer_id: int, message: Any) -> bool:
        link = self._links.get(peer_id)
        if link is None:
            return False
        self._outbox.append((link, pickle.dumps(message, protocol=4)))
        self._wake()
        return True

    def take_outbox(self) -> list[tuple[_Link, bytes]]:
        batch, self._outbox = self._outbox, []
        return batch

    def release(self, batch: list[tuple[_Link, bytes]]) -> None:
        for link, payload in batch:
            if link.open and not link.push(payload):
                self._close(link, "its send queue is full")

    # -- connections -------------------------------------------------------------------------

    async def run(self) -> None:
        """Dial every peer with a smaller id, for as long as the host runs."""
        async with trio.open_nursery() as nursery:
            for peer_id in sorted(self._peers):
                if peer_id < self._node_id or not self._voting:
                    nursery.start_soon(self._dial_loop, peer_id)

    async def _dial_loop(self, peer_id: int) -> None:
        host, port = self._peers[peer_id]
        while True:
            try:
                with trio.fail_after(self._config.connect_timeout_s):
                    stream = await self._env.net.open_tcp_stream(host, port)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError):
                stream = None
            if stream is not None:
                try:
                    await self._serve(stream, expected=peer_id)
                finally:
                    await trio.aclose_forcefully(stream)
            await trio.sleep(self._config.reconnect_s * (0.5 + self._rng.random()))

    async def handle(self, stream: trio.abc.Stream) -> None:
        """An accepted connection (from a peer with a larger id)."""
        await self._serve(stream, expected=None)

    async def _serve(self, stream: trio.abc.Stream, expected: int | None) -> None:
        nonce = self._rng.randbytes(NONCE_BYTES)
        reader = LinkReader(self._ring, nonce)
        try:
            await stream.send_all(seal_hello(self._ring(), Hello(
                self._node_id, self._boot_id, nonce, self._voters)))
            hello, early = await self._receive_hello(stream, reader)
        except (LinkError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError,
                OSError) as exc:
            self._fault(exc)
            return
        peer_id = hello.node_id
        if hello.channel in (CHANNEL_REPLICA, CHANNEL_CALL):  # not a Raft link
            handler = (self.replica_handler if hello.channel == CHANNEL_REPLICA
                       else self.call_handler)
            if expected is not None or handler is None or peer_id == self._node_id:
                self._count("unexpected_peer")
                return
            await handler(ReplicaLink(
                stream, reader, LinkSealer(self._ring, nonce, hello.nonce), hello, early))
            return
        observer = False
        if expected is not None:  # we dialled: it must be who we dialled
            wanted = peer_id == expected
        elif peer_id in self._peers:  # a voter: the larger id dials
            wanted = peer_id > self._node_id
        else:  # any other broker of the cluster follows the log without voting
            wanted = observer = self._voting and peer_id != self._node_id
        if not wanted:
            self._count("unexpected_peer")
            return
        link = _Link(peer_id, LinkSealer(self._ring, nonce, hello.nonce))
        old = self._links.get(peer_id)
        if old is not None:
            self._close(old, "replaced by a new connection")
        self._links[peer_id] = link
        assert self.transport is not None
        if observer:
            self._observers.add(peer_id)
            self.transport.observer_connected(peer_id)
        else:
            self.transport.connected(peer_id)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, stream, link, nursery.cancel_scope)
                for payload in early:
                    self._deliver(peer_id, payload)
                await self._read(stream, reader, link)
                nursery.cancel_scope.cancel()
        except (LinkError, pickle.UnpicklingError) as exc:
            self._fault(exc)
        finally:
            self._close(link, "closed")

    async def _receive_hello(self, stream: trio.abc.Stream,
                             reader: LinkReader) -> tuple[Hello, list[bytes]]:
        with trio.fail_after(self._config.connect_timeout_s):
            while reader.hello is None:
                data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    raise trio.BrokenResourceError("closed during the hello")
                early = reader.feed(data)
        return reader.hello, early

    async def _read(self, stream: trio.abc.Stream, reader: LinkReader, link: _Link) -> None:
        while link.open:
            with trio.move_on_after(self._config.idle_timeout_s) as idle:
                try:
                    data = await stream.receive_some(_RECEIVE_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
            if idle.cancelled_caught:
                self._count("idle_timeout")
                return
            if not data:
                return
            for payload in reader.feed(data):
                self._deliver(link.peer_id, payload)

    def _deliver(self, peer_id: int, payload: bytes) -> None:
        if not payload:
            return  # keep-alive
        assert self.transport is not None
        message = _loads(payload)
        if peer_id in self._observers and (
                not isinstance(message, dict) or message.get("type") not in _OBSERVER_SENDS):
            self._count("observer_message_refused")  # a non-voter may not vote nor lead
            return
        self.transport.deliver(peer_id, message)
        self._wake()  # a tick now: an answer may complete a commit, an entry may be applied

    async def _write(self, stream: trio.abc.Stream, link: _Link,
                     scope: trio.CancelScope) -> None:
        try:
            while True:
                payload = None
                with trio.move_on_after(self._config.keepalive_s):
                    payload = await link.receive_channel.receive()
                frames = [link.sealer.seal(b"" if payload is None else payload)]
                while payload is not None:
                    try:
                        frames.append(link.sealer.seal(link.receive_channel.receive_nowait()))
                    except trio.WouldBlock:
                        break
                await stream.send_all(b"".join(frames))
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.EndOfChannel, OSError):
            pass
        scope.cancel()

    def _close(self, link: _Link, why: str) -> None:
        if not link.open:
            return
        link.open = False
        link.send_channel.close()
        if self._links.get(link.peer_id) is link:
            del self._links[link.peer_id]
            log.info("raft link to %d %s", link.peer_id, why)
            assert self.transport is not None
            if link.peer_id in self._observers:
                self._observers.discard(link.peer_id)
                self.transport.observer_disconnected(link.peer_id)
            else:
                self.transport.disconnected(link.peer_id)
            self._wake()

    def _fault(self, exc: BaseException) -> None:
        if isinstance(exc, LinkError):
            self._count(exc.fault.value)
        elif isinstance(exc, pickle.UnpicklingError):
            self._count("bad_payload")
        else:
            self._count("handshake_failed")

    def _count(self, reason: str) -> None:
        self.faults[reason] = self.faults.get(reason, 0) + 1


async def ask_voters(env: Env, node_id: int, boot_id: int, peers: dict[int, tuple[str, int]],
                     ring: Callable[[], KeyRing], timeout_s: float) -> tuple[int, ...] | None:
    """The Raft voters as the first peer that answers knows them (its hello), or None when
    none answers within ``timeout_s``: how a broker learns at start whether it votes."""
    rng = env.rng("raft-link-probe")
    answers: list[tuple[int, ...]] = []

    async def probe(address: tuple[str, int], done: trio.CancelScope) -> None:
        try:
            stream = await env.net.open_tcp_stream(*address)
        except OSError:
            return
        nonce = rng.randbytes(NONCE_BYTES)
        reader = LinkReader(ring, nonce)
        try:
            await stream.send_all(seal_hello(ring(), Hello(node_id, boot_id, nonce)))
            while reader.hello is None:
                data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    return
                reader.feed(data)
            if reader.hello.voters:
                answers.append(reader.hello.voters)
                done.cancel()
        except (LinkError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    with trio.move_on_after(timeout_s) as scope:
        async with trio.open_nursery() as nursery:
            for peer_id in sorted(peers):
                nursery.start_soon(probe, peers[peer_id], scope)
    return answers[0] if answers else None
