"""``poll_ready`` of the sources that have it (``datagen``, ``file``): what is ready now,
never a wait — the batch cycle gathers ready polls into one transaction."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rivven_connect.core.config import ConnectConfigError, load_config
from rivven_connect.sources import build_source
from rivven_connect.sources.datagen import DatagenSource
from rivven_connect.sources.file import FileSource


def _datagen(**options):
    settings = dict(count=None, rate=None, record_size_bytes=4, seed=0, batch_size=3)
    settings.update(options)
    source = DatagenSource(**settings)
    source.resume(None)
    return source


def _seqs(records):
    return [record.position for record in records]


def test_datagen_ready_polls_follow_the_rate_and_the_count_without_waiting():
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def main():
        paced = _datagen(rate=10.0)
        assert _seqs(await paced.poll(10)) == [0]  # the first record is due at once
        assert await paced.poll_ready(10) == []  # the next one only after 0.1 s
        start = trio.current_time()
        clock.jump(0.25)
        assert _seqs(await paced.poll_ready(10)) == [1, 2]
        assert _seqs(await paced.poll(10)) == [3]  # poll waits for its turn instead
        assert trio.current_time() - start >= 0.3
        counted = _datagen(count=5)
        assert _seqs(await counted.poll_ready(10)) == [0, 1, 2]  # at most batch_size
        assert _seqs(await counted.poll_ready(1)) == [3]  # at most what is asked
        assert _seqs(await counted.poll_ready(10)) == [4]
        assert await counted.poll_ready(10) == []  # exhausted: nothing ready ...
        assert await counted.poll(10) is None  # ... and poll says it is the end

    trio.run(main, clock=clock)


def test_file_ready_polls_take_what_the_file_holds_and_never_wait_even_with_follow(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"n": 1}\n\n{"n": 2}\n{"n": 3}\n{"n": 4')  # the last line is incomplete

    async def main():
        source = FileSource(str(path), follow=True, poll_interval_ms=60_000, batch_size=2)
        source.resume(None)
        with trio.fail_after(5):  # a wait would be the poll interval: a minute
            first = await source.poll_ready(10)
            second = await source.poll_ready(10)
            assert await source.poll_ready(10) == []
        assert [record.value["n"] for record in first + second] == [1, 2, 3]
        assert second[-1].position == source.offset == len('{"n": 1}\n\n{"n": 2}\n{"n": 3}\n')
        with path.open("a") as handle:
            handle.write("}\n")
        assert [record.value["n"] for record in await source.poll_ready(10)] == [4]

    trio.run(main)


def test_an_interval_boundary_is_refused_for_a_source_without_ready_polls():
    """``postgres-outbox-poll``'s positions name one poll's rows: gathering polls would
    commit only the last poll's, so the configuration is refused before anything runs."""
    outbox = {"connector": "postgres-outbox-poll", "topic": "t",
              "config": {"host": "127.0.0.1", "database": "shop", "user": "u"},
              "transaction": {"boundary": "interval"}}
    loaded = load_config({"sources": {"box": outbox}}, {}).sources["box"]
    with pytest.raises(ConnectConfigError) as caught:
        build_source(loaded)
    assert caught.value.path == "sources.box.transaction.boundary"
    assert "boundary: poll" in str(caught.value)
    polled = {**outbox, "transaction": {"boundary": "poll"}}
    assert not hasattr(build_source(load_config({"sources": {"box": polled}}, {}
                                                ).sources["box"]), "poll_ready")
    gen = {"connector": "datagen", "topic": "t", "transaction": {"boundary": "interval"}}
    assert hasattr(build_source(load_config({"sources": {"g": gen}}, {}).sources["g"]),
                   "poll_ready")
