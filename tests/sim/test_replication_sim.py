"""Replication in the simulator: the data checkers catch replication bugs.

Method: the shipped ``replication-*`` scenarios run in ``test_scenarios``' sweep (and must
pass). Here the aggressive one (``replication-nemesis``: a broker loses power every 1-3 s,
acks=all at min.insync.replicas 1) runs with each deliberate replication bug of the
simulator's ``[test] replication_bug`` switch — the high watermark advanced before the
followers have the data, followers truncating to the high watermark instead of by epoch, a
leader elected outside the ISR — and must be reported as lost acknowledged writes within 20
seeds (they are caught at seeds 2, 2 and 3 today).
"""

from __future__ import annotations

import pathlib

import pytest

from sim.scenario import REPLICATION_BUGS, loads
from tests.sim.pool import first_caught

SCENARIO = pathlib.Path(__file__).resolve().parents[2] / "sim" / "scenarios" / \
    "replication-nemesis.toml"


@pytest.mark.slow
@pytest.mark.parametrize("bug", [b for b in REPLICATION_BUGS if b != "coordinator_skips_load"])
def test_each_replication_bug_is_caught_within_20_seeds(bug: str) -> None:
    text = SCENARIO.read_text().replace("[checks]", f'[test]\nreplication_bug = "{bug}"\n\n[checks]')
    caught = first_caught(loads(text.encode(), name=f"bite-{bug}"), range(1, 21))
    assert caught is not None, f"{bug} was not caught in 20 seeds"
    assert "no_lost_acked_writes" in caught[1], caught
