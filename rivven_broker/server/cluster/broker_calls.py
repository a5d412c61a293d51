"""Broker-to-broker calls: one request, one answer, over an authenticated cluster link.

Theory of operation
-------------------
Some work one broker starts must be done by another: a transaction coordinator writes its
markers to partitions other brokers lead, hands a committed transaction's consumer offsets to
the group's coordinator and asks it whether a member is current; a partition leader asks a
transactional producer's coordinator whether a batch may open a transaction there.
``BrokerCalls.call(node, op, body)`` sends the msgpack document ``{"op": op, "body": body}``
over a link on ``CHANNEL_CALL`` (``link_frame``: tagged under the cluster key ring, bound to the
connection, direction and sequence, so only a broker holding the key can call, and a client
connection never can) and returns the answer's body.

- *Links*: opened on first use to the peer's cluster address, kept idle for the next call;
  a call takes an idle link or opens one (at most ``links_per_peer`` at once; more callers
  wait), and a link that fails is dropped. One call at a time per link: request, answer.
- *Bounds*: opening a link within ``connect_timeout_s``, an answer within ``timeout_s``; a
  failure raises ``BrokerCallFailed`` and the caller decides whether to retry.
- *Serving* (``serve``, handed accepted links by the Raft listener): each request is
  dispatched by op to ``handlers[op](caller_node_id, body) -> body``; an unknown op, a body the
  handler refuses (``ValueError``/``KeyError``/``TypeError``) is answered
  ``{"error": "..."}``, never by closing the link.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import attrs
import msgpack
import trio

from rivven_broker.server.cluster.replica_link import LinkClosed, ReplicaLink, open_replica_link
from rivven_broker.server.env import Env
from rivven_cluster.link_frame import CHANNEL_CALL
from rivven_cluster.membership import KeyRing

__all__ = ["BrokerCalls", "BrokerCallFailed", "CallConfig", "Handler"]

log = logging.getLogger(__name__)

#: ``handler(caller_node_id, body) -> answer body``.
Handler = Callable[[int, Any], Awaitable[Any]]


class BrokerCallFailed(Exception):
    """The call did not get an answer (no link, a timeout, the peer refused it)."""


@attrs.frozen
class CallConfig:
    connect_timeout_s: float = 2.0
    timeout_s: float = 10.0
    links_per_peer: int = 4


class BrokerCalls:
    """This broker's calls to others and its answers to theirs (see the module docstring)."""

    def __init__(self, env: Env, *, node_id: int, boot_id: int, ring: Callable[[], KeyRing],
                 address_of: Callable[[int], tuple[str, int] | None],
                 config: CallConfig = CallConfig()) -> None:
        self._env = env
        self.node_id = node_id
        self._boot_id = boot_id
        self._ring = ring
        self._address_of = address_of
        self.config = config
        self.handlers: dict[str, Handler] = {}
        self._idle: dict[int, list[ReplicaLink]] = {}
        self._slots: dict[int, trio.Semaphore] = {}
        #: Calls made and served, by outcome: a metric and a test hook.
        self.counters: dict[str, int] = {}

    # -- calling -----------------------------------------------------------------------------

    async def call(self, node: int, op: str, body: Any) -> Any:
        """``op`` answered by broker ``node``. Raises ``BrokerCallFailed``."""
        slots = self._slots.setdefault(node, trio.Semaphore(self.config.links_per_peer))
        async with slots:
            link = await self._link(node)
            try:
                with trio.fail_after(self.config.timeout_s):
                    await link.send(msgpack.packb({"op": op, "body": body}))
                    answer = msgpack.unpackb(await link.receive(), raw=False)
            except (LinkClosed, trio.TooSlowError, ValueError, msgpack.UnpackException) as exc:
                await link.aclose()
                self._count("call_failed")
                raise BrokerCallFailed(f"{op} to broker {node}: {exc or 'timed out'}") from exc
            self._idle.setdefault(node, []).append(link)
        if not isinstance(answer, dict) or "error" in answer or "body" not in answer:
            self._count("call_refused")
            raise BrokerCallFailed(f"{op} refused by broker {node}: {answer.get('error')!r}"
                                   if isinstance(answer, dict) else f"{op}: a bad answer")
        self._count("call_answered")
        return answer["body"]

    async def _link(self, node: int) -> ReplicaLink:
        idle = self._idle.get(node)
        if idle:
            return idle.pop()
        address = self._address_of(node)
        if address is None:
            raise BrokerCallFailed(f"no cluster address known for broker {node}")
        try:
            return await open_replica_link(
                self._env, address, node_id=self.node_id, boot_id=self._boot_id,
                ring=self._ring, timeout_s=self.config.connect_timeout_s, channel=CHANNEL_CALL)
        except LinkClosed as exc:
            self._count("connect_failed")
            raise BrokerCallFailed(str(exc)) from exc

    async def aclose(self) -> None:
        for links in self._idle.values():
            for link in links:
                await link.aclose()
        self._idle.clear()

    # -- serving -----------------------------------------------------------------------------

    async def serve(self, link: ReplicaLink) -> None:
        """Answer one peer's calls until the link closes."""
        caller = link.peer.node_id
        try:
            while True:
                payload = await link.receive()
                try:
                    request = msgpack.unpackb(payload, raw=False)
                    op, body = request["op"], request["body"]
                    handler = self.handlers.get(op) if isinstance(op, str) else None
                    if handler is None:
                        raise KeyError(f"unknown op {op!r}")
                    answer = {"body": await handler(caller, body)}
                    self._count(f"served_{op}")
                except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
                    self._count("served_refused")
                    answer = {"error": str(exc)[:200]}
                await link.send(msgpack.packb(answer))
        except LinkClosed as exc:
            log.debug("call link from %d closed: %s", caller, exc)
        finally:
            await link.aclose()

    def _count(self, what: str) -> None:
        self.counters[what] = self.counters.get(what, 0) + 1
