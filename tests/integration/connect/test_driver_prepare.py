"""The driver prepares a source's next poll while a batch commits (``prepare_poll``): against
a real broker, a source that builds its next batch ahead sees the preparation only between
its poll and that batch's side effect, never beside a side effect; what it prepared is not
in the topic (not even uncommitted) before the batch holding it is polled; and every record
arrives once, in order."""

from __future__ import annotations

import trio

from rivven_broker.client.trio import open_admin
from rivven_connect.core.config import load_config
from rivven_connect.core.records import Record
from rivven_connect.driver import run_connect
from tests.integration.connect.helpers import read_committed, values

TOTAL = 60
BATCH = 10
TOPIC = "prepare.out"


class PreparingSource:
    """Counts 0..TOTAL-1 in batches of BATCH; ``prepare_poll`` builds the next batch ahead
    (slowly: a commit that ends first must be waited for)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.next = 0
        self.prepared: list[Record] | None = None
        self.preparing = False
        self.log: list[tuple[str, int]] = []
        #: Per side effect: the largest n in the topic, read uncommitted, and its position.
        self.seen_at_side_effect: list[tuple[int, int]] = []

    def resume(self, position):
        self.next = 0 if position is None else position + 1

    def _batch(self) -> list[Record]:
        numbers = range(self.next, min(TOTAL, self.next + BATCH))
        self.next += len(numbers)
        return [Record({"n": n}, key=n, position=n) for n in numbers]

    async def poll(self, max_records):
        if self.prepared is not None:
            batch, self.prepared = self.prepared, None
            self.log.append(("poll_prepared", len(batch)))
        else:
            await trio.lowlevel.checkpoint()
            batch = self._batch()
            self.log.append(("poll", len(batch)))
        return batch or None  # (exhausted: the runtime stops)

    async def prepare_poll(self, max_records):
        assert max_records >= BATCH
        self.preparing = True
        self.log.append(("prepare", self.next))
        await trio.sleep(0.05)  # longer than a commit: the driver must wait for it
        self.prepared = self._batch()
        self.preparing = False

    async def side_effect(self, position):
        assert not self.preparing, "a side effect ran beside a preparation"
        self.log.append(("side_effect", position))
        rows = values(await read_committed(self.bootstrap, TOPIC, "read_uncommitted"))
        self.seen_at_side_effect.append((max(row["n"] for row in rows), position))

    def position_key(self, position):
        return position

    def close(self):
        pass


async def test_the_next_poll_is_prepared_while_the_batch_commits_and_sent_only_after(broker):
    config = load_config({"http": "off", "sources": {"counted": {
        "connector": "datagen", "topic": TOPIC}}}, env={})
    async with open_admin(broker.address) as admin:
        await admin.create_topic(TOPIC, partitions=1)
    source = PreparingSource(broker.address)
    with trio.fail_after(60):
        results = await run_connect(config, broker.address, {"counted": source}, trio.Event())
    assert results["counted"].state == "stopped", results
    assert [row["n"] for row in values(await read_committed(broker.address, TOPIC))] == \
        list(range(TOTAL))
    kinds = [kind for kind, _ in source.log]
    # The first batch is polled; every later one was prepared during the commit before it.
    assert kinds[:3] == ["poll", "prepare", "side_effect"]
    assert kinds.count("poll_prepared") == TOTAL // BATCH
    for before, after in zip(kinds, kinds[1:]):
        if after == "prepare":  # only ever while a polled batch commits
            assert before in ("poll", "poll_prepared"), source.log
    # Nothing prepared reached the topic before its own batch was polled and committed.
    assert all(largest == position for largest, position in source.seen_at_side_effect)
