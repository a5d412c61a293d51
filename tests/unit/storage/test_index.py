"""The sparse offset and time indexes: byte formats, lookups, truncation and placement rules.

Method: build indexes on a MemoryFileStore, compare the file bytes with hand-packed entries,
check lookups against a brute-force search (Hypothesis), and check that decoding rejects
damaged files. The ``IndexCursor`` placement rule is checked step by step.
"""

from __future__ import annotations

import struct
from array import array

import hypothesis.strategies as st
from hypothesis import given

from rivven_broker.storage import offset_index, time_index
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.offset_index import OffsetIndex
from rivven_broker.storage.segment import IndexCursor, parse_segment_file_name, segment_file_name
from rivven_broker.storage.time_index import TimeIndex


def new_offset_index() -> tuple[MemoryFileStore, OffsetIndex]:
    store = MemoryFileStore()
    path = "00000000000000000100.index"
    return store, OffsetIndex(store, store.open(path), path)


def new_time_index() -> tuple[MemoryFileStore, TimeIndex]:
    store = MemoryFileStore()
    path = "00000000000000000100.timeindex"
    return store, TimeIndex(store, store.open(path), path)


def file_bytes(store: MemoryFileStore, handle: int) -> bytes:
    return store.pread(handle, store.size(handle), 0)


def test_offset_index_file_format_is_big_endian_u32_pairs() -> None:
    store, index = new_offset_index()
    index.append(3, 4100)
    index.append(70000, 2**32 - 1)
    index.write_pending()
    assert file_bytes(store, index.handle) == struct.pack(">IIII", 3, 4100, 70000, 2**32 - 1)
    assert index.to_bytes() == file_bytes(store, index.handle)
    decoded = offset_index.decode_entries(file_bytes(store, index.handle))
    assert decoded == (array("I", [3, 70000]), array("I", [4100, 2**32 - 1]))


def test_time_index_file_format_is_i64_then_u32() -> None:
    store, index = new_time_index()
    index.append(-5, 0)
    index.append(1_700_000_000_000, 9)
    index.write_pending()
    assert file_bytes(store, index.handle) == struct.pack(">qIqI", -5, 0, 1_700_000_000_000, 9)
    decoded = time_index.decode_entries(file_bytes(store, index.handle))
    assert decoded == (array("q", [-5, 1_700_000_000_000]), array("I", [0, 9]))


def test_decoding_rejects_damaged_files() -> None:
    assert isinstance(offset_index.decode_entries(b"\0" * 7), str)
    assert isinstance(offset_index.decode_entries(struct.pack(">IIII", 5, 10, 5, 20)), str)
    assert isinstance(offset_index.decode_entries(struct.pack(">IIII", 5, 10, 6, 10)), str)
    assert isinstance(time_index.decode_entries(b"\0" * 13), str)
    assert isinstance(time_index.decode_entries(struct.pack(">qIqI", 7, 1, 7, 2)), str)
    assert isinstance(time_index.decode_entries(struct.pack(">qIqI", 7, 2, 8, 2)), str)
    assert offset_index.decode_entries(b"") == (array("I"), array("I"))


@given(st.lists(st.integers(1, 50), min_size=0, max_size=40), st.integers(0, 2500))
def test_offset_lookup_is_the_last_entry_at_or_below(gaps: list[int], target: int) -> None:
    _, index = new_offset_index()
    relative = position = 0
    entries = []
    for gap in gaps:
        relative += gap
        position += gap * 7
        index.append(relative, position)
        entries.append((relative, position))
    below = [p for r, p in entries if r <= target]
    assert index.lookup(target) == (below[-1] if below else 0)


@given(st.lists(st.integers(1, 50), min_size=0, max_size=40), st.integers(-10, 2500))
def test_time_lookup_is_the_last_entry_strictly_below(gaps: list[int], target: int) -> None:
    _, index = new_time_index()
    timestamp = relative = 0
    entries = []
    for gap in gaps:
        timestamp += gap
        relative += 1
        index.append(timestamp, relative)
        entries.append((timestamp, relative))
    below = [r for t, r in entries if t < target]
    assert index.lookup(target) == (below[-1] if below else None)


def test_truncation_shortens_memory_and_file() -> None:
    store, index = new_offset_index()
    for i in range(1, 6):
        index.append(i * 10, i * 100)
    index.write_pending()
    index.truncate_at_position(300)
    assert list(index.positions) == [100, 200]
    assert file_bytes(store, index.handle) == index.to_bytes()
    store2, times = new_time_index()
    for i in range(1, 6):
        times.append(i * 1000, i * 10)
    times.write_pending()
    times.truncate_at_offset(31)
    assert list(times.relative_offsets) == [10, 20, 30]
    assert file_bytes(store2, times.handle) == times.to_bytes()


def test_appended_entries_are_buffered_found_and_written_in_one_write() -> None:
    store, index = new_offset_index()
    index.append(1, 100)
    index.write_pending()
    for i in range(2, 6):
        index.append(i * 10, i * 100)
    assert file_bytes(store, index.handle) == struct.pack(">II", 1, 100)  # not yet written
    assert index.lookup(35) == 300 and index.last() == (50, 500)  # memory answers anyway
    index.truncate_at_position(400)  # only pending entries go: the file is untouched
    assert file_bytes(store, index.handle) == struct.pack(">II", 1, 100)
    index.write_pending()
    assert file_bytes(store, index.handle) == index.to_bytes()
    assert list(index.positions) == [100, 200, 300] and index.written == 3
    _, times = new_time_index()
    times.append(7, 1)
    times.write_pending()
    times.append(9, 2)
    times.truncate_at_offset(1)  # cuts into the written prefix: the file shrinks too
    assert times.written == 0 and len(times) == 0
    times.append(8, 3)
    times.write_pending()
    assert file_bytes(times.store, times.handle) == struct.pack(">qI", 8, 3)


def test_rewrite_replaces_the_file() -> None:
    store, index = new_offset_index()
    index.append(1, 10)
    index.append(2, 20)
    index.rewrite(array("I", [5]), array("I", [50]))
    assert file_bytes(store, index.handle) == struct.pack(">II", 5, 50)
    assert index.last() == (5, 50)


def test_cursor_places_entries_every_interval_and_time_entries_on_growth() -> None:
    cursor = IndexCursor(interval_bytes=100)
    steps = [
        # position, relative offset, size, max timestamp -> expected (offset entry, time entry)
        ((0, 0, 60, 50), (None, None)),
        ((60, 1, 60, 40), (None, None)),  # 60 bytes since the last entry: no entry yet
        ((120, 2, 60, 45), ((2, 120), (50, 0))),  # 120 >= 100: entry; max 50 reached at 0
        ((180, 3, 60, 30), (None, None)),
        ((240, 4, 60, 20), ((4, 240), None)),  # max did not grow: no time entry
        ((300, 5, 60, 90), (None, None)),
        ((360, 6, 60, 10), ((6, 360), (90, 5))),  # the time entry names the first batch at 90
    ]
    for arguments, expected in steps:
        assert cursor.step(*arguments) == expected, arguments
    assert cursor.max_timestamp == 90 and cursor.relative_offset_of_max == 5


def test_segment_file_names_are_twenty_digits() -> None:
    assert segment_file_name(1234, ".log") == "00000000000000001234.log"
    assert parse_segment_file_name("00000000000000001234.timeindex") == (1234, ".timeindex")
    for other in ("1234.log", "00000000000000001234.log.cleaned", "recovery-point.checkpoint",
                  "0000000000000000123x.log", "00000000000000001234.index.tmp"):
        assert parse_segment_file_name(other) is None, other
