"""The topic registry: which topics exist, persisted atomically in ``topics.json``.

Theory of operation
-------------------
The registry is the commit point for creating and deleting topics and for growing their
partition counts: a topic exists exactly when ``topics.json`` lists it, with the partitions it
lists. The file holds, per topic, its name, id, partition count, replication
factor, explicit (non-default) configs and creation time, plus the counter for topic ids::

    {"format": 1, "next_topic_number": 3,
     "topics": [{"name": "orders", "topic_id": "<32 hex>", "partitions": 3,
                 "replication_factor": 1, "configs": {"retention.ms": "3600000"},
                 "created_ms": 1700000000000}, ...]}

``save_registry`` replaces it atomically through the ``FileStore``: write ``topics.json.tmp``
(truncated first: a crash may have left an old one), fsync it, rename it over ``topics.json``,
fsync the directory. A crash at any point leaves either the old or the new file in place, never
neither and never a torn one: the temporary file is complete before the rename, and the rename
is atomic.

``load_registry`` reads the file. If it is missing or unreadable (bad JSON, wrong shape, an
invalid name or config) it falls back to scanning the data directory for ``<topic>-<partition>``
directories and recovers each topic with default configs, replication factor 1 and partition
count = highest partition + 1; the returned ``RegistryLoad`` says that this happened and why.
Topic names may contain ``-``, so a directory name is split at its LAST ``-``; names whose
suffix is not a canonical decimal partition number (``orders-01``, ``x.abc-delete``) and names
starting with ``.`` are ignored. Pure functions over a ``FileStore``; no clocks (``now_ms`` is
passed in).
"""

from __future__ import annotations

import json
import re
import types
from typing import Callable, Mapping

import attrs

from rivven_broker.protocol import limits
from rivven_broker.storage.errors import InvalidConfigError, InvalidTopicNameError
from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.topic_config import TopicConfig

__all__ = [
    "REGISTRY_FILE",
    "REGISTRY_TMP_FILE",
    "TopicInfo",
    "RegistryLoad",
    "validate_topic_name",
    "partition_dir",
    "parse_partition_dir",
    "encode_registry",
    "decode_registry",
    "save_registry",
    "load_registry",
    "scan_partition_dirs",
]

REGISTRY_FILE = "topics.json"
REGISTRY_TMP_FILE = "topics.json.tmp"
_FORMAT = 1
_LEGAL_NAME = re.compile(r"[A-Za-z0-9._-]+")
_PARTITION = re.compile(r"0|[1-9][0-9]*")


@attrs.frozen
class TopicInfo:
    """One registered topic."""

    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    config: TopicConfig
    created_ms: int

    def __attrs_post_init__(self) -> None:
        assert 1 <= self.partitions <= limits.partitions_per_topic_max, self.partitions
        assert 1 <= self.replication_factor <= limits.replication_factor_max
        assert self.topic_id


@attrs.frozen
class RegistryLoad:
    """What ``load_registry`` found. ``source`` is ``file``, ``scan`` (fallback) or ``empty``."""

    topics: Mapping[str, TopicInfo]
    next_topic_number: int
    source: str
    #: Why the file could not be used (``None`` when it was used or the directory is fresh).
    problem: str | None = None

    @property
    def fallback(self) -> bool:
        """True when the topics were recovered by a directory scan."""
        return self.source == "scan"


def validate_topic_name(name: str) -> None:
    """Check a topic name: 1..249 bytes of ``[A-Za-z0-9._-]``, not starting with ``.``.

    Names starting with ``.`` are refused because the directory scan (and ``ls``) would hide
    them. Does not block.

    Raises:
        InvalidTopicNameError: the name breaks one of these rules.
    """
    if not isinstance(name, str) or not name:
        raise InvalidTopicNameError(str(name), "empty")
    if len(name) > limits.topic_name_bytes_max:
        raise InvalidTopicNameError(name[:32] + "...", f"longer than {limits.topic_name_bytes_max}")
    if not _LEGAL_NAME.fullmatch(name):
        raise InvalidTopicNameError(name, "only ASCII letters, digits, '.', '_' and '-' allowed")
    if name.startswith("."):
        raise InvalidTopicNameError(name, "may not start with '.'")


