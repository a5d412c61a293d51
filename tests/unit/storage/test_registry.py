"""The topic registry: encoding, atomic replacement and the directory-scan fallback.

Method: round-trip registries through ``save_registry``/``load_registry`` on real files in
``tmp_path``; build damaged or missing ``topics.json`` files and data directories with awkward
names (dashes in topic names, ``-delete`` and hidden directories, non-canonical partition
numbers) and check what the fallback recovers and that it says so.
"""

from __future__ import annotations

import errno
import itertools
import json
import random
from pathlib import Path

import pytest

from rivven_broker.protocol import limits
from rivven_broker.storage.errors import InvalidTopicNameError
from rivven_broker.storage.file_store import OsFileStore
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.registry import (
    REGISTRY_FILE,
    REGISTRY_TMP_FILE,
    TopicInfo,
    decode_registry,
    encode_registry,
    load_registry,
    parse_partition_dir,
    partition_dir,
    save_registry,
    validate_topic_name,
)
from rivven_broker.storage.topic_config import TopicConfig


def _id_source():  # type: ignore[no-untyped-def]
    counter = itertools.count(1)
    return lambda: f"scan{next(counter)}"


def _topics() -> dict[str, TopicInfo]:
    return {
        "orders": TopicInfo("orders", "a" * 32, 3, 2, TopicConfig.parse({"retention.ms": "1000"}), 5),
        "my-topic-2": TopicInfo("my-topic-2", "b" * 32, 1, 1, TopicConfig(), 7),
    }


def test_encode_decode_round_trip() -> None:
    topics = _topics()
    data = encode_registry(topics, 9)
    assert decode_registry(data) == (topics, 9)
    assert encode_registry(dict(reversed(list(topics.items()))), 9) == data  # canonical bytes
    document = json.loads(data)
    assert document["topics"][1]["configs"] == {"retention.ms": "1000"}  # only explicit keys


def test_save_and_load(tmp_path: Path) -> None:
    store = OsFileStore(str(tmp_path))
    assert load_registry(store, 0, _id_source()).source == "empty"
    save_registry(store, _topics(), 4)
    loaded = load_registry(store, 0, _id_source())
    assert (loaded.source, loaded.problem, loaded.fallback) == ("file", None, False)
    assert dict(loaded.topics) == _topics() and loaded.next_topic_number == 4
    assert not (tmp_path / REGISTRY_TMP_FILE).exists()
    save_registry(store, {}, 5)
    assert dict(load_registry(store, 0, _id_source()).topics) == {}


def test_save_overwrites_a_stale_longer_tmp_file(tmp_path: Path) -> None:
    (tmp_path / REGISTRY_TMP_FILE).write_bytes(b"x" * 100_000)
    store = OsFileStore(str(tmp_path))
    save_registry(store, _topics(), 1)
    assert dict(load_registry(store, 0, _id_source()).topics) == _topics()


def test_a_crash_at_any_step_leaves_the_old_or_the_new_registry() -> None:
    old = {"old": TopicInfo("old", "c" * 32, 1, 1, TopicConfig(), 1)}
    new = _topics()
    outcomes = set()
    for target in itertools.count():
        for tear in (False, True):
            store = MemoryFileStore()
            save_registry(store, old, 1)
            calls = itertools.count()

            def fail(op: str, path: str) -> None:
                if next(calls) == target:
                    raise OSError(errno.EIO, f"injected at {op}")

            store.fault_hook = fail
            try:
                save_registry(store, new, 2)
                completed = True
            except OSError:
                completed = False
            store.fault_hook = None
            store.crash(random.Random(target), tear_last_write=tear)
            loaded = load_registry(store, 0, _id_source())
            assert loaded.source == "file"  # never missing, never torn
            assert (dict(loaded.topics), loaded.next_topic_number) in ((old, 1), (new, 2))
            if completed:
                assert loaded.next_topic_number == 2  # a save that returned is durable
            outcomes.add(loaded.next_topic_number)
        if completed:
            break
    assert outcomes == {1, 2} and target >= 5


def _make_dirs(root: Path, *names: str) -> None:
    for name in names:
        (root / name).mkdir()


