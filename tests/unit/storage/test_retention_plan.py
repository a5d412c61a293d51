"""``segments_past_retention``: the pure decision of which oldest segments retention deletes.

Method: stand-in segments (size and max timestamp only) checked against hand-worked answers,
and a Hypothesis property against a brute-force restatement of the rule: the answer is the
longest prefix in which every segment is expired by time or not needed for the byte limit.
"""

from __future__ import annotations

import attrs
import hypothesis.strategies as st
from hypothesis import given

from rivven_broker.storage.retention import segments_past_retention


@attrs.define
class FakeSegment:
    size: int
    max_timestamp: int


def test_no_limits_delete_nothing() -> None:
    sealed = [FakeSegment(100, 0), FakeSegment(100, 0)]
    assert segments_past_retention(sealed, 300, -1, -1, 10**9) == 0  # type: ignore[arg-type]


def test_time_deletes_the_expired_prefix_only() -> None:
    sealed = [FakeSegment(10, 100), FakeSegment(10, 500), FakeSegment(10, 200)]
    # at 1000 with 600 ms: the first is expired (900 > 600), the second is not (500): stop.
    assert segments_past_retention(sealed, 40, 600, -1, 1000) == 1  # type: ignore[arg-type]
    assert segments_past_retention(sealed, 40, 400, -1, 1000) == 3  # type: ignore[arg-type]
    assert segments_past_retention(sealed, 40, 900, -1, 1000) == 0  # type: ignore[arg-type]


def test_bytes_keep_at_least_the_limit() -> None:
    sealed = [FakeSegment(100, 0), FakeSegment(100, 0), FakeSegment(100, 0)]
    # 350 bytes in all (50 in the active segment): keeping >= 150 leaves two deletable.
    assert segments_past_retention(sealed, 350, -1, 150, 0) == 2  # type: ignore[arg-type]
    assert segments_past_retention(sealed, 350, -1, 251, 0) == 0  # type: ignore[arg-type]
    assert segments_past_retention(sealed, 350, -1, 0, 0) == 3  # type: ignore[arg-type]


@given(
    shapes=st.lists(st.tuples(st.integers(1, 100), st.integers(0, 1000)), max_size=6),
    active_bytes=st.integers(0, 100),
    retention_ms=st.integers(-1, 1000),
    retention_bytes=st.integers(-1, 700),
    now_ms=st.integers(0, 2000),
)
def test_the_longest_prefix_that_may_go(
    shapes: list[tuple[int, int]], active_bytes: int, retention_ms: int,
    retention_bytes: int, now_ms: int,
) -> None:
    sealed = [FakeSegment(size, ts) for size, ts in shapes]
    total = sum(size for size, _ in shapes) + active_bytes

    def may_go(count: int) -> bool:
        for i in range(count):
            segment = sealed[i]
            left = total - sum(s.size for s in sealed[:i])
            expired = retention_ms >= 0 and now_ms - segment.max_timestamp > retention_ms
            too_big = retention_bytes >= 0 and left - segment.size >= retention_bytes
            if not (expired or too_big):
                return False
        return True

    expected = max(count for count in range(len(sealed) + 1) if may_go(count))
    assert segments_past_retention(  # type: ignore[arg-type]
        sealed, total, retention_ms, retention_bytes, now_ms) == expected
