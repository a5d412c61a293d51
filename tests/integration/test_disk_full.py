"""A full disk, for real: deletes free space through the broker, appends resume by themselves.

Method (issue 16, defect 6): a real ``rivven-broker`` process on a 12 MiB tmpfs (mounted by the
test; it runs as root, as CI does) with a 3 MiB filler file beside its data. Producing with
``acks=all`` runs into ENOSPC and the producer gets a retriable storage error. Then, on the
still-full disk, ``delete_records`` and ``delete_topic`` through the broker must succeed (they
failed before: their metadata writes needed space). The filler is removed from outside and
the same partition takes appends again without a restart (before, it answered "failed
earlier" until one). Every acknowledged record at or above the new log start is read back
exactly once, before and after a restart.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from rivven_broker.client import (
    Admin,
    Consumer,
    DeliveryTimeoutError,
    Producer,
    TopicPartition,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _read_all(address: str) -> list[tuple[int, bytes]]:
    out = []
    with Consumer(address, auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        consumer.assign([TopicPartition("big", 0)])
        empty = 0
        while empty < 3:
            records = consumer.poll(timeout_ms=500)
            empty = 0 if records else empty + 1
            out += [(record.offset, record.value) for record in records]
    return out


def test_a_full_disk_frees_space_through_the_broker_and_appends_resume(
    broker_process, small_disk: pathlib.Path
):
    data_dir = small_disk / "data"
    broker = broker_process(data_dir=data_dir)
    with Admin(broker.address) as admin:
        admin.create_topic("big", partitions=1, config={"segment.bytes": "1048576"})
        admin.create_topic("spare", partitions=1)
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 3 * 1024 * 1024)
    acked: dict[int, bytes] = {}
    with Producer(broker.address, linger_ms=0, delivery_timeout_ms=3_000,
                  request_timeout_ms=2_000) as producer:
        failure = None
        for i in range(20_000):
            value = b"%06d" % i + b"x" * 994
            try:
                acked[producer.send("big", value=value, partition=0).result().offset] = value
            except DeliveryTimeoutError as error:
                failure = str(error)
                break
    assert failure is not None and "No space left on device" in failure, failure
    assert len(acked) > 1000

    with Admin(broker.address) as admin:  # the disk is still full
        start = admin.delete_records({TopicPartition("big", 0): 100})
        assert start[TopicPartition("big", 0)] == 100
        admin.delete_topic("spare")
        assert "spare" not in admin.list_topics()

    filler.unlink()  # space returns, from outside the broker
    with Producer(broker.address, linger_ms=0, delivery_timeout_ms=10_000) as producer:
        for i in range(50):
            value = b"after-%03d" % i
            acked[producer.send("big", value=value, partition=0).result().offset] = value

    expected = sorted((offset, value) for offset, value in acked.items() if offset >= 100)
    assert _read_all(broker.address) == expected
    assert broker.terminate() == 0
    again = broker_process(data_dir=data_dir)
    assert _read_all(again.address) == expected
    assert again.terminate() == 0
