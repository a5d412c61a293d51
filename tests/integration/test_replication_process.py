"""Replication with real ``rivven-broker`` processes on loopback (issue 19).

Method: three brokers (``--peers``, ``sync_policy=always``) and a topic with replication factor
3 and ``min.insync.replicas=2``. A producer with ``acks=all`` sends numbered records while the
leader of partition 0 is killed with SIGKILL; production goes on (the client follows the new
leader), the partition's leader epoch grows, and every acknowledged record is read back exactly
once. The killed broker restarts on its data directory, catches up and is back in every ISR.
Then: each replica's log agrees record for record below the high watermark (read from every
broker after moving leadership is not possible from a client, so the checker compares the
consumer's view with the acknowledgements, and the metadata's ISR with the replicas).
Waits poll with a bound.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request

from rivven_broker.client import Admin, Consumer, Producer, TopicPartition
from rivven_broker.client.errors import RivvenError
from rivven_broker.coordinator.offsets_codec import OFFSETS_TOPIC, offsets_partition_for
from rivven_broker.coordinator.txn_log_codec import TRANSACTION_STATE_TOPIC
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import FindCoordinator
from rivven_broker.protocol.messages import (
    Fetch,
    FetchPartition,
    FetchTopic,
    OffsetsForLeaderEpoch,
    OffsetsForLeaderEpochPartition,
    OffsetsForLeaderEpochTopic,
)
from tests.integration.conftest import BlockingRawClient
from tests.integration.cluster_ports import free_cluster_ports
from tests.integration.test_controller_process import _ready, _wait

TOPIC = "replicated"


def _cluster(broker_process, tmp_path, size: int = 3):
    ports = free_cluster_ports(size)
    key = tmp_path / "cluster.key"
    key.write_text("a-test-cluster-key-0123456789abcdef\n")
    os.chmod(key, 0o600)

    def start(node: int):
        peers = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(ports)
                         if i + 1 != node)
        return broker_process(
            "--node-id", str(node), "--peers", peers,
            "--cluster-listen", f"127.0.0.1:{ports[node - 1]}", "--cluster-key-file", str(key),
            data_dir=tmp_path / f"n{node}")

    processes = {node: start(node) for node in range(1, size + 1)}
    for process in processes.values():
        _wait(lambda p=process: _ready(p), "every broker ready")
    return processes, start


def _partition(process, partition: int = 0):
    with Admin(process.address) as admin:
        for info in admin.describe_topic(TOPIC).partition_info:
            if info.partition == partition:
                return info
    return None


def _metrics(process) -> dict[str, float]:
    """The unlabelled samples of ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{process.http_port}/metrics") as answer:
        lines = answer.read().decode().splitlines()
    return {name: float(value) for name, _, value in (line.partition(" ") for line in lines)
            if name and not name.startswith("#") and "{" not in name}


def _live_brokers(process) -> set[int]:
    """The brokers ``process`` considers live (registered, its SWIM view agreeing)."""
    with Admin(process.address) as admin:
        return {broker.node_id for broker in admin.cluster_status().brokers}


def _bootstrap(processes) -> str:
    return ",".join(p.address for p in processes.values() if p.popen.poll() is None)


