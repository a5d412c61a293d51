"""LocalTopics.configure: the overrides become exactly the metadata's, and a topic whose info
and configs are the very objects of the last call is not compared again.

Method: a fake log manager that records alterations and replaces a topic's info at each one,
as ``LogManager.alter_topic_config`` does.
"""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace

import attrs

from rivven_broker.server.local_topics import LocalTopics
from rivven_broker.storage.log_manager import TopicInfo
from rivven_broker.storage.topic_config import TopicConfig


class _Logs:
    def __init__(self) -> None:
        self._topics = {"t": TopicInfo("t", "id-t", 1, 1, TopicConfig.parse({}), 0)}
        self.altered: list[dict] = []

    def topics(self):
        return MappingProxyType(self._topics)

    def alter_topic_config(self, name, changes):
        self.altered.append(dict(changes))
        info = self._topics[name]
        self._topics[name] = attrs.evolve(info, config=info.config.alter(changes))


def test_configure_alters_only_what_differs_and_skips_what_it_saw_last() -> None:
    logs = _Logs()
    local = LocalTopics(SimpleNamespace(logs=logs))
    wanted = MappingProxyType({"retention.ms": "1000"})
    local.configure("t", wanted)
    assert logs.altered == [{"retention.ms": "1000"}]
    local.configure("t", wanted)  # the same objects: nothing compared, nothing altered
    local.configure("t", MappingProxyType({"retention.ms": "1000"}))  # equal: compared, same
    assert logs.altered == [{"retention.ms": "1000"}]
    # Someone else altered the topic since (its info is a new object): compared again.
    logs.alter_topic_config("t", {"retention.ms": "5"})
    local.configure("t", wanted)
    assert logs.altered[-1] == {"retention.ms": "1000"}
    assert logs.topics()["t"].config.to_strings(include_defaults=False) == {"retention.ms": "1000"}
    local.configure("t", MappingProxyType({}))  # back to every default
    assert logs.altered[-1] == {"retention.ms": None}