def test_scan_fallback_when_registry_missing(tmp_path: Path) -> None:
    _make_dirs(
        tmp_path,
        "orders-0", "orders-2",  # partition 1 missing: count is still max + 1 = 3
        "my-topic-7-0",  # dashes (and a number) inside the name: split at the LAST dash
        "old-0.abc-delete",  # being deleted: suffix not an int
        ".hidden-0",  # hidden: ignored
        "weird-01",  # non-canonical partition number: ignored
        "noint-x",
        "nodash",
    )
    (tmp_path / "stray-file").write_bytes(b"")
    loaded = load_registry(OsFileStore(str(tmp_path)), 42, _id_source())
    assert loaded.fallback and loaded.source == "scan"
    assert loaded.problem is not None and "missing" in loaded.problem
    assert {name: info.partitions for name, info in loaded.topics.items()} == {"orders": 3, "my-topic-7": 1}
    for info in loaded.topics.values():
        assert info.config == TopicConfig() and info.replication_factor == 1 and info.created_ms == 42
    assert sorted(info.topic_id for info in loaded.topics.values()) == ["scan1", "scan2"]


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"\xff\xfe",
        b"[]",
        b'{"format": 2, "next_topic_number": 0, "topics": []}',
        b'{"format": 1, "next_topic_number": -1, "topics": []}',
        b'{"format": 1, "next_topic_number": 0, "topics": [{"name": "a"}]}',
        b'{"format": 1, "next_topic_number": 0, "topics": [{"name": "a", "topic_id": "x", '
        b'"partitions": 0, "replication_factor": 1, "configs": {}, "created_ms": 0}]}',
        b'{"format": 1, "next_topic_number": 0, "topics": [{"name": "a", "topic_id": "x", '
        b'"partitions": 1, "replication_factor": 1, "configs": {"bad.key": "1"}, "created_ms": 0}]}',
        b'{"format": 1, "next_topic_number": 0, "topics": [{"name": "a b", "topic_id": "x", '
        b'"partitions": 1, "replication_factor": 1, "configs": {}, "created_ms": 0}]}',
        b'{"format": 1, "next_topic_number": 0, "topics": [{"name": "a", "topic_id": "x", '
        b'"partitions": true, "replication_factor": 1, "configs": {}, "created_ms": 0}]}',
    ],
)
def test_scan_fallback_when_registry_unreadable(tmp_path: Path, content: bytes) -> None:
    (tmp_path / REGISTRY_FILE).write_bytes(content)
    _make_dirs(tmp_path, "t-0")
    loaded = load_registry(OsFileStore(str(tmp_path)), 0, _id_source())
    assert loaded.fallback
    assert loaded.problem is not None and "unreadable" in loaded.problem
    assert list(loaded.topics) == ["t"]


def test_unreadable_registry_and_no_dirs_is_still_reported(tmp_path: Path) -> None:
    (tmp_path / REGISTRY_FILE).write_bytes(b"garbage")
    loaded = load_registry(OsFileStore(str(tmp_path)), 0, _id_source())
    assert loaded.fallback and dict(loaded.topics) == {}


def test_duplicate_topic_in_file_is_unreadable() -> None:
    data = json.loads(encode_registry(_topics(), 1))
    data["topics"].append(data["topics"][0])
    with pytest.raises(ValueError, match="twice"):
        decode_registry(json.dumps(data).encode())


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("orders-0", ("orders", 0)),
        ("a-b-c-12", ("a-b-c", 12)),
        ("x.y_z-999", ("x.y_z", 999)),
        ("orders-", None),
        ("-0", None),
        ("orders-01", None),
        ("orders--1", ("orders-", 1)),
        ("orders-0.1f2e-delete", None),
        (".orders-0", None),
        ("topics.json", None),
        ("bad name-0", None),
    ],
)
def test_parse_partition_dir(name: str, expected: tuple[str, int] | None) -> None:
    assert parse_partition_dir(name) == expected
    if expected is not None:
        assert partition_dir(*expected) == name


@pytest.mark.parametrize("name", ["", ".hidden", "a b", "a/b", "ü", "x" * (limits.topic_name_bytes_max + 1)])
def test_invalid_topic_names(name: str) -> None:
    with pytest.raises(InvalidTopicNameError):
        validate_topic_name(name)


@pytest.mark.parametrize("name", ["a", "A-b_c.d", "x" * limits.topic_name_bytes_max, "9-9"])
def test_valid_topic_names(name: str) -> None:
    validate_topic_name(name)
