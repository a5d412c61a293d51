"""A consume-transform-produce processor, run as its own process by test_exactly_once_ctp.py.

``python ctp_processor.py BOOTSTRAP [CRASH_AFTER]``: reads topic ``in`` (read_committed, as
group ``ctp``, positions from the group's committed offsets), writes ``out-<value>`` to topic
``out`` (same key and partition) and commits the consumed offsets inside the same transaction
(``send_offsets_to_transaction``), one transaction per poll. It exits 0 once it has consumed
up to the end of ``in``. With ``CRASH_AFTER`` it commits that many transactions, then opens
one more, writes its output, flushes, prints ``MID`` and waits to be killed.
"""

from __future__ import annotations

import sys
import time

from rivven_broker.client import Consumer, Producer, TopicPartition


def main(bootstrap: str, crash_after: int | None) -> int:
    producer = Producer(bootstrap, transactional_id="ctp-app", max_block_ms=30_000)
    producer.init_transactions()  # fences an older instance and aborts what it left open
    consumer = Consumer(bootstrap, group_id="ctp", enable_auto_commit=False,
                        isolation_level="read_committed", auto_offset_reset="earliest")
    partitions = [TopicPartition("in", p) for p in consumer.partitions_for_topic("in")]
    consumer.assign(partitions)
    for tp, offset in consumer.committed(partitions).items():
        if offset is not None:
            consumer.seek(tp, offset)
    ends = consumer.end_offsets(partitions)
    committed = 0
    while True:
        records = consumer.poll(timeout_ms=200, max_records=2_000)
        if not records:
            if all(consumer.position(tp) >= ends[tp] for tp in partitions):
                break
            continue
        producer.begin_transaction()
        offsets: dict[TopicPartition, int] = {}
        for record in records:
            producer.send("out", key=record.key, value=b"out-" + record.value,
                          partition=record.partition)
            offsets[TopicPartition(record.topic, record.partition)] = record.offset + 1
        if crash_after is not None and committed == crash_after:
            producer.flush()
            print("MID", flush=True)
            time.sleep(600)
        producer.send_offsets_to_transaction(offsets, "ctp")
        producer.commit_transaction()
        committed += 1
        print("COMMITTED", committed, flush=True)
    consumer.close()
    producer.close()
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