def _assert_fenced(leader, old_epoch: int, epoch: int) -> None:
    """The new leader refuses a fetch at the old epoch (KIP-320) and serves the current one."""
    sock = socket.create_connection(("127.0.0.1", leader.port), timeout=10)
    client = BlockingRawClient(sock)
    try:
        def read(at: int) -> ErrorCode:
            request = Fetch(max_wait_ms=0, topics=(FetchTopic(TOPIC, (
                FetchPartition(0, 0, 1 << 20, at),)),))
            return client.call(request).topics[0].partitions[0].error_code
        assert read(old_epoch) == ErrorCode.FENCED_LEADER_EPOCH
        assert read(epoch + 5) == ErrorCode.UNKNOWN_LEADER_EPOCH
        assert read(epoch) == ErrorCode.NONE

        def epoch_end(asked: int, current: int = -1):
            request = OffsetsForLeaderEpoch((OffsetsForLeaderEpochTopic(TOPIC, (
                OffsetsForLeaderEpochPartition(0, asked, current),)),))
            return client.call(request).topics[0].partitions[0]
        old = epoch_end(old_epoch)  # it ended where the new leader's epoch began
        assert (old.error_code, old.leader_epoch) == (ErrorCode.NONE, old_epoch)
        assert 0 < old.end_offset
        assert epoch_end(old_epoch, current=old_epoch).error_code == \
            ErrorCode.FENCED_LEADER_EPOCH
    finally:
        client.close()


def test_leader_killed_under_acks_all_loses_nothing(broker_process, tmp_path) -> None:
    processes, start = _cluster(broker_process, tmp_path)
    with Admin(processes[1].address) as admin:
        _wait(lambda: len(admin.cluster_status().brokers) == 3, "three live brokers")
        admin.create_topic(TOPIC, partitions=2, replication_factor=3,
                           config={"min.insync.replicas": "2"})
    first = _wait(lambda: _partition(processes[1]), "the topic's metadata")
    assert len(first.replicas) == 3
    _wait(lambda: len(_partition(processes[1]).isr) == 3, "a full ISR")

    acked: list[tuple[int, int]] = []  # (partition, value)
    with Producer(_bootstrap(processes), acks="all", delivery_timeout_ms=60_000) as producer:
        def send(values: range) -> None:
            futures = [(v, producer.send(TOPIC, str(v).encode(), partition=v % 2))
                       for v in values]
            for value, future in futures:
                metadata = future.result(timeout=60)
                acked.append((metadata.partition, value))

        send(range(0, 200))
        leader = first.leader
        processes[leader].popen.send_signal(signal.SIGKILL)
        processes[leader].popen.wait()
        killed_at = time.monotonic()
        send(range(200, 400))
        survivor = next(p for n, p in processes.items() if n != leader)
        moved = _wait(lambda: (lambda i: i if i.leader not in (None, -1, leader) else None)(
            _partition(survivor)), "a new leader for partition 0")
        assert moved.leader_epoch > first.leader_epoch
        failover_s = time.monotonic() - killed_at
        _assert_fenced(processes[moved.leader], first.leader_epoch, moved.leader_epoch)
        processes[leader] = start(leader)
        _wait(lambda: _ready(processes[leader]), "the killed broker back")
        send(range(400, 500))
    assert failover_s < 30

    _wait(lambda: all(len(_partition(survivor, p).isr) == 3 for p in (0, 1)),
          "the restarted broker back in every ISR")

    seen: list[tuple[int, int]] = []
    with Consumer(_bootstrap(processes), auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
        deadline = time.monotonic() + 30
        while len(seen) < len(acked) and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=500):
                seen.append((record.partition, int(record.value)))
    assert sorted(acked) == sorted(set(acked)), "a record was acknowledged twice"
    assert len(seen) == len(set(seen)), "a record was stored twice"
    assert set(acked) <= set(seen), f"lost: {sorted(set(acked) - set(seen))[:10]}"


def _fetch_code(process, epoch: int) -> ErrorCode | None:
    """What ``process`` answers a fetch of partition 0 at leader epoch ``epoch`` (None: it
    cannot be asked now)."""
    try:
        sock = socket.create_connection(("127.0.0.1", process.port), timeout=5)
    except OSError:
        return None
    client = BlockingRawClient(sock)
    try:
        request = Fetch(max_wait_ms=0, topics=(FetchTopic(TOPIC, (
            FetchPartition(0, 0, 1 << 16, epoch),)),))
        return client.call(request).topics[0].partitions[0].error_code
    except (OSError, RivvenError):
        return None
    finally:
        client.close()


