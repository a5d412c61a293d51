"""``LocalTopics``: the one way a broker creates, grows, reconfigures and deletes its topic logs.

Theory of operation
-------------------
Deleting a topic's logs is more than ``LogManager.delete_topic``: requests naming the topic
wait at its gate meanwhile, the group-commit worker lets go of every partition log first (an
fsync must not run on a closed file), producer state forgets the topic, and waiting fetches are
woken to see it gone. Growing wakes fetches waiting on the topic. ``LocalTopics`` does each of
these whole, for whoever decides: the controller's reconciliation on a clustered broker (the
applied metadata says so), and the single-node handlers.

Every method blocks on file I/O (directory and registry fsyncs), as admin actions always
have; ``delete`` awaits the sync worker.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping

from rivven_broker.server.context import ServerContext
from rivven_broker.storage.log_manager import TopicInfo

__all__ = ["LocalTopics"]

log = logging.getLogger(__name__)


class LocalTopics:
    def __init__(self, context: ServerContext) -> None:
        self._context = context
        #: name -> (the topic's info, the configs object) as ``configure`` last left them.
        self._configured: dict[str, tuple[TopicInfo, Mapping[str, str]]] = {}

    def topics(self) -> Mapping[str, TopicInfo]:
        return self._context.logs.topics()

    def create(self, name: str, partitions: int, replication_factor: int,
               configs: Mapping[str, str], now_ms: int, *, topic_id: str | None = None) -> None:
        self._context.logs.create_topic(name, partitions, replication_factor, configs, now_ms,
                                        topic_id=topic_id)

    def grow(self, name: str, count: int, now_ms: int) -> None:
        self._context.logs.add_partitions(name, count, now_ms)
        self._context.waker.poke_topic(name)

    def configure(self, name: str, configs: Mapping[str, str]) -> None:
        """Make the topic's overrides exactly ``configs`` (keys not named go back to default).
        The reconciliation asks for every topic at every metadata change: when neither the
        topic (its ``TopicInfo``: replaced by any change) nor the ``configs`` object changed
        since the last call, there is nothing to compare."""
        info = self._context.logs.topics()[name]
        last = self._configured.get(name)
        if last is not None and last[0] is info and last[1] is configs:
            return
        current = info.config.to_strings(include_defaults=False)
        changes: dict[str, str | None] = {k: None for k in current if k not in configs}
        changes.update({k: v for k, v in configs.items() if current.get(k) != v})
        if changes:
            self._context.logs.alter_topic_config(name, changes)
        self._configured[name] = (self._context.logs.topics()[name], configs)

    def delete(self, name: str) -> Awaitable[None]:
        """Close the topic's gate now (requests naming it wait from this moment); the returned
        awaitable does the rest and opens the gate again, whatever happens."""
        self._context.gates.close(name)
        return self._delete(name)

    async def _delete(self, name: str) -> None:
        context = self._context
        try:
            partitions = context.logs.topics()[name].partitions
            for partition in range(partitions):
                await context.sync_worker.detach(context.logs.get_log(name, partition))
            context.partitions.forget_topic(name)
            context.logs.delete_topic(name)
            self._configured.pop(name, None)
        finally:
            context.gates.open(name)
            context.waker.poke_topic(name)
