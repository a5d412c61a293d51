"""Cluster metadata with real ``rivven-broker`` processes on loopback (issue 18).

Method: brokers started with ``--peers`` (ports free for both UDP and TCP picked first) form a
cluster whose metadata is a Raft log. A topic with replication factor 3 created through one
broker shows the same assignment from every broker; with racks a, a, b, b and replication
factor 2 every partition has one replica per rack and every broker leads a partition; the
Raft leader (the Metadata answer's controller) killed with SIGKILL is replaced, admin calls
keep working, and it comes back caught up (``/health`` ready). Waits poll with a bound.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import pytest

from rivven_broker.client import Admin, TopicPartition
from rivven_broker.storage.checkpoint import read_checkpoint
from rivven_broker.storage.file_store import OsFileStore
from tests.integration.cluster_ports import free_cluster_ports
from rivven_broker.client.errors import RivvenError

_BOUND_S = 30


def _wait(predicate, what: str):
    deadline = time.monotonic() + _BOUND_S
    while True:
        try:
            value = predicate()
        except (RivvenError, OSError):
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {_BOUND_S} s: {what}"
        time.sleep(0.1)


def _ready(process) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{process.http_port}/health") as answer:
            return json.loads(answer.read())["ready"]
    except urllib.error.HTTPError:
        return False


def _cluster(broker_process, tmp_path, racks: list[str]):
    ports = free_cluster_ports(len(racks))
    key = tmp_path / "cluster.key"
    key.write_text("a-test-cluster-key-0123456789abcdef\n")
    os.chmod(key, 0o600)

    def start(node: int, data_dir=None):
        peers = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(ports)
                         if i + 1 != node)
        return broker_process(
            "--node-id", str(node), "--peers", peers, "--rack", racks[node - 1],
            "--cluster-listen", f"127.0.0.1:{ports[node - 1]}", "--cluster-key-file", str(key),
            "--sync-policy", "none", data_dir=data_dir or tmp_path / f"n{node}")

    processes = {node: start(node) for node in range(1, len(racks) + 1)}
    for process in processes.values():
        _wait(lambda p=process: _ready(p), "every broker ready")
        _wait(lambda p=process: _live(p) == len(racks), "every broker sees every broker live")
    return processes, start


def _live(process) -> int:
    with Admin(process.address) as admin:
        return len(admin.cluster_status().brokers)


def _assignment(process, topic: str) -> dict[int, tuple[int, ...]] | None:
    with Admin(process.address) as admin:
        info = admin.describe_topic(topic).partition_info
    return {p.partition: p.replicas for p in info}


def _leaders(process, topic: str) -> dict[int, int | None]:
    with Admin(process.address) as admin:
        return {p.partition: p.leader for p in admin.describe_topic(topic).partition_info}


@pytest.mark.slow
def test_a_topic_created_anywhere_is_the_same_everywhere_and_survives_the_leader(
        broker_process, tmp_path):
    processes, start = _cluster(broker_process, tmp_path, ["a", "b", "c"])
    with Admin(processes[2].address) as admin:
        admin.create_topic("orders", partitions=6, replication_factor=3)
    expected = _wait(lambda: _assignment(processes[1], "orders"), "the topic on broker 1")
    assert all(sorted(replicas) == [1, 2, 3] for replicas in expected.values())
    for process in processes.values():
        assert _wait(lambda p=process: _assignment(p, "orders") == expected, "same assignment")

    with Admin(processes[1].address) as admin:
        controller = _wait(lambda: admin.cluster_status().controller_id, "a controller")
    processes[controller].kill()
    survivor = processes[1 if controller != 1 else 2]
    with Admin(survivor.address) as admin:
        _wait(lambda: admin.cluster_status().controller_id not in (None, controller),
              "a new controller")
        admin.create_topic("after", partitions=2, replication_factor=2)
        admin.alter_topic_config("orders", {"retention.ms": "3600000"})
    processes[controller] = start(controller, tmp_path / f"n{controller}")
    _wait(lambda: _ready(processes[controller]), "the restarted broker ready")
    _wait(lambda: _assignment(processes[controller], "after") is not None, "caught up")
    with Admin(processes[controller].address) as admin:
        configs = admin.describe_topic("orders").configs
    assert configs["retention.ms"].value == "3600000"


@pytest.mark.slow
def test_two_racks_of_two_spread_every_partition_and_share_leadership(broker_process, tmp_path):
    processes, _ = _cluster(broker_process, tmp_path, ["a", "a", "b", "b"])
    with Admin(processes[3].address) as admin:
        admin.create_topic("spread", partitions=8, replication_factor=2)
    rack = {1: "a", 2: "a", 3: "b", 4: "b"}
    assignment = _wait(lambda: _assignment(processes[1], "spread"), "the topic")
    assert all({rack[r] for r in replicas} == {"a", "b"} for replicas in assignment.values())
    leaders = _wait(lambda: _leaders(processes[4], "spread"), "leaders")
    assert set(leaders.values()) == {1, 2, 3, 4}


@pytest.mark.slow
def test_a_replication_factor_above_the_live_brokers_is_refused(broker_process, tmp_path):
    processes, _ = _cluster(broker_process, tmp_path, ["a", "b", "c"])
    with Admin(processes[1].address) as admin:
        with pytest.raises(RivvenError, match="replication factor 4") as caught:
            admin.create_topic("too-wide", partitions=1, replication_factor=4)
    assert caught.value.code == "INVALID_REPLICATION_FACTOR"


@pytest.mark.slow
def test_cluster_status_shows_the_raft_view(broker_process, tmp_path, capsys):
    from rivven_broker.cli.rivven_main import main as rivven
    processes, _ = _cluster(broker_process, tmp_path, ["a", "b", "c"])
    with Admin(processes[1].address) as admin:
        leader = _wait(lambda: admin.cluster_status().raft.leader, "a Raft leader")
    capsys.readouterr()
    assert rivven(["--bootstrap", processes[leader].address, "--json", "cluster", "status"]) == 0
    raft = json.loads(capsys.readouterr().out)["raft"]
    assert raft["role"] == "leader" and raft["leader"] == leader and raft["term"] >= 1
    assert raft["commit_index"] >= 4  # three registrations after the first no-op
    assert sorted(v["node_id"] for v in raft["voters"]) == [1, 2, 3]
    assert all(v["connected"] for v in raft["voters"])
    followers = [v for v in raft["voters"] if v["node_id"] != leader]
    assert all(v["match_index"] >= 1 for v in followers)


@pytest.mark.slow
def test_a_broker_started_later_follows_without_voting_and_takes_replicas(
        broker_process, tmp_path, capsys):
    from rivven_broker.cli.rivven_main import main as rivven
    processes, start = _cluster(broker_process, tmp_path, ["a", "b", "c"])
    key = tmp_path / "cluster.key"
    (port,) = free_cluster_ports(1)
    voters = {}
    with Admin(processes[1].address) as admin:  # the voters' cluster addresses
        voters = {m.node_id: m.cluster_port for m in admin.cluster_status().members}
    peers = ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(voters.items()))
    late = broker_process(
        "--node-id", "4", "--peers", peers, "--rack", "d", "--cluster-listen",
        f"127.0.0.1:{port}", "--cluster-key-file", str(key), "--sync-policy", "none",
        data_dir=tmp_path / "n4")
    _wait(lambda: _ready(late), "the late broker ready")
    capsys.readouterr()
    assert rivven(["--bootstrap", late.address, "--json", "cluster", "status"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["raft"]["role"] == "observer"
    assert sorted(v["node_id"] for v in status["raft"]["voters"]) == [1, 2, 3]
    _wait(lambda: _live(processes[1]) == 4, "four live brokers")
    with Admin(processes[2].address) as admin:
        admin.create_topic("wide", partitions=4, replication_factor=4)
    assignment = _wait(lambda: _assignment(late, "wide"), "the new topic on the late broker")
    assert all(sorted(replicas) == [1, 2, 3, 4] for replicas in assignment.values())
    with Admin(processes[1].address) as admin:  # the voters did not change
        assert sorted(v.node_id for v in admin.cluster_status().raft.voters) == [1, 2, 3]


@pytest.mark.slow
def test_only_the_leader_appends_and_clients_follow_leaders(broker_process, tmp_path,
                                                           connect_blocking):
    from rivven_broker.client import Consumer, Producer
    from rivven_broker.protocol.errors import ErrorCode
    from tests.integration.test_broker_process import batch, produce
    processes, _ = _cluster(broker_process, tmp_path, ["a", "b", "c"])
    with Admin(processes[1].address) as admin:
        admin.create_topic("led", partitions=6, replication_factor=1)
    leaders = _wait(lambda: _leaders(processes[1], "led"), "leaders")
    partition = next(p for p, leader in leaders.items() if leader != 1)
    raw = connect_blocking(processes[1].port)  # a broker that does not lead the partition
    answer = raw.call(produce("led", partition, batch(b"x")))
    assert answer.topics[0].partitions[0].error_code == ErrorCode.NOT_LEADER
    with Producer(processes[1].address) as producer:  # the client goes to each leader
        for p in range(6):
            producer.send("led", value=b"v%d" % p, partition=p).result(timeout=30)
    with Consumer(processes[1].address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("led", p) for p in range(6)])
        seen: list = []
        deadline = time.monotonic() + _BOUND_S
        while len(seen) < 6 and time.monotonic() < deadline:
            seen += consumer.poll(timeout_ms=500)
    assert sorted(r.value for r in seen) == [b"v%d" % p for p in range(6)]
    leader = leaders[partition]
    with urllib.request.urlopen(f"http://127.0.0.1:{processes[leader].http_port}/metrics") as m:
        text = m.read().decode()
    assert "rivven_controller_term" in text and "rivven_controller_link_faults" in text


@pytest.mark.slow
def test_a_deleted_topic_stays_deleted_on_a_broker_killed_and_restarted(broker_process, tmp_path):
    """The reconciled floor with real processes: a broker that deleted a topic's logs is
    SIGKILLed and restarted; it never brings the topic back (its floor, written before the
    deletion, holds its reconciliation until its log has the deletion again)."""
    processes, start = _cluster(broker_process, tmp_path, ["a", "b", "c"])
    with Admin(processes[1].address) as admin:
        admin.create_topic("gone", partitions=2, replication_factor=3)
    _wait(lambda: (tmp_path / "n3" / "gone-0").exists(), "the topic's logs on broker 3")
    with Admin(processes[1].address) as admin:
        admin.delete_topic("gone")
    _wait(lambda: not (tmp_path / "n3" / "gone-0").exists(), "the logs deleted on broker 3")
    floor = read_checkpoint(OsFileStore(str(tmp_path / "n3")), ".controller",
                            "reconciled.checkpoint")
    assert floor is not None and floor > 0
    processes[3].kill()
    processes[3] = start(3, tmp_path / "n3")
    _wait(lambda: _ready(processes[3]), "the restarted broker ready")
    assert not (tmp_path / "n3" / "gone-0").exists()
    assert read_checkpoint(OsFileStore(str(tmp_path / "n3")), ".controller",
                           "reconciled.checkpoint") >= floor
    with Admin(processes[3].address) as admin:
        assert "gone" not in [listing.name for listing in admin.list_topics()]