def test_a_leader_killed_and_restarted_at_once_never_serves_its_old_epoch(
    broker_process, tmp_path
) -> None:
    """A leader SIGKILLed and started again at once can find itself the partition's leader
    still (the cluster may not have noticed it was gone). What its first process appended
    without a sync may be gone while followers kept it, so it must not lead that epoch again
    (in the simulator, ``replication_one_leader_per_epoch``): it asks the controller for a
    new one first. From its restart on it never answers a fetch at the old epoch as leader,
    and the partition is led again at a newer epoch, with every acknowledged record. Three
    rounds: whether the restart beats the cluster's notice is a race (about one in three
    rounds here, measured with the claim for a new epoch switched off)."""
    processes, start = _cluster(broker_process, tmp_path)
    with Admin(processes[1].address) as admin:
        _wait(lambda: len(admin.cluster_status().brokers) == 3, "three live brokers")
        admin.create_topic(TOPIC, partitions=1, replication_factor=3,
                           config={"min.insync.replicas": "2"})
    acked: list[int] = []
    for round_ in range(3):
        _wait(lambda: (lambda i: i is not None and len(i.isr) == 3
                       and i.leader not in (None, -1))(_partition(processes[1])),
              "a full ISR and a leader")
        with Producer(_bootstrap(processes), acks="all") as producer:
            acked += [producer.send(TOPIC, b"%d" % i, partition=0).result(timeout=60).offset
                      for i in range(20)]
        first = _partition(processes[1])
        leader = first.leader
        processes[leader].popen.send_signal(signal.SIGKILL)
        processes[leader].popen.wait()
        processes[leader] = start(leader)  # at once: no wait for the cluster to notice
        other = next(p for n, p in processes.items() if n != leader)
        deadline = time.monotonic() + 60
        while True:
            code = _fetch_code(processes[leader], first.leader_epoch)
            assert code != ErrorCode.NONE, f"round {round_}: the restarted broker led its old epoch"
            now = _partition(other)
            if code is not None and now is not None and now.leader not in (None, -1) and (
                now.leader_epoch > first.leader_epoch
            ):
                break
            assert time.monotonic() < deadline, f"round {round_}: not led again at a newer epoch"
            time.sleep(0.05)
    with Consumer(_bootstrap(processes), auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        seen: list[int] = []
        deadline = time.monotonic() + 30
        while len(seen) < len(acked) and time.monotonic() < deadline:
            seen += [record.offset for record in consumer.poll(timeout_ms=500)]
    assert set(acked) <= set(seen)


def test_acks_all_refused_below_min_insync(broker_process, tmp_path) -> None:
    processes, _ = _cluster(broker_process, tmp_path)
    with Admin(processes[1].address) as admin:
        _wait(lambda: len(admin.cluster_status().brokers) == 3, "three live brokers")
        admin.create_topic(TOPIC, partitions=1, replication_factor=3,
                           config={"min.insync.replicas": "3"})
    info = _wait(lambda: _partition(processes[1]), "the topic's metadata")
    _wait(lambda: len(_partition(processes[1]).isr) == 3, "a full ISR")
    # The internal topics too, before a broker dies: created later, with two brokers left,
    # they could not get their three replicas and the gauges below would never be compared.
    _wait(lambda: all(p is not None and len(p.isr) == 3 for p in _internals(processes[1])),
          "the internal topics, fully in sync")
    follower = next(r for r in info.replicas if r != info.leader)
    processes[follower].popen.send_signal(signal.SIGKILL)
    processes[follower].popen.wait()
    leader = processes[info.leader]
    _wait(lambda: len(_partition(leader).isr) == 2, "the dead follower out of the ISR")

    def led_and_under() -> tuple[float, float]:  # the topic's and the internal topics' (RF 3)
        parts = [_partition(leader), *_internals(leader)]
        if None in parts:
            return -1.0, -1.0  # (an internal topic is not created yet)
        led = [p for p in parts if p.leader == info.leader]
        return float(len(led)), float(sum(len(p.isr) < 3 for p in led))
    _wait(lambda: (lambda m: (m["rivven_partitions_led"], m["rivven_under_replicated_partitions"])
                   == led_and_under())(_metrics(leader)),
          "the gauges counting every partition the leader leads with a short ISR")
    metrics = _metrics(leader)
    assert metrics["rivven_under_replicated_partitions"] >= 1.0
    assert metrics["rivven_offline_partitions"] == 0
    with Producer(leader.address, acks="all", delivery_timeout_ms=3_000) as producer:
        try:
            producer.send(TOPIC, b"x", partition=0).result(timeout=10)
        except RivvenError as exc:
            assert "NOT_ENOUGH_REPLICAS" in str(exc), exc
        else:
            raise AssertionError("acks=all was acknowledged with 2 of min.insync 3")
    with Producer(leader.address, acks=1) as producer:
        producer.send(TOPIC, b"y", partition=0).result(timeout=10)


def _coordinator_of(process, key: str, key_type: int = 0) -> int:
    """The node FindCoordinator names for a group (``key_type`` 0) or a transactional id (1);
    -1: none now."""
    sock = socket.create_connection(("127.0.0.1", process.port), timeout=10)
    client = BlockingRawClient(sock)
    try:
        answer = client.call(FindCoordinator(key, key_type))
        return answer.node_id if answer.error_code == ErrorCode.NONE else -1
    finally:
        client.close()


def test_group_coordinator_moves_with_its_partition(broker_process, tmp_path) -> None:
    """The group's coordinator is the leader of its replicated ``__consumer_offsets``
    partition; SIGKILL of that broker moves the group to the new leader, which loads the
    committed offsets from its replica of the log."""
    processes, _ = _cluster(broker_process, tmp_path)
    with Admin(processes[1].address) as admin:
        _wait(lambda: len(admin.cluster_status().brokers) == 3, "three live brokers")
        admin.create_topic(TOPIC, partitions=2, replication_factor=3)
    _wait(lambda: _partition(processes[1]), "the topic's metadata")
    with Producer(_bootstrap(processes), acks="all") as producer:
        for value in range(100):
            producer.send(TOPIC, str(value).encode(), partition=value % 2)
        producer.flush(timeout=30)

    group = "moving-group"
    coordinator = _one_coordinator(processes, group)
    offsets = _wait(lambda: _internal(processes[1], offsets_partition_for(group, 4)),
                    "__consumer_offsets in the metadata")
    assert offsets.leader == coordinator and len(offsets.replicas) == 3
    _wait(lambda: len(_internal(processes[1], offsets.partition).isr) == 3,
          "__consumer_offsets fully in sync")

    first = set()
    with Consumer(_bootstrap(processes), group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while len(first) < 60 and time.monotonic() < deadline:
            first.update(int(r.value) for r in consumer.poll(timeout_ms=500))
        assert len(first) >= 60
        consumer.commit()
        committed = {p: consumer.committed(TopicPartition(TOPIC, p)) for p in (0, 1)}
    assert sum(committed.values()) == len(first)

    processes[coordinator].popen.send_signal(signal.SIGKILL)
    processes[coordinator].popen.wait()
    survivor = next(p for n, p in processes.items() if n != coordinator)
    moved = _wait(lambda: (lambda n: n if n not in (-1, coordinator) else None)(
        _coordinator_of(survivor, group)), "a new coordinator for the group")
    assert moved != coordinator

    rest = []
    with Consumer(_bootstrap(processes), group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:
        assert {p: consumer.committed(TopicPartition(TOPIC, p)) for p in (0, 1)} == committed
        consumer.subscribe([TOPIC])
        deadline = time.monotonic() + 30
        while len(first) + len(rest) < 100 and time.monotonic() < deadline:
            rest.extend(int(r.value) for r in consumer.poll(timeout_ms=500))
    assert not set(rest) & first, "records below the committed offsets were read again"
    assert sorted(first | set(rest)) == list(range(100))


def _one_coordinator(processes, key: str, key_type: int = 0) -> int:
    """Wait until every broker names the same coordinator for ``key``; return it."""
    def agreed():
        named = {_coordinator_of(p, key, key_type) for p in processes.values()}
        return named.pop() if len(named) == 1 and -1 not in named else None
    return _wait(agreed, f"one coordinator for {key!r}, named by every broker")


def _internals(process) -> list:
    """Every partition of the two internal topics (RF 3), None where not known yet."""
    return [_internal(process, p, topic) for p in range(4)
            for topic in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC)]


def _internal(process, partition: int, topic: str = OFFSETS_TOPIC):
    with Admin(process.address) as admin:
        for info in admin.describe_topic(topic).partition_info:
            if info.partition == partition:
                return info
    return None


def test_idempotent_producers_on_different_brokers_get_distinct_ids(broker_process,
                                                                     tmp_path) -> None:
    """Producer ids are the cluster's (allocated in blocks through the controller): two
    idempotent producers that each ask another broker for an id never share one, so neither
    one's records are taken for the other's retries."""
    processes, _ = _cluster(broker_process, tmp_path)
    with Admin(processes[1].address) as admin:
        _wait(lambda: len(admin.cluster_status().brokers) == 3, "three live brokers")
        admin.create_topic(TOPIC, partitions=1, replication_factor=3)
    _wait(lambda: _partition(processes[1]), "the topic's metadata")
    producers = [Producer(processes[n].address, acks="all", idempotent=True)
                 for n in (1, 2, 3)]
    try:
        for value in range(30):  # one record per request: every producer's sequences align
            for index, producer in enumerate(producers):
                producer.send(TOPIC, f"{index}-{value}".encode(), partition=0).result(timeout=30)
    finally:
        for producer in producers:
            producer.close()
    seen = []
    with Consumer(_bootstrap(processes), auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        deadline = time.monotonic() + 30
        while len(seen) < 90 and time.monotonic() < deadline:
            seen.extend(r.value.decode() for r in consumer.poll(timeout_ms=500))
    assert sorted(seen) == sorted(f"{i}-{v}" for i in range(3) for v in range(30))


def test_transactions_survive_their_coordinators_broker(broker_process, tmp_path) -> None:
    """The transaction coordinator is the leader of the id's replicated
    ``__transaction_state`` partition. An open transaction whose coordinator's broker is
    killed (SIGKILL) is committed through the new one, which loaded it from its replica of
    the log; markers reach partitions led by other brokers; ``read_committed`` readers see
    committed transactions exactly once and aborted ones never."""
    processes, _ = _cluster(broker_process, tmp_path)
    with Admin(processes[1].address) as admin:
        _wait(lambda: len(admin.cluster_status().brokers) == 3, "three live brokers")
        admin.create_topic(TOPIC, partitions=3, replication_factor=3)
    _wait(lambda: _partition(processes[1]), "the topic's metadata")
    tid = "moving-transactions"
    coordinator = _one_coordinator(processes, tid, 1)

    def send_all(producer, label: str) -> None:
        for value in range(12):
            producer.send(TOPIC, f"{label}-{value}".encode(), partition=value % 3)
        producer.flush(timeout=30)

    with Producer(_bootstrap(processes), transactional_id=tid, acks="all") as producer:
        producer.init_transactions(timeout=30)
        producer.begin_transaction()
        send_all(producer, "first")
        producer.commit_transaction(timeout=30)
        producer.begin_transaction()
        send_all(producer, "aborted")
        producer.abort_transaction(timeout=30)
        producer.begin_transaction()
        send_all(producer, "second")  # open: its partitions are added, durably
        processes[coordinator].popen.send_signal(signal.SIGKILL)
        processes[coordinator].popen.wait()
        producer.commit_transaction(timeout=60)  # through the new coordinator
        producer.begin_transaction()
        send_all(producer, "third")
        producer.commit_transaction(timeout=60)
    survivor = next(p for n, p in processes.items() if n != coordinator)
    assert _coordinator_of(survivor, tid, 1) not in (-1, coordinator)

    seen = []
    with Consumer(_bootstrap(processes), auto_offset_reset="earliest",
                  isolation_level="read_committed") as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(3)])
        deadline = time.monotonic() + 30
        while len(seen) < 36 and time.monotonic() < deadline:
            seen.extend(r.value.decode() for r in consumer.poll(timeout_ms=500))
        seen.extend(r.value.decode() for r in consumer.poll(timeout_ms=1000))
    assert sorted(seen) == sorted(f"{label}-{v}" for label in ("first", "second", "third")
                                  for v in range(12))


def test_a_follower_killed_catches_up_through_megabyte_answers_then_leads(
        broker_process, tmp_path) -> None:
    """A follower SIGKILLed while ~3 MB is written, restarted, catches up: its fetch answers
    are up to a megabyte, so they take the replica link's copy-once path (records beside the
    answer's document, the frame handed out as a view of the receive buffer; link_frame.py),
    and the leader's batches of 64 KiB and more go out as file regions (read once for the
    tag, sent with sendfile: replica_link.py).
    Then the leader is SIGKILLed and that follower, first in replica order, leads: it serves
    every acknowledged record, byte for byte."""
    processes, start = _cluster(broker_process, tmp_path)
    with Admin(processes[1].address) as admin:
        _wait(lambda: len(admin.cluster_status().brokers) == 3, "three live brokers")
        admin.create_topic(TOPIC, partitions=1, replication_factor=3,
                           config={"min.insync.replicas": "2"})
    _wait(lambda: _partition(processes[1]) and len(_partition(processes[1]).isr) == 3,
          "a full ISR")
    first = _partition(processes[1])
    leader = first.leader
    follower = next(n for n in first.replicas if n != leader)  # elected first, later
    processes[follower].popen.send_signal(signal.SIGKILL)
    processes[follower].popen.wait()

    def value(n: int) -> bytes:
        return (b"%06d" % n) * 1365  # ~8 KiB, distinct per record

    acked: dict[int, int] = {}  # offset -> record number
    with Producer(processes[leader].address, acks=1) as producer:
        futures = [(n, producer.send(TOPIC, value(n), partition=0)) for n in range(400)]
        for n, future in futures:
            acked[future.result(timeout=60).offset] = n
    processes[follower] = start(follower)
    _wait(lambda: _ready(processes[follower]), "the killed follower back")
    _wait(lambda: follower in _partition(processes[leader]).isr, "the follower caught up")
    for process in processes.values():  # whichever becomes the controller knows it live
        _wait(lambda p=process: follower in _live_brokers(p), "the follower live everywhere")
    with Producer(processes[leader].address, acks="all") as producer:
        for n in range(400, 410):
            acked[producer.send(TOPIC, value(n), partition=0).result(timeout=60).offset] = n

    processes[leader].popen.send_signal(signal.SIGKILL)
    processes[leader].popen.wait()
    survivor = processes[follower]
    moved = _wait(lambda: (lambda i: i if i.leader not in (None, -1, leader) else None)(
        _partition(survivor)), "a new leader")
    assert moved.leader == follower and moved.leader_epoch > first.leader_epoch
    seen: dict[int, bytes] = {}
    with Consumer(survivor.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        deadline = time.monotonic() + 30
        while len(seen) < len(acked) and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=500):
                seen[record.offset] = record.value
    assert {offset: seen.get(offset) for offset in acked} == \
        {offset: value(n) for offset, n in acked.items()}
