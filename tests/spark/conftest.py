"""Shared fixtures of the Spark tests: one SparkSession and one broker for the whole session.

Goal: real end-to-end runs of ``format("rivven")`` without paying Spark's start-up per test.
Method: a session-scoped ``spark`` fixture (``local[2,3]``: two cores, and up to three
attempts per task so a test can fail a task on purpose; UI off; two shuffle partitions) and a
session-scoped ``broker`` that runs the real ``rivven-broker`` executable as a subprocess on
free ports (``sync-policy none``: durability is not what these tests check). Every test uses
its own topics and ``tmp_path`` checkpoints. The environment Spark's Python workers need is
set before the JVM starts: ``PYSPARK_PYTHON`` (this interpreter, or the workers would run the
system ``python3``), ``SPARK_LOCAL_IP=127.0.0.1`` and ``PYTHONPATH`` (the checkout, so
workers can import test-defined classes). A missing Java or pyspark fails the suite (set
RIVVEN_SKIP_SPARK=1 to skip it on purpose).

Helpers: ``broker.create(topic, partitions)``, ``broker.produce(topic, records)``
(``records``: ``(partition, key, value)`` or ``(partition, key, value, headers)``) and
``broker.read(topic, isolation_level=...)``, which reads a whole topic with the client's
``Consumer`` (an implementation independent of the data source) as
``(partition, offset, key, value)`` tuples.
"""

from __future__ import annotations

import os
import pathlib
import select
import shutil
import subprocess
import sys
import time
from typing import Iterable, Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# `make test` installs Java (Debian's headless JRE) and the spark extra, so a missing one is a
# broken set-up, and a suite that passes by skipping hides it: fail, unless skipping is asked
# for explicitly (RIVVEN_SKIP_SPARK=1, for machines that cannot run Spark at all).
if os.environ.get("RIVVEN_SKIP_SPARK") == "1":
    pytest.skip("RIVVEN_SKIP_SPARK=1", allow_module_level=True)
if shutil.which("java") is None:
    raise RuntimeError("the Spark tests need Java 17+ (make test installs default-jre-headless; "
                       "RIVVEN_SKIP_SPARK=1 skips them)")
import pyarrow  # noqa: E402,F401  (a missing spark extra fails here, loudly)
import pyspark  # noqa: E402,F401

from rivven_broker.client import Admin, Consumer, Producer, TopicPartition  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if pathlib.Path(str(item.fspath)).is_relative_to(pathlib.Path(__file__).parent):
            item.add_marker(pytest.mark.spark)


class BrokerUnderTest:
    """A ``rivven-broker`` subprocess and the helpers the Spark tests use."""

    def __init__(self, data_dir: pathlib.Path) -> None:
        script = pathlib.Path(sys.executable).parent / "rivven-broker"
        command = [str(script)] if script.exists() else [
            sys.executable, "-m", "rivven_broker.cli.broker_main"]
        command += ["--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--http", "off",
                    "--sync-policy", "none", "--log-level", "WARNING"]
        self.popen = subprocess.Popen(command, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL)
        line = self._ready_line()
        self.address = line.split()[3]  # "rivven-broker ready: clients HOST:PORT http ..."
        self.admin = Admin(self.address)

    def _ready_line(self) -> str:
        assert self.popen.stdout is not None
        deadline = time.monotonic() + 30
        buffered = b""
        while b"\n" not in buffered:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.popen.poll() is not None:
                self.popen.kill()
                raise RuntimeError("rivven-broker did not start")
            if select.select([self.popen.stdout], [], [], remaining)[0]:
                buffered += os.read(self.popen.stdout.fileno(), 4096)
        return buffered.split(b"\n", 1)[0].decode()

    def create(self, topic: str, partitions: int = 1) -> str:
        self.admin.create_topic(topic, partitions=partitions)
        return topic

    def produce(self, topic: str, records: Iterable[tuple]) -> int:
        count = 0
        with Producer(self.address, acks="all", linger_ms=20) as producer:
            futures = []
            for partition, key, value, *headers in records:
                futures.append(producer.send(topic, value=value, key=key, partition=partition,
                                             headers=headers[0] if headers else None))
                count += 1
            producer.flush()
            for future in futures:
                future.result()
        return count

    def end_offsets(self, topic: str, isolation_level: str = "read_uncommitted") -> dict:
        partitions = self.admin.describe_topic(topic).partitions
        specs = {TopicPartition(topic, p): -1 for p in range(partitions)}
        found = self.admin.list_offsets(specs, isolation_level=isolation_level)
        return {tp.partition: offset.offset for tp, offset in found.items()}

    def read(self, topic: str, isolation_level: str = "read_uncommitted") -> list[tuple]:
        ends = self.end_offsets(topic, isolation_level)
        out = []
        with Consumer(self.address, auto_offset_reset="earliest",
                      isolation_level=isolation_level) as consumer:
            consumer.assign([TopicPartition(topic, p) for p in ends])
            positions = {p: 0 for p in ends}
            deadline = time.monotonic() + 60
            while any(positions[p] < ends[p] for p in ends):
                assert time.monotonic() < deadline, f"could not read {topic} to its end"
                for record in consumer.poll(timeout_ms=500):
                    if record.offset < ends[record.partition]:
                        out.append((record.partition, record.offset, record.key, record.value))
                    positions[record.partition] = record.offset + 1
                for p in ends:  # partitions that end with aborted data or markers
                    positions[p] = max(positions[p], consumer.position(TopicPartition(topic, p)))
        return sorted(out)

    def stop(self) -> None:
        self.admin.close()
        self.popen.kill()
        self.popen.wait(30)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerUnderTest]:
    running = BrokerUnderTest(tmp_path_factory.mktemp("spark-broker"))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("rivven-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
