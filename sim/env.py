"""``SimEnv``: the ``Env`` of one simulated node incarnation.

Theory of operation
-------------------
The broker asks its ``Env`` (``rivven_broker.server.env``) for everything outside itself; the
simulator answers from virtual parts:

- ``clock``: the node's ``SimClock`` (true virtual time with the node's offset and drift). It
  belongs to the node, not the incarnation, so skew survives a restart.
- ``rng(name)``: ``random.Random(f"{seed}/{identity}/{name}")`` where ``identity`` is the node
  name for its first incarnation and ``name@k`` for its k-th restart, so a restarted node does
  not replay the random numbers of its previous life (as a real reboot's fresh entropy would
  not) and adding a stream never shifts another. String seeds are hashed with SHA-512 by
  ``random``, so streams do not depend on ``PYTHONHASHSEED``.
- ``net``: a ``SimNet`` for this incarnation; ``disk``: a ``DiskView`` of the node's
  ``SimDisk``. A crash revokes both before the node's tasks are cancelled.
- ``run_sync(fn, *args)``: waits the disk's fsync latency (a checkpoint, so a crash can land
  in the middle) and then runs ``fn`` inline: no threads, so the run stays deterministic.
  ``run_fsync`` (the group commit's fsyncs) is the same.
"""

from __future__ import annotations

import random
from typing import Any, Callable, TypeVar

import trio

from sim.clock import SimClock
from sim.disk import DiskView, SimDisk
from sim.net import SimNet

__all__ = ["SimEnv", "stream_seed"]

T = TypeVar("T")


def stream_seed(seed: int, identity: str, name: str) -> str:
    """The seed string of a named random stream."""
    return f"{seed}/{identity}/{name}"


class SimEnv:
    """An ``Env`` over the simulator's clock, network and disk."""

    def __init__(
        self,
        *,
        seed: int,
        identity: str,
        clock: SimClock,
        net: SimNet,
        disk: SimDisk,
    ) -> None:
        self.seed = seed
        self.identity = identity
        self.clock = clock
        self.net = net
        self.sim_disk = disk
        self.disk: DiskView = disk.view()
        self._streams: dict[str, random.Random] = {}

    def rng(self, name: str) -> random.Random:
        """The named stream of this incarnation (the same object on every call)."""
        stream = self._streams.get(name)
        if stream is None:
            stream = self._streams[name] = random.Random(stream_seed(self.seed, self.identity, name))
        return stream

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Wait the simulated fsync latency, then run ``fn(*args)`` inline. A checkpoint."""
        await trio.sleep(self.sim_disk.fsync_latency_s())
        return fn(*args)

    @property
    def filesystem_sync_files_min(self) -> int:
        """The group commit's bound for one ``sync_filesystem`` (the scenario's disk's)."""
        return self.sim_disk.config.sync_filesystem_files_min

    async def run_fsync(self, fn: Callable[..., T], *args: Any) -> T:
        """The group commit's fsyncs: as ``run_sync`` (the latency is the disk's)."""
        return await self.run_sync(fn, *args)

    def commit_in_caller(self) -> bool:
        """Always: the produce lane runs its passes' group commits in its own task (the fsync
        latency is a sleep of that task), the worker every other appender's, so scenarios
        drive both."""
        return True
