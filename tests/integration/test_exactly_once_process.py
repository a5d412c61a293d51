"""``kill -9`` of the real broker mid-transaction and after a commit decision.

Goal: a crash never breaks all-or-nothing. Method: the ``rivven-broker`` executable as a
subprocess (``broker_process``) with ``--transaction-marker-delay-ms`` set far out, so that a
committed transaction's decision is durable in ``__transaction_state`` but none of its
markers is written when the process is killed. Two transactions are in flight at the kill:
``mid`` wrote records and never ended; ``decided`` was committed (``commit_transaction``
returned). After a restart on the same data (without the delay) ``decided`` must be completed
from its durable decision, and ``mid`` must end aborted once a new instance of its producer
fences the old one. The blocking clients, and the CLI's ``consume --isolation``, read
everything back under both isolation levels.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from rivven_broker.client import Admin, Consumer, Producer, TopicPartition
from tests.integration.test_cli_roundtrip import rivven_command

pytestmark = pytest.mark.slow

_PARTITIONS = 2


def read(bootstrap: str, isolation: str, timeout_s: float = 30.0) -> list[bytes]:
    """Every value of topic ``t`` up to the end offsets of ``isolation`` (LSO or HWM)."""
    tps = [TopicPartition("t", p) for p in range(_PARTITIONS)]
    values: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation) as c:
        c.assign(tps)
        ends = c.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        for tp in tps:
            while c.position(tp) < ends[tp]:
                assert time.monotonic() < deadline, f"{tp} stuck before {ends[tp]}"
                values += [r.value for r in c.poll(timeout_ms=200, max_records=10_000)]
    return values


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_kill_9_mid_transaction_and_after_the_commit_decision(broker_process):
    first = broker_process("--transaction-marker-delay-ms", "600000")
    with Admin(first.address) as admin:
        admin.create_topic("t", partitions=_PARTITIONS)
    mid = Producer(first.address, transactional_id="mid", max_block_ms=10_000)
    mid.init_transactions()
    mid.begin_transaction()
    for i in range(100):
        mid.send("t", value=b"mid-%d" % i, partition=i % _PARTITIONS)
    mid.flush()
    decided = Producer(first.address, transactional_id="decided", max_block_ms=10_000)
    decided.init_transactions()
    decided.begin_transaction()
    for i in range(100):
        decided.send("t", value=b"decided-%d" % i, partition=i % _PARTITIONS)
    decided.commit_transaction()  # the decision is durable; its markers wait (the delay)
    assert read(first.address, "read_committed") == []  # nothing is stable yet
    assert len(read(first.address, "read_uncommitted")) == 200
    assert first.kill() != 0
    mid.close(timeout=1)
    decided.close(timeout=1)

    second = broker_process(data_dir=first.data_dir)
    # The in-doubt commit is completed from the logged decision: all 100 records, at once.
    successor = Producer(second.address, transactional_id="mid", max_block_ms=20_000)
    successor.init_transactions()  # fences the old "mid" and aborts what it left open
    successor.begin_transaction()
    for i in range(50):
        successor.send("t", value=b"after-%d" % i, partition=i % _PARTITIONS)
    successor.commit_transaction()
    successor.close()

    def all_visible() -> bool:
        return len(read(second.address, "read_committed")) == 150

    wait_for(all_visible)
    committed = read(second.address, "read_committed")
    assert sorted(committed) == sorted(
        [b"decided-%d" % i for i in range(100)] + [b"after-%d" % i for i in range(50)]
    )
    everything = read(second.address, "read_uncommitted")
    assert sum(v.startswith(b"mid-") for v in everything) == 100  # written, never visible
    assert second.terminate() == 0

    # And once more after a clean restart: the outcome is stable, and the CLI agrees.
    third = broker_process(data_dir=first.data_dir)
    assert sorted(read(third.address, "read_committed")) == sorted(committed)
    for isolation, count in (("read_committed", 150), ("read_uncommitted", 250)):
        done = subprocess.run(
            [*rivven_command(), "--bootstrap", third.address, "--json", "consume", "t",
             "--from-beginning", "--isolation", isolation],
            capture_output=True, timeout=60, check=True,
        )
        lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
        assert len(lines) == count, (isolation, len(lines))
