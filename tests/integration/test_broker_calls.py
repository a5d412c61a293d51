"""Broker-to-broker calls over real loopback TCP: a ``RaftLinks`` listener hands call links to
``BrokerCalls.serve``. Answers, refusals (unknown op, a handler refusing its body), links
reused, and a caller without the cluster key never reaching a handler."""

from __future__ import annotations

import functools

import trio

from rivven_broker.server.cluster.broker_calls import BrokerCallFailed, BrokerCalls
from rivven_broker.server.cluster.raft_links import RaftLinks
from rivven_broker.server.env import RealEnv
from rivven_cluster.membership import KeyRing

RING = KeyRing((b"a-test-cluster-key-0123456789",))
OTHER = KeyRing((b"another-cluster-key-9876543210",))


async def _serving(tmp_path, nursery) -> tuple[BrokerCalls, int]:
    env = RealEnv(str(tmp_path))
    links = RaftLinks(env, 1, 11, {}, lambda: RING, lambda: None)
    served = BrokerCalls(env, node_id=1, boot_id=11, ring=lambda: RING, address_of=lambda n: None)
    links.call_handler = served.serve
    listeners = await nursery.start(
        functools.partial(trio.serve_tcp, links.handle, 0, host="127.0.0.1"))
    return served, listeners[0].socket.getsockname()[1]


async def test_calls_are_answered_refused_and_authenticated(tmp_path):
    async with trio.open_nursery() as nursery:
        served, port = await _serving(tmp_path, nursery)
        seen = []

        async def double(caller: int, body):
            twice = int(body["n"]) * 2  # (a body without "n": KeyError, a refusal)
            seen.append(caller)
            return {"twice": twice}
        served.handlers["double"] = double
        env = RealEnv(str(tmp_path / "caller"))
        caller = BrokerCalls(env, node_id=2, boot_id=22, ring=lambda: RING,
                             address_of=lambda n: ("127.0.0.1", port) if n == 1 else None)
        assert await caller.call(1, "double", {"n": 21}) == {"twice": 42}
        assert await caller.call(1, "double", {"n": 1}) == {"twice": 2}  # the same link
        assert seen == [2, 2] and caller.counters.get("call_answered") == 2
        for op, body in (("nothing", {}), ("double", {"m": 1})):
            try:
                await caller.call(1, op, body)
            except BrokerCallFailed as exc:
                assert "refused" in str(exc)
            else:
                raise AssertionError(f"{op} {body} was answered")
        assert served.counters.get("served_refused") == 2
        try:
            await caller.call(3, "double", {"n": 1})
        except BrokerCallFailed as exc:
            assert "no cluster address" in str(exc)

        stranger = BrokerCalls(env, node_id=2, boot_id=23, ring=lambda: OTHER,
                               address_of=lambda n: ("127.0.0.1", port))
        stranger.config = type(stranger.config)(connect_timeout_s=1.0, timeout_s=1.0)
        try:
            await stranger.call(1, "double", {"n": 5})
        except BrokerCallFailed:
            pass
        else:
            raise AssertionError("a caller without the cluster key was answered")
        assert seen == [2, 2]
        await caller.aclose()
        nursery.cancel_scope.cancel()
