"""The registry of worker kinds: name -> ``prepare(spec)`` returning the run function.

Theory of operation
-------------------
A spawned worker (``workers.worker_main``) looks its ``spec.kind`` up here, calls
``prepare(spec)`` (connect, build templates: not timed), reports ready, then calls the
returned ``run(window, result)`` at the common start time. Kept apart from ``workers.py`` so
the loops do not import the Rivven client or the peers' protocols they do not use.
"""

from __future__ import annotations

from typing import Callable

from rivven_broker.bench import peer_load, rivven_load
from rivven_broker.bench.workers import Window, WorkerResult, WorkerSpec

__all__ = ["KINDS"]

Prepare = Callable[[WorkerSpec], Callable[[Window, WorkerResult], None]]

KINDS: dict[str, Prepare] = {
    "rivven-produce": rivven_load.prepare_produce,
    "rivven-consume": rivven_load.prepare_consume,
    "client-produce": rivven_load.prepare_client_produce,
    "client-consume": rivven_load.prepare_client_consume,
    "redis-produce": peer_load.prepare_redis_produce,
    "redis-consume": peer_load.prepare_redis_consume,
    "nats-produce": peer_load.prepare_nats_produce,
    "nats-consume": peer_load.prepare_nats_consume,
}
