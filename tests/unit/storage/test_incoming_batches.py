"""``check_batches`` and ``place_batches``: a request's batches checked whole, then stamped.

Method: requests built from the storage tests' batch factory, checked directly (no log, no
store); placed batches are compared byte for byte with what the log must store for them.
"""

from __future__ import annotations

import pytest

from rivven_broker.records.header import CorruptBatchError, InvalidBatchError
from rivven_broker.storage.errors import RecordTooLargeError
from rivven_broker.storage.incoming_batches import check_batches, place_batches
from tests.unit.storage.log_batches import make_batch, stored


def test_every_batch_is_found_with_its_size_total_and_span() -> None:
    first, second = make_batch(3, b"abc", max_timestamp=7), make_batch(2, b"xy" * 10)
    view, batches, total, span = check_batches(first + second, 10_000)
    assert [(position, size) for position, size, _ in batches] == [
        (0, len(first)), (len(first), len(second))]
    assert [header.max_timestamp for _, _, header in batches] == [7, 0]
    assert (total, span) == (len(first) + len(second), 5)
    assert bytes(view) == first + second


def test_a_view_of_another_shape_is_read_as_flat_bytes() -> None:
    batch = make_batch(1, b"1234567" if len(make_batch(1)) % 2 else b"12345678")
    assert len(batch) % 2 == 0
    rows = memoryview(batch).cast("B", (2, len(batch) // 2))  # two-dimensional
    view, batches, total, _ = check_batches(rows, 10_000)
    assert view.ndim == 1 and view.format == "B" and bytes(view) == batch
    assert len(batches) == 1 and total == len(batch)


@pytest.mark.parametrize("request_bytes, error", [
    (b"", InvalidBatchError),  # no batch at all
    (make_batch(1) + b"\x00" * 5, InvalidBatchError),  # trailing bytes
    (make_batch(1, b"abc")[:-1], InvalidBatchError),  # runs past the end
])
def test_a_malformed_request_is_refused(request_bytes: bytes, error: type) -> None:
    with pytest.raises(error):
        check_batches(request_bytes, 10_000)


def test_one_damaged_batch_refuses_the_whole_request() -> None:
    damaged = bytearray(make_batch(2, b"payload"))
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptBatchError):
        check_batches(make_batch(1) + bytes(damaged), 10_000)


def test_a_batch_over_max_message_bytes_is_too_large() -> None:
    batch = make_batch(1, b"x" * 100)
    check_batches(batch, len(batch))
    with pytest.raises(RecordTooLargeError):
        check_batches(batch, len(batch) - 1)


def test_placed_batches_are_what_the_log_stores() -> None:
    first, second = make_batch(3, b"abc", max_timestamp=9), make_batch(2, b"de")
    view, batches, _, _ = check_batches(first + second, 10_000)
    parts: list[bytes | memoryview] = []
    placed: list[tuple[int, int, int]] = []
    assert place_batches(view, batches, 40, 6, parts, placed) == 45
    assert b"".join(bytes(part) for part in parts) == stored(first, 40, 6) + stored(second, 43, 6)
    assert placed == [(40, len(first), 9), (43, len(second), 0)]
