"""Who logged a line, and when on the virtual clock: ``python -m sim -v`` prefixes each broker
or client log line with the virtual second and the node incarnation (``n2@3``) or client
(``c1``) whose task wrote it. Tasks inherit the actor from the task that started them, so one
``ACTOR.set`` where a node or client starts tags everything it runs."""

from __future__ import annotations

import contextvars
import logging

import trio

#: The node incarnation or client the current task belongs to ("sim": the world itself).
ACTOR: contextvars.ContextVar[str] = contextvars.ContextVar("sim_actor", default="sim")

FORMAT = "%(sim_time)9.3f %(sim_actor)-6s %(levelname)s %(name)s: %(message)s"


class ActorFilter(logging.Filter):
    """Adds ``sim_time`` (virtual seconds; 0 outside the run) and ``sim_actor`` to records."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.sim_actor = ACTOR.get()
        try:
            record.sim_time = trio.current_time()
        except RuntimeError:  # not inside trio.run
            record.sim_time = 0.0
        return True
