"""Large values in the simulator: replica answers of 64 KiB and more take the view path.

Method: the padding the workload puts on values (``value_bytes``) must come back as the id,
and any damaged filler byte must turn the value into one nobody sent (which the checkers
report). ``cluster-large-values`` then runs with every ``LinkReader.feed`` counted: the run
passes its checkers and the replica links handed out frames as views
(``link_frame.VIEW_BYTES_MIN``) — the copy-once path the follower appends from runs under
crashes, a partition and a controller crash, not only in the integration test — and
segments took appends of ``segment.PREALLOCATE_APPEND_BYTES_MAX`` or more, which grow the
file without zeros ahead (recovery then meets segment tails with and without them).
"""

from __future__ import annotations

import pathlib

import pytest

from rivven_broker.storage import segment
from rivven_cluster import link_frame
from sim.scenario import ScenarioError, load, loads
from sim.workload import padded_value, read_value
from sim.world import run_scenario

SCENARIO = pathlib.Path(__file__).resolve().parents[2] / "sim" / "scenarios" / \
    "cluster-large-values.toml"


@pytest.mark.parametrize("size", [0, 3, 5, 6, 7, 100, 16384])
def test_a_padded_value_reads_back_as_its_id(size: int) -> None:
    data = padded_value("p1-17", size)
    assert len(data) == max(size, len("p1-17"))
    assert read_value(data) == "p1-17"
    assert read_value(None) is None


def test_a_damaged_filler_is_a_value_nobody_sent() -> None:
    data = bytearray(padded_value("p2-5", 1000))
    data[700] ^= 1
    assert read_value(bytes(data)) not in ("p2-5", None)
    assert read_value(bytes(data[:-1])) != "p2-5"  # a cut value too


def test_values_too_large_for_one_send_are_refused() -> None:
    base = load(str(SCENARIO))
    assert base.producers[0].value_bytes == 32768
    text = SCENARIO.read_text().replace("value_bytes = 32768", "value_bytes = 200000", 1)
    with pytest.raises(ScenarioError, match="value_bytes"):
        loads(text.encode(), "too-large")


def test_large_values_take_the_replica_link_s_view_path_under_faults(monkeypatch) -> None:
    counts = {"views": 0, "frames": 0, "large appends": 0}
    feed = link_frame.LinkReader.feed
    append = segment.Segment.append

    def counting_append(self, parts, batches, next_offset, **preallocation):
        if sum(size for _, size, _ in batches) >= segment.PREALLOCATE_APPEND_BYTES_MAX:
            counts["large appends"] += 1
        return append(self, parts, batches, next_offset, **preallocation)

    def counting_feed(self, data):
        payloads = feed(self, data)
        counts["frames"] += len(payloads)
        counts["views"] += sum(isinstance(p, memoryview) for p in payloads)
        return payloads

    monkeypatch.setattr(link_frame.LinkReader, "feed", counting_feed)
    monkeypatch.setattr(segment.Segment, "append", counting_append)
    result = run_scenario(load(str(SCENARIO)), 1)
    assert result.ok, "\n".join(f"{v.invariant}: {v.message}" for v in result.violations)
    assert result.stats["faults"] >= 4
    assert result.stats.get("send.ok", 0) > 200
    assert counts["views"] >= 20, counts
    assert counts["large appends"] >= 10, counts
