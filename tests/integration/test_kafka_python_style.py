"""A kafka-python script runs unchanged but for its import line.

Method: the script of docs/client.md ("Coming from kafka-python") against a real broker
process: kafka-python's option names (``bootstrap_servers`` as a list, ``batch_size``,
``compression_type=None``, ``enable_idempotence``, ``api_version``), serializers and
deserializers, ``future.get(timeout=...)``, ``Consumer(*topics, bootstrap_servers=...,
group_id=...)``, ``record.timestamp``/``timestamp_type``, ``subscription()``, ``topics()`` and
``close(autocommit=False)``. Then what must fail at once does, with messages that say what
was meant: a misspelt option names the closest one, a ``str`` value without a serializer
says how to send it, a lone topic name is not taken for a host.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from rivven_broker.client import Admin
from rivven_broker.client.errors import MessageTooLargeError
from rivven_broker.client import Consumer as KafkaConsumer
from rivven_broker.client import Producer as KafkaProducer


def test_a_kafka_python_script(broker_process):
    process = broker_process("--group-initial-rebalance-delay-ms", "0")
    servers = [process.address]
    with Admin(bootstrap_servers=servers) as admin:
        admin.create_topic("orders", 2)

    # --- what a kafka-python user writes --------------------------------------------------
    producer = KafkaProducer(bootstrap_servers=servers, batch_size=16384, linger_ms=5,
                             compression_type=None, enable_idempotence=True, acks="all",
                             api_version=(2, 5),
                             key_serializer=str.encode,
                             value_serializer=lambda v: json.dumps(v).encode("utf-8"))
    metadata = producer.send("orders", key="o-1", value={"amount": 3}).get(timeout=30)
    assert metadata.topic == "orders" and metadata.offset == 0
    for i in range(2, 11):
        producer.send("orders", key=f"o-{i}", value={"amount": i})
    producer.flush()
    producer.close()

    consumer = KafkaConsumer("orders", bootstrap_servers=servers, group_id="billing",
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=10_000,
                             key_deserializer=bytes.decode,
                             value_deserializer=lambda b: json.loads(b.decode("utf-8")))
    assert consumer.subscription() == {"orders"}
    seen = {}
    for record in consumer:
        seen[record.key] = record.value["amount"]
        assert record.timestamp == record.timestamp_ms > 0 and record.timestamp_type == 0
        if len(seen) == 10:
            break
    assert seen == {f"o-{i}": (3 if i == 1 else i) for i in range(1, 11)}
    assert "orders" in consumer.topics()
    figures = consumer.metrics()
    assert figures["consumer-fetch-manager-metrics"]["records-consumed-total"] >= 10
    assert figures["consumer-metrics"]["assigned-partitions"] >= 1
    consumer.close(autocommit=False)
    with Admin(bootstrap_servers=servers) as admin:  # nothing was committed
        described = admin.describe_group("billing")
        assert all(p.committed_offset is None for p in described.partitions)

    reader = KafkaConsumer("orders", bootstrap_servers=servers, auto_offset_reset="earliest")
    try:  # no group: every partition of the topics is assigned
        assert {tp.partition for tp in reader.assignment()} == {0, 1}
    finally:
        reader.close()


def test_what_fails_says_what_was_meant(broker_process):
    process = broker_process()
    with pytest.raises(TypeError, match="lingr_ms .did you mean linger_ms"):
        KafkaProducer(process.address, lingr_ms=5)
    with pytest.raises(TypeError, match="batch_sise .did you mean batch_size"):
        KafkaProducer(process.address, batch_sise=5)
    with pytest.raises(ValueError, match="bootstrap address HOST:PORT"):
        KafkaConsumer("orders", group_id="g")
    with pytest.raises(ValueError, match="only 'PLAINTEXT'"):
        KafkaProducer(bootstrap_servers=process.address, security_protocol="SSL")
    with KafkaProducer(bootstrap_servers=process.address) as producer:
        with pytest.raises(TypeError, match=r"not str: .*value.encode\(\).* "
                                            r"value_serializer="):
            producer.send("t", value="text")
    with pytest.raises(TypeError, match="connections_max_idle_ms .a kafka-python option this "
                                        "client does not have: connections stay open"):
        KafkaProducer(bootstrap_servers=process.address, connections_max_idle_ms=540_000)
    with pytest.raises(TypeError, match="sasl_plain_username .a kafka-python option this "
                                        "client does not have: no TLS or SASL"):
        KafkaConsumer(bootstrap_servers=process.address, sasl_plain_username="u")
    with pytest.raises(ValueError, match="batch_size_bytes is given twice"):
        KafkaProducer(process.address, batch_size=10, batch_size_bytes=10)


def test_the_memory_and_request_size_spellings_bound_the_producer(broker_process):
    """buffer_memory and max_request_size are kafka-python's names for ours: a record larger
    than max_request_size is refused before it is sent."""
    process = broker_process()
    with KafkaProducer(bootstrap_servers=process.address, buffer_memory=4 * 1024 * 1024,
                       max_request_size=64 * 1024) as producer:
        producer.send("sizes", value=b"x" * 1_000, partition=0).get(timeout=30)
        with pytest.raises(MessageTooLargeError, match="max_request_size"):
            producer.send("sizes", value=b"x" * 100_000, partition=0).get(timeout=30)


def test_the_script_in_client_md_runs_as_written(broker_process, tmp_path):
    """docs/client.md's kafka-python block, run unchanged but for the address, in a fresh
    interpreter: what a user copies must work."""
    process = broker_process("--group-initial-rebalance-delay-ms", "0")
    text = (pathlib.Path(__file__).parents[2] / "docs" / "client.md").read_text()
    section = text[text.index("## Coming from kafka-python"):]
    script = section[section.index("```python\n") + 10: section.index("```\n", 10)]
    assert "127.0.0.1:9092" in script
    path = tmp_path / "script.py"
    path.write_text(script.replace("127.0.0.1:9092", process.address))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    key, amount, timestamp = done.stdout.split()
    assert (key, amount) == ("b'o-1'", "3") and int(timestamp) > 0  # no key_deserializer
