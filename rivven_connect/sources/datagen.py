"""``datagen``: a deterministic generator of test records (load tests, demos, the tests).

Record ``n`` (from 0) has value ``{"seq": n, "payload": <record_size_bytes hex chars>}``; the
payload (hex of SHAKE-128 of ``"seed:n"``) is a function of ``(seed, n)`` only, so a replay after a restart is byte-identical.
Its position is ``n``. ``count`` records in all (``null``: unlimited), at most ``rate``
records per second (``null``: as fast as the producer takes them). No side effect.

With ``topics`` (a list of topic names) record ``n``'s value also has ``"topic":
topics[n mod len(topics)]``, for spreading records over destinations with ``routing:
{topic_column: topic}`` (the routing tests and ``rivven bench connect``).

Options: ``count`` (null), ``rate`` (null, records/s), ``record_size_bytes`` (16),
``seed`` (0), ``batch_size`` (500), ``topics`` (null; at most 10 000).
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import trio

from rivven_connect.core.records import Record

__all__ = ["DatagenSource"]

record_size_bytes_max = 1 << 20
topics_max = 10_000
rate_max = 1_000_000.0


class DatagenSource:
    def __init__(self, *, count: int | None, rate: float | None, record_size_bytes: int,
                 seed: int, batch_size: int, topics: tuple[str, ...] = ()) -> None:
        assert count is None or count >= 0
        assert rate is None or rate > 0
        self.count, self.rate, self.seed = count, rate, seed
        self.record_size_bytes, self.batch_size = record_size_bytes, batch_size
        self.topics = topics
        self.next_seq = 0
        self._started_s: float | None = None
        self._first_seq = 0

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], path: str) -> DatagenSource:
        from rivven_connect.core.config import ConnectConfigError
        from rivven_connect.sources import Options

        options = Options(raw, path, ("count", "rate", "record_size_bytes", "seed", "batch_size",
                                      "topics"))
        topics = raw.get("topics") or []
        if not isinstance(topics, list) or len(topics) > topics_max or not all(
                isinstance(topic, str) and topic for topic in topics):
            raise ConnectConfigError(f"{path}.topics", f"must be a list of at most {topics_max} "
                                                       f"topic names, not {topics!r}")
        return cls(count=options.int("count", None, 0, 1 << 62),
                   rate=options.number("rate", 0.001, rate_max),
                   record_size_bytes=options.int("record_size_bytes", 16, 0,
                                                 record_size_bytes_max) or 0,
                   seed=options.int("seed", 0, -(1 << 62), 1 << 62) or 0,
                   batch_size=options.batch_size(), topics=tuple(topics))

    def resume(self, position: Any) -> None:
        self.next_seq = 0 if position is None else int(position) + 1
        self._first_seq = self.next_seq

    def record(self, seq: int) -> Record:
        """Record ``seq``: the same for the same seed, always."""
        # SHAKE-128 of (seed, seq): ~1 us, where seeding a random.Random per record took
        # ~15 us (a fifth of the runtime's CPU per record in ``rivven bench connect``)
        size = self.record_size_bytes
        payload = hashlib.shake_128(b"%d:%d" % (self.seed, seq)).hexdigest((size + 1) // 2)[:size]
        value = {"seq": seq, "payload": payload}
        if self.topics:
            value["topic"] = self.topics[seq % len(self.topics)]
        return Record(value=value, key=str(seq), position=seq)

    async def poll(self, max_records: int) -> list[Record] | None:
        """Up to ``min(max_records, batch_size)`` records; waits for the rate. A checkpoint."""
        if self.count is not None and self.next_seq >= self.count:
            await trio.lowlevel.checkpoint()
            return None
        if self.rate is not None and self._allowed(trio.current_time()) <= self.next_seq:
            assert self._started_s is not None  # the next record's turn:
            await trio.sleep_until(self._started_s + (self.next_seq - self._first_seq) / self.rate)
        await trio.lowlevel.checkpoint()
        return self._take(max(1, self._due(max_records)))

    async def poll_ready(self, max_records: int) -> list[Record]:
        """What ``poll`` would return now without waiting for the rate: maybe nothing (also
        once ``count`` is reached; the next ``poll`` then says so). A checkpoint."""
        await trio.lowlevel.checkpoint()
        return self._take(self._due(max_records))

    def _due(self, max_records: int) -> int:
        """How many records may be generated now (up to the batch size)."""
        wanted = min(max_records, self.batch_size)
        if self.count is not None:
            wanted = min(wanted, self.count - self.next_seq)
        if self.rate is not None:
            wanted = min(wanted, self._allowed(trio.current_time()) - self.next_seq)
        return max(0, wanted)

    def _allowed(self, now_s: float) -> int:
        """The sequence number after the last record the rate allows at ``now_s`` (the rate
        is counted from the first call)."""
        assert self.rate is not None
        if self._started_s is None:
            self._started_s = now_s
        return self._first_seq + int((now_s - self._started_s) * self.rate) + 1

    def _take(self, count: int) -> list[Record]:
        records = [self.record(seq) for seq in range(self.next_seq, self.next_seq + count)]
        self.next_seq += count
        return records

    async def side_effect(self, position: Any) -> None:
        await trio.lowlevel.checkpoint()

    def position_key(self, position: Any) -> Any:
        return position

    def close(self) -> None:
        pass
