"""The runtime in-process under trio against a real broker: a ``file`` source routed by a
column to three topics arrives exactly once, its position is in ``__connect_offsets``, and a
restart sends nothing again."""

from __future__ import annotations

import json

import trio

from rivven_broker.client.trio import open_admin
from rivven_connect.core.config import OFFSETS_TOPIC, load_config
from rivven_connect.driver import run_connect
from rivven_connect.sources import build_source
from tests.integration.connect.helpers import read_committed, values

LINES = 600
TOPICS = ("conn.a", "conn.b", "conn.c")


def _write_lines(path) -> None:
    with open(path, "w") as handle:
        for n in range(LINES):
            row = {"n": n, "kind": TOPICS[n % 3]}
            if n % 7 == 0:
                del row["kind"]  # no column: the default topic
            handle.write(json.dumps(row) + "\n")
            if n % 50 == 0:
                handle.write("\n")  # blank lines are skipped


def _config(path):
    return load_config({
        "broker": {"bootstrap": "127.0.0.1:1"},
        "http": "off",
        "sources": {"lines": {
            "connector": "file", "topic": "unused",
            "config": {"path": str(path), "batch_size": 64, "done_marker": True},
            "routing": {"topic_column": "kind", "default_topic": "conn.c",
                        "admission": {"mode": "allowlist", "topics": ["conn.*"]}},
        }},
    }, env={})


async def _run(config, address):
    sources = {name: build_source(source) for name, source in config.sources.items()}
    return await run_connect(config, address, sources, trio.Event(), seed=1)


async def test_file_lines_arrive_exactly_once_and_a_restart_sends_nothing(broker, tmp_path):
    path = tmp_path / "rows.jsonl"
    _write_lines(path)
    async with open_admin(broker.address) as admin:
        for topic in TOPICS:
            await admin.create_topic(topic, partitions=3)
    config = _config(path)

    first = await _run(config, broker.address)
    size = path.stat().st_size
    assert first["lines"].state == "stopped", first
    assert first["lines"].records == LINES and first["lines"].position == size

    def expected(topic):
        return sorted(n for n in range(LINES)
                      if (TOPICS[n % 3] if n % 7 else "conn.c") == topic)

    async def check_topics():
        seen = []
        for topic in TOPICS:
            rows = values(await read_committed(broker.address, topic))
            assert sorted(row["n"] for row in rows) == expected(topic), topic
            seen.extend(row["n"] for row in rows)
        assert sorted(seen) == list(range(LINES))  # every line once, nothing else

    await check_topics()
    offsets = await read_committed(broker.address, OFFSETS_TOPIC)
    assert json.loads(offsets[-1].value) == {"connector": "lines", "position": size}
    assert offsets[-1].key == b"lines"
    assert (tmp_path / "rows.jsonl.done").read_text() == f"{size}\n"

    second = await _run(config, broker.address)
    assert second["lines"].state == "stopped" and second["lines"].records == 0, second
    assert second["lines"].position == size
    await check_topics()


async def test_a_line_that_is_not_json_stops_the_source_in_error_after_what_came_before(
        broker, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"n": 0, "kind": "conn.a"}\n' * 3 + "not json\n" + '{"n": 9}\n')
    config = _config(path)
    sources = {name: build_source(source) for name, source in config.sources.items()}
    sources["lines"].batch_size = 3  # the good lines are one batch, committed first
    result = (await run_connect(config, broker.address, sources, trio.Event()))["lines"]
    assert result.state == "error" and "is not JSON" in result.error, result
    assert result.records == 3 and result.position == len('{"n": 0, "kind": "conn.a"}\n') * 3
