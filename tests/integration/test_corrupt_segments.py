"""A damaged batch in a sealed segment is never skipped silently (issue 16, defect 7).

Method: a real ``rivven-broker`` process writes 2,000 records in batches of 20 into segments
of about 20 KB, stops cleanly; the test then damages one batch in the middle of a sealed
segment (a byte of its records: the CRC no longer matches; or its length field: the framing
no longer chains), restarts the broker and reads from offset 0 with the public ``Consumer``.
Every record before the damaged batch must arrive, in order, then ``CorruptMessageError``
naming the topic, partition and the batch's offset, again on every later poll, never a record
from beyond it; the broker keeps serving, counts the damage in ``/metrics`` and logs it once.
Before the fix a flipped record byte skipped a run of records with no error and a damaged
length stopped the broker with an assertion.
"""

from __future__ import annotations

import glob
import os
import struct
import time
import urllib.request

import pytest

from rivven_broker.client import Admin, Consumer, CorruptMessageError, Producer, TopicPartition

pytestmark = pytest.mark.slow


def _fill(address: str) -> None:
    with Admin(address) as admin:
        admin.create_topic("t", partitions=1, config={"segment.bytes": "20000"})
    with Producer(address, linger_ms=0) as producer:
        for i in range(2000):
            producer.send("t", value=b"value-%05d" % i + b"x" * 50, partition=0)
            if i % 20 == 19:
                producer.flush()


def _batches(data: bytes) -> list[tuple[int, int, int]]:
    """(position, base offset, size) of each batch of a segment file."""
    out, position = [], 0
    while position + 12 <= len(data):
        base, length = struct.unpack_from(">qi", data, position)
        if length <= 0:
            break
        out.append((position, base, 12 + length))
        position += 12 + length
    return out


def _consume(address: str) -> tuple[list[int], list[str]]:
    got: list[int] = []
    errors: list[str] = []
    with Consumer(address, auto_offset_reset="earliest", enable_auto_commit=False) as consumer:
        consumer.assign([TopicPartition("t", 0)])
        deadline = time.monotonic() + 30
        while len(errors) < 3 and time.monotonic() < deadline:
            try:
                got += [record.offset for record in consumer.poll(timeout_ms=500)]
            except CorruptMessageError as error:
                errors.append(str(error))
    return got, errors


def _corrupt_batches_metric(http_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics") as answer:
        return sum(float(line.rsplit(" ", 1)[1]) for line in answer.read().decode().splitlines()
                   if line.startswith("rivven_corrupt_batches_total{"))


@pytest.mark.parametrize("damage", ["records", "length"])
def test_a_damaged_batch_stops_the_consumer_with_corrupt_message(broker_process, tmp_path, damage):
    log_path = tmp_path / "broker.log"
    first = broker_process()
    _fill(first.address)
    assert first.terminate() == 0
    segments = sorted(glob.glob(str(first.data_dir / "t-0" / "*.log")))
    assert len(segments) >= 4
    sealed = segments[len(segments) // 2]
    data = bytearray(open(sealed, "rb").read())
    batches = _batches(bytes(data))
    position, base_offset, size = batches[len(batches) // 2]
    if damage == "records":
        data[position + size - 3] ^= 0xFF  # inside the CRC-covered records
    else:
        struct.pack_into(">i", data, position + 8, 0x7FFF_FFF0)  # a length past the segment
    with open(sealed, "r+b") as handle:
        handle.write(bytes(data))
    with open(log_path, "wb") as log_file:
        broker = broker_process(data_dir=first.data_dir, stderr=log_file)
        got, errors = _consume(broker.address)
        assert got == list(range(base_offset)), (got[-3:], base_offset)
        assert len(errors) == 3
        for error in errors:
            assert f"t-0: the record batch at offset {base_offset} is corrupt" in error
        if damage == "length":
            assert _corrupt_batches_metric(broker.http_port) >= 3
        assert broker.popen.poll() is None
        assert broker.terminate() == 0
    if damage == "length":
        assert log_path.read_text().count("a stored batch is damaged") == 1


def test_the_scrubber_reports_damage_before_any_reader(broker_process, tmp_path):
    """Nobody reads: the background scrubber (fast here) finds the flipped byte, counts it
    under source="scrub" and logs it once, however many passes it makes."""
    first = broker_process()
    _fill(first.address)
    assert first.terminate() == 0
    segments = sorted(glob.glob(str(first.data_dir / "t-0" / "*.log")))
    sealed = segments[1]
    data = bytearray(open(sealed, "rb").read())
    position, base_offset, size = _batches(bytes(data))[3]
    data[position + size - 3] ^= 0xFF
    with open(sealed, "r+b") as handle:
        handle.write(bytes(data))
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log_file:
        broker = broker_process("--scrub-bytes-per-second", "50000000", data_dir=first.data_dir,
                                stderr=log_file)
        deadline = time.monotonic() + 30
        while _scrub_metric(broker.http_port) < 1:
            assert time.monotonic() < deadline, "the scrubber found nothing"
            time.sleep(0.2)
        time.sleep(1)  # more passes: still one report
        assert _scrub_metric(broker.http_port) == 1
        assert broker.terminate() == 0
    text = log_path.read_text()
    assert text.count("scrub: t-0 holds a damaged batch") == 1
    assert f"offset {base_offset}" in text


def _scrub_metric(http_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics") as answer:
        return sum(float(line.rsplit(" ", 1)[1]) for line in answer.read().decode().splitlines()
                   if line.startswith("rivven_corrupt_batches_total{") and 'source="scrub"' in line)
