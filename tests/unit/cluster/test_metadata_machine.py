"""The controller state machine: every command, its compare-and-set, retries, snapshots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_cluster.metadata import (
    FIRST_CLUSTER_PRODUCER_ID,
    NO_LEADER,
    AllocateProducerIds,
    AlterTopicConfigs,
    CommandError,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    ElectLeader,
    FenceBroker,
    MetadataMachine,
    RegisterBroker,
    Status,
    UpdateIsr,
    decode_command,
    encode_command,
)


class Log:
    """A machine fed through the codec, with Raft indexes counted."""

    def __init__(self) -> None:
        self.machine = MetadataMachine()
        self.index = 0

    def apply(self, command):
        self.index += 1
        outcome = self.machine.apply(decode_command(encode_command(command)), self.index)
        self.machine.check_invariants()
        return outcome


def _three_brokers() -> Log:
    log = Log()
    for b in (1, 2, 3):
        assert log.apply(RegisterBroker(b, boot_id=100 + b, host="h", port=9000 + b)).ok
    return log


def test_register_is_idempotent_and_a_new_boot_replaces_the_old():
    log = Log()
    first = RegisterBroker(1, boot_id=10, host="a", port=9092, rack="r1", voter=True)
    assert log.apply(first).status is Status.APPLIED
    epoch = log.machine.image().broker(1).broker_epoch
    assert log.apply(first).status is Status.UNCHANGED
    assert log.machine.image().broker(1).broker_epoch == epoch
    assert log.apply(RegisterBroker(1, boot_id=9, host="a", port=9092)).status is Status.CONFLICT
    assert log.apply(RegisterBroker(1, boot_id=10, host="b", port=9092)).status is Status.CONFLICT
    assert log.apply(RegisterBroker(1, boot_id=11, host="b", port=9093)).status is Status.APPLIED
    broker = log.machine.image().broker(1)
    assert (broker.boot_id, broker.host, broker.port) == (11, "b", 9093)
    assert broker.broker_epoch > epoch


def test_register_refuses_an_unusable_address():
    assert Log().apply(RegisterBroker(1, boot_id=1, host="", port=9092)).status is Status.INVALID
    assert Log().apply(RegisterBroker(1, boot_id=1, host="h", port=0)).status is Status.INVALID


def test_fencing_takes_the_exact_process():
    log = _three_brokers()
    assert log.apply(FenceBroker(1, boot_id=999)).status is Status.CONFLICT
    assert log.apply(FenceBroker(1, boot_id=101)).status is Status.APPLIED
    assert log.apply(FenceBroker(1, boot_id=101)).status is Status.UNCHANGED
    assert log.machine.image().broker(1).fenced
    # the fenced process may not come back under the same boot; a new boot may
    assert log.apply(RegisterBroker(1, boot_id=101, host="h", port=9001)).status is Status.CONFLICT
    assert log.apply(RegisterBroker(1, boot_id=102, host="h", port=9001)).status is Status.APPLIED
    assert not log.machine.image().broker(1).fenced
    assert log.apply(FenceBroker(7, boot_id=1)).status is Status.NOT_FOUND


def test_create_topic_once_per_topic_id():
    log = _three_brokers()
    create = CreateTopic("t", "id-1", ((1, 2, 3), (2, 3, 1)), {"retention.ms": "1000"})
    assert log.apply(create).status is Status.APPLIED
    assert log.apply(create).status is Status.UNCHANGED
    assert log.apply(CreateTopic("t", "id-2", ((1,),))).status is Status.CONFLICT
    assert log.apply(CreateTopic("u", "id-1", ((1,),))).status is Status.INVALID
    topic = log.machine.image().topic("t")
    assert topic.replication_factor == 3 and dict(topic.configs) == {"retention.ms": "1000"}
    part = log.machine.image().partition("t", 1)
    assert (part.leader, part.isr, part.leader_epoch) == (2, (2, 3, 1), 0)


@pytest.mark.parametrize("assignment, why", [
    ((), "at least one partition"),
    (((1, 1),), "distinct"),
    (((1, 2), (1,)), "same number"),
    (((1, 9),), "not registered"),
])
def test_create_topic_refuses_bad_assignments(assignment, why):
    log = _three_brokers()
    outcome = log.apply(CreateTopic("t", "x", assignment))
    assert outcome.status is Status.INVALID and why in outcome.message
    assert log.machine.image().topic("t") is None


def test_delete_needs_the_topic_id():
    log = _three_brokers()
    log.apply(CreateTopic("t", "id-1", ((1,),)))
    assert log.apply(DeleteTopic("t", "id-0")).status is Status.NOT_FOUND
    assert log.apply(DeleteTopic("t", "id-1")).status is Status.APPLIED
    assert log.apply(DeleteTopic("t", "id-1")).status is Status.NOT_FOUND
    # a new topic of the same name is another topic: an old delete cannot remove it
    log.apply(CreateTopic("t", "id-2", ((2,),)))
    assert log.apply(DeleteTopic("t", "id-1")).status is Status.NOT_FOUND
    assert log.machine.image().topic("t").topic_id == "id-2"


def test_create_partitions_compares_the_count():
    log = _three_brokers()
    log.apply(CreateTopic("t", "id", ((1, 2),)))
    grow = CreatePartitions("t", "id", expected_count=1, assignment=((2, 3), (3, 1)))
    assert log.apply(grow).status is Status.APPLIED
    assert log.apply(grow).status is Status.UNCHANGED
    assert log.apply(CreatePartitions("t", "id", 1, ((1, 2),))).status is Status.CONFLICT
    assert log.apply(CreatePartitions("t", "id", 3, ((1,),))).status is Status.INVALID
    assert len(log.machine.image().topic("t").partitions) == 3


def test_alter_configs_compares_the_version():
    log = _three_brokers()
    log.apply(CreateTopic("t", "id", ((1,),)))
    alter = AlterTopicConfigs("t", "id", expected_version=0, configs={"a": "1"})
    assert log.apply(alter).status is Status.APPLIED
    assert log.apply(alter).status is Status.UNCHANGED
    assert log.apply(AlterTopicConfigs("t", "id", 0, {"a": "2"})).status is Status.CONFLICT
    topic = log.machine.image().topic("t")
    assert (dict(topic.configs), topic.config_version) == ({"a": "1"}, 1)


def test_elect_leader_bumps_the_epochs_once():
    log = _three_brokers()
    log.apply(CreateTopic("t", "id", ((1, 2, 3),)))
    elect = ElectLeader("t", 0, expected_leader_epoch=0, leader=2, isr=(2, 3))
    assert log.apply(elect).status is Status.APPLIED
    assert log.apply(elect).status is Status.UNCHANGED
    part = log.machine.image().partition("t", 0)
    assert (part.leader, part.isr, part.leader_epoch, part.partition_epoch) == (2, (2, 3), 1, 1)
    assert log.apply(ElectLeader("t", 0, 0, 3, (3,))).status is Status.CONFLICT
    assert log.apply(ElectLeader("t", 0, 1, 1, (2, 3))).status is Status.INVALID
    assert log.apply(ElectLeader("t", 0, 1, 2, (2, 7))).status is Status.INVALID
    # offline: no leader, the last ISR kept
    assert log.apply(ElectLeader("t", 0, 1, NO_LEADER, ())).status is Status.APPLIED
    part = log.machine.image().partition("t", 0)
    assert (part.leader, part.isr, part.leader_epoch) == (NO_LEADER, (2, 3), 2)
    assert log.apply(ElectLeader("t", 5, 0, 1, (1,))).status is Status.NOT_FOUND


def test_update_isr_needs_the_leader_epoch_and_partition_epoch():
    log = _three_brokers()
    log.apply(CreateTopic("t", "id", ((1, 2, 3),)))
    shrink = UpdateIsr("t", 0, leader_epoch=0, expected_partition_epoch=0, isr=(1, 2))
    assert log.apply(shrink).status is Status.APPLIED
    assert log.apply(shrink).status is Status.UNCHANGED
    assert log.apply(UpdateIsr("t", 0, 0, 0, (1,))).status is Status.CONFLICT
    assert log.apply(UpdateIsr("t", 0, 3, 1, (1,))).status is Status.CONFLICT
    assert log.apply(UpdateIsr("t", 0, 0, 1, (2, 3))).status is Status.INVALID
    assert log.apply(UpdateIsr("t", 0, 0, 1, (1, 4))).status is Status.INVALID
    part = log.machine.image().partition("t", 0)
    assert (part.isr, part.leader_epoch, part.partition_epoch) == ((1, 2), 0, 1)


def test_the_image_is_immutable_and_replaced_on_apply():
    log = _three_brokers()
    before = log.machine.image()
    log.apply(CreateTopic("t", "id", ((1,),)))
    after = log.machine.image()
    assert before.topic("t") is None and after.topic("t") is not None
    assert after.applied_index == log.index
    with pytest.raises(TypeError):
        after.topics["u"] = None  # type: ignore[index]


def test_applying_an_old_index_is_a_bug():
    log = _three_brokers()
    with pytest.raises(AssertionError):
        log.machine.apply(FenceBroker(1, 101), log.index)


@pytest.mark.parametrize("data, why", [
    (b"\xc1", "msgpack"),
    (b"\x01", "map"),
    (encode_command(FenceBroker(1, 2)).replace(b"fence_broker", b"fence_brokes"), "unknown"),
])
def test_decode_refuses_what_is_not_a_command(data, why):
    with pytest.raises(CommandError, match=why):
        decode_command(data)


def test_decode_refuses_wrong_field_types():
    import msgpack
    with pytest.raises(CommandError, match="malformed"):
        decode_command(msgpack.packb({"op": "fence_broker", "broker_id": "1", "boot_id": 2}))
    with pytest.raises(CommandError, match="malformed"):
        decode_command(msgpack.packb({"op": "fence_broker", "broker_id": 1}))


def test_producer_id_blocks_are_disjoint_and_a_retry_finds_its_own():
    log = _three_brokers()
    first = FIRST_CLUSTER_PRODUCER_ID
    assert log.apply(AllocateProducerIds(1, 7, first, 1000)).status is Status.APPLIED
    assert log.apply(AllocateProducerIds(2, 8, first, 1000)).status is Status.CONFLICT  # raced
    assert log.apply(AllocateProducerIds(2, 8, first + 1000, 1000)).status is Status.APPLIED
    assert log.apply(AllocateProducerIds(1, 7, first, 1000)).status is Status.UNCHANGED  # retry
    image = log.machine.image()
    assert image.next_producer_id == first + 2000
    assert dict(image.producer_id_blocks) == {1: (7, first, first + 1000),
                                              2: (8, first + 1000, first + 2000)}
    restored = MetadataMachine.restore(log.machine.snapshot())
    assert restored.image() == image


def test_two_allocations_of_one_broker_at_the_same_id_are_not_one():
    """The desk and a transaction shard of one broker racing: the second is a conflict, not
    a retry of the first (which would hand both the same ids)."""
    log = _three_brokers()
    first = FIRST_CLUSTER_PRODUCER_ID
    assert log.apply(AllocateProducerIds(1, 100, first, 10)).status is Status.APPLIED
    assert log.apply(AllocateProducerIds(1, 200, first, 10)).status is Status.CONFLICT


def test_producer_id_allocation_refusals():
    log = _three_brokers()
    first = FIRST_CLUSTER_PRODUCER_ID
    assert log.apply(AllocateProducerIds(9, 1, first, 10)).status is Status.NOT_FOUND
    assert log.apply(AllocateProducerIds(1, 1, first, 0)).status is Status.INVALID
    assert log.apply(AllocateProducerIds(1, 1, first - 5, 10)).status is Status.CONFLICT
    assert log.machine.image().next_producer_id == first


def test_a_snapshot_from_before_producer_ids_restores():
    import msgpack
    log = _three_brokers()
    version, applied, brokers, topics, *_ = msgpack.unpackb(log.machine.snapshot(), raw=False)
    old = MetadataMachine.restore(msgpack.packb([version, applied, brokers, topics]))
    assert old.image().next_producer_id == FIRST_CLUSTER_PRODUCER_ID
    assert old.image().brokers == log.machine.image().brokers


# -- properties: any command sequence, with retries, keeps the invariants -------------------

BROKERS = st.integers(1, 4)
TOPICS = st.sampled_from(["a", "b"])
IDS = st.sampled_from(["i1", "i2", "i3"])
REPLICAS = st.lists(BROKERS, min_size=1, max_size=3, unique=True).map(tuple)
EPOCH = st.integers(0, 3)

COMMANDS = st.one_of(
    st.builds(RegisterBroker, BROKERS, st.integers(1, 3), st.just("h"), st.just(9092),
              st.sampled_from([None, "r1"])),
    st.builds(FenceBroker, BROKERS, st.integers(1, 3)),
    st.builds(CreateTopic, TOPICS, IDS,
              st.integers(1, 3).flatmap(lambda n: st.lists(REPLICAS.filter(lambda r: len(r) == n),
                                                           min_size=1, max_size=3).map(tuple))),
    st.builds(DeleteTopic, TOPICS, IDS),
    st.builds(CreatePartitions, TOPICS, IDS, st.integers(0, 3),
              st.lists(REPLICAS, min_size=1, max_size=2).map(tuple)),
    st.builds(AlterTopicConfigs, TOPICS, IDS, EPOCH, st.dictionaries(st.sampled_from("xy"),
                                                                      st.sampled_from("01"))),
    st.builds(ElectLeader, TOPICS, st.integers(0, 2), EPOCH, st.sampled_from([NO_LEADER, 1, 2, 3]),
              st.lists(BROKERS, max_size=3, unique=True).map(tuple)),
    st.builds(UpdateIsr, TOPICS, st.integers(0, 2), EPOCH, EPOCH,
              st.lists(BROKERS, min_size=1, max_size=3, unique=True).map(tuple)),
    st.builds(AllocateProducerIds, BROKERS, st.integers(1, 3),
              st.sampled_from([FIRST_CLUSTER_PRODUCER_ID + n for n in (0, 10, 20, 30)]),
              st.sampled_from([0, 10])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(COMMANDS, max_size=40), st.randoms(use_true_random=False))
def test_any_sequence_keeps_invariants_and_a_retry_never_applies(commands, rng):
    log = Log()
    for command in commands:
        before = log.machine.snapshot()
        epochs = {(t.topic_id, i): (p.leader_epoch, p.partition_epoch)
                  for t in log.machine.image().topics.values()
                  for i, p in enumerate(t.partitions)}
        outcome = log.apply(command)
        if not outcome.ok or outcome.status is Status.UNCHANGED:
            # nothing changed but the applied index
            restored = MetadataMachine.restore(log.machine.snapshot())
            restored.applied_index = MetadataMachine.restore(before).applied_index
            assert restored.snapshot() == before
        if outcome.status is Status.APPLIED:
            # the same command again, as a retry after UNKNOWN_OUTCOME: never applied twice
            assert log.apply(command).status is not Status.APPLIED
        for t in log.machine.image().topics.values():
            for i, p in enumerate(t.partitions):
                old = epochs.get((t.topic_id, i))
                if old is not None:
                    assert (p.leader_epoch, p.partition_epoch) >= old
        if rng.random() < 0.2:
            log.machine = MetadataMachine.restore(log.machine.snapshot())
    restored = MetadataMachine.restore(log.machine.snapshot())
    assert restored.image() == log.machine.image()