def partition_dir(topic: str, partition: int) -> str:
    """The directory of one partition, relative to the data directory: ``<topic>-<partition>``."""
    assert partition >= 0
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` for a partition directory name, ``None`` for anything else."""
    if name.startswith("."):
        return None
    topic, dash, suffix = name.rpartition("-")
    if not dash or not _PARTITION.fullmatch(suffix):
        return None
    try:
        validate_topic_name(topic)
    except InvalidTopicNameError:
        return None
    return topic, int(suffix)


def encode_registry(topics: Mapping[str, TopicInfo], next_topic_number: int) -> bytes:
    """The canonical bytes of ``topics.json`` (sorted, so equal registries give equal bytes):
    one topic per line, each line a compact JSON object. (``json.dumps`` with ``indent``
    runs the pure-Python encoder, four times slower; the registry is written at every change
    of topics, which a cluster's metadata log replays often.)"""
    entries = [
        json.dumps({
            "name": info.name,
            "topic_id": info.topic_id,
            "partitions": info.partitions,
            "replication_factor": info.replication_factor,
            "configs": info.config.to_strings(include_defaults=False),
            "created_ms": info.created_ms,
        }, sort_keys=True)
        for _, info in sorted(topics.items())
    ]
    head = json.dumps({"format": _FORMAT, "next_topic_number": next_topic_number},
                      sort_keys=True)[:-1]
    lines = ",".join("\n " + entry for entry in entries) + ("\n" if entries else "")
    return (head + ', "topics": [' + lines + "]}\n").encode()


def decode_registry(data: bytes) -> tuple[dict[str, TopicInfo], int]:
    """Parse ``topics.json`` bytes into ``(topics, next_topic_number)``. Does not block.

    Raises:
        ValueError: the bytes are not a valid registry (JSON, shape, names, configs, counts).
    """
    try:
        document = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != _FORMAT:
        raise ValueError("not a format 1 registry document")
    next_number = document.get("next_topic_number")
    entries = document.get("topics")
    if not _is_int(next_number) or next_number < 0 or not isinstance(entries, list):
        raise ValueError("missing next_topic_number or topics")
    topics: dict[str, TopicInfo] = {}
    for entry in entries:
        info = _decode_topic(entry)
        if info.name in topics:
            raise ValueError(f"topic {info.name!r} listed twice")
        topics[info.name] = info
    return topics, next_number


def _decode_topic(entry: object) -> TopicInfo:
    if not isinstance(entry, dict):
        raise ValueError("topic entry is not an object")
    name, topic_id = entry.get("name"), entry.get("topic_id")
    partitions, factor = entry.get("partitions"), entry.get("replication_factor")
    configs, created_ms = entry.get("configs"), entry.get("created_ms")
    if not isinstance(name, str) or not isinstance(topic_id, str) or not topic_id:
        raise ValueError("topic entry lacks a name or id")
    try:
        validate_topic_name(name)
    except InvalidTopicNameError as exc:
        raise ValueError(str(exc)) from None
    if not _is_int(partitions) or not 1 <= partitions <= limits.partitions_per_topic_max:
        raise ValueError(f"topic {name!r}: bad partition count {partitions!r}")
    if not _is_int(factor) or not 1 <= factor <= limits.replication_factor_max:
        raise ValueError(f"topic {name!r}: bad replication factor {factor!r}")
    if not _is_int(created_ms) or not isinstance(configs, dict):
        raise ValueError(f"topic {name!r}: bad created_ms or configs")
    try:
        config = TopicConfig.parse(configs)
    except InvalidConfigError as exc:
        raise ValueError(f"topic {name!r}: {exc}") from None
    return TopicInfo(name, topic_id, partitions, factor, config, created_ms)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def save_registry(
    store: FileStore, topics: Mapping[str, TopicInfo], next_topic_number: int
) -> None:
    """Replace ``topics.json`` atomically (tmp, fsync, rename, fsync dir). Blocks on two fsyncs.

    Raises:
        OSError: the store failed; ``topics.json`` then holds the old or the new registry.
    """
    data = encode_registry(topics, next_topic_number)
    handle = store.open(REGISTRY_TMP_FILE, create=True)
    try:
        store.truncate(handle, 0)
        store.pwrite(handle, data, 0)
        store.fsync(handle)
    finally:
        store.close(handle)
    store.rename(REGISTRY_TMP_FILE, REGISTRY_FILE)
    store.fsync_dir("")


def scan_partition_dirs(store: FileStore) -> dict[str, set[int]]:
    """Map topic -> partitions for every ``<topic>-<partition>`` entry in the data directory."""
    found: dict[str, set[int]] = {}
    for name in store.listdir(""):
        parsed = parse_partition_dir(name)
        if parsed is not None:
            found.setdefault(parsed[0], set()).add(parsed[1])
    return found


def load_registry(store: FileStore, now_ms: int, new_topic_id: Callable[[], str]) -> RegistryLoad:
    """Read the registry, falling back to a directory scan. Blocks on file reads.

    ``new_topic_id`` names topics recovered by the scan; ``now_ms`` is their creation time.
    A scan that finds more partitions than ``limits.partitions_per_topic_max`` for a topic
    recovers only the allowed ones (the rest are left on disk for the operator).

    Raises:
        OSError: the store failed to list or read.
    """
    problem: str | None = None
    if store.exists(REGISTRY_FILE):
        try:
            topics, next_number = decode_registry(_read_all(store, REGISTRY_FILE))
        except ValueError as exc:
            problem = f"{REGISTRY_FILE} is unreadable: {exc}"
        else:
            return RegistryLoad(types.MappingProxyType(topics), next_number, "file")
    found = scan_partition_dirs(store)
    if not found and problem is None:
        return RegistryLoad(types.MappingProxyType({}), 0, "empty")
    if problem is None:
        problem = f"{REGISTRY_FILE} is missing"
    recovered: dict[str, TopicInfo] = {}
    for topic, partitions in sorted(found.items()):
        count = min(max(partitions) + 1, limits.partitions_per_topic_max)
        recovered[topic] = TopicInfo(topic, new_topic_id(), count, 1, TopicConfig(), now_ms)
    return RegistryLoad(types.MappingProxyType(recovered), 0, "scan", problem)


def _read_all(store: FileStore, path: str) -> bytes:
    handle = store.open(path, create=False)
    try:
        return store.pread(handle, store.size(handle), 0)
    finally:
        store.close(handle)
