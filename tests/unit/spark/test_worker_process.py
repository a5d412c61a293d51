"""``tune_worker_process``: once per reused Spark worker process, garbage collected first.

Goal: the executor-side tuning (heap frozen, freed memory kept for reuse) happens exactly where
it pays (a reused Spark Python worker: ``SPARK_REUSE_WORKER=1``), once per process (again in a
forked child), never in other processes, and never freezes garbage. Method: both settings are
process-wide, so each case runs in a fresh interpreter, never in pytest's own; the readers' and
writers' entry points are checked to call it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("pyspark")

from rivven_spark import reader as reader_module  # noqa: E402
from rivven_spark import writer as writer_module  # noqa: E402
from rivven_spark.options import parse_reader_options  # noqa: E402
from rivven_spark.reader import RivvenBatchReader, RivvenInputPartition  # noqa: E402
from tests.unit.test_process_memory import FAULTS_PER_BLOCK_SOURCE  # noqa: E402

_PROBE = """
import gc, json, os, weakref
from rivven_spark.worker_process import tune_worker_process

class Node:
    pass

cycle = Node(); cycle.self = cycle  # garbage only a collection can free
alive = weakref.ref(cycle)
del cycle
result = {"first": tune_worker_process(), "frozen": gc.get_freeze_count(),
          "garbage_frozen": alive() is not None}
result["faults_per_block"] = faults_per_block()
result["second"] = tune_worker_process()
result["frozen_after_second"] = gc.get_freeze_count()
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write_end, b"1" if tune_worker_process() else b"0")
    os._exit(0)
os.waitpid(pid, 0)
result["child"] = os.read(read_end, 1) == b"1"
print(json.dumps(result))
"""


def probe(reuse: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REUSE_WORKER"}
    if reuse is not None:
        env["SPARK_REUSE_WORKER"] = reuse
    out = subprocess.run([sys.executable, "-c", FAULTS_PER_BLOCK_SOURCE + _PROBE], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_a_reused_worker_collects_then_freezes_once_per_process() -> None:
    result = probe("1")
    assert result["first"] is True
    assert result["frozen"] > 1000  # the interpreter's and the imports' objects
    assert result["garbage_frozen"] is False
    if sys.platform == "linux" and platform.libc_ver()[0] == "glibc":
        assert result["faults_per_block"] < 16  # freed blocks reused (test_process_memory.py)
    assert result["second"] is False
    assert result["frozen_after_second"] == result["frozen"]
    assert result["child"] is True  # a forked worker freezes its own heap


@pytest.mark.parametrize("reuse", [None, "0"])
def test_nothing_is_frozen_outside_a_reused_worker(reuse: str | None) -> None:
    result = probe(reuse)
    assert result["first"] is False
    assert result["frozen"] == 0
    assert result["child"] is False


def test_executor_entry_points_freeze_the_worker_heap(monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(reader_module, "tune_worker_process", lambda: calls.append("read"))
    monkeypatch.setattr(reader_module, "read_range", lambda options, part: iter(()))
    reader = RivvenBatchReader(parse_reader_options(
        {"bootstrap": "127.0.0.1:1", "subscribe": "t"}, streaming=False))
    assert list(reader.read(RivvenInputPartition("t", 0, 0, 1))) == []
    monkeypatch.setattr(writer_module, "tune_worker_process", lambda: calls.append("write"))
    monkeypatch.setattr(writer_module, "write_task", lambda *args: None)
    for writer_class in (writer_module.RivvenBatchWriter, writer_module.RivvenStreamWriter):
        writer = writer_class.__new__(writer_class)
        writer._options = writer._columns = None
        if writer_class is writer_module.RivvenStreamWriter:
            monkeypatch.setattr(writer_module, "_identity", lambda: None)
        writer.write(iter(()))
    assert calls == ["read", "write", "write"]
