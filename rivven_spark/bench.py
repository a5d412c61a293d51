"""``python -m rivven_spark.bench``: Spark batch-read throughput, Rivven next to parquet.

Theory of operation
-------------------
The question is what the Python data source costs against Spark's best native reader on the
same machine, in the same run. The benchmark

1. starts a ``rivven-broker`` subprocess (``--sync-policy none``, a temporary data directory)
   unless ``--bootstrap`` names a running one;
2. creates a topic of ``--partitions`` (4) partitions and produces ``--records`` (1,000,000)
   records of ``--size`` (100) random bytes each (seeded), no keys, no headers;
3. reads the topic once with Spark and writes it to a parquet file, so the parquet side holds
   exactly the same rows and columns;
4. reads each source ``--warmup`` (1) times untimed, alternating, then, ``--rounds`` times,
   alternating, reads each source in full into Spark's ``noop`` sink
   (``spark.read...load().write.format("noop")``) and times it.

It reports rows/s per round, best and median, and the ratio median(rivven) / median(parquet).
Spark runs ``local[2]``; the broker process runs beside it on the same machine, so the figure
includes the broker's own work.

The session has the setting docs/spark.md recommends for any Python data source:
``spark.python.unix.domain.socket.enabled=true`` (``--worker-socket unix``, the default). Over
Spark's default TCP link to its Python workers, every task stalls about 40 ms between the
task's command and its input (Nagle's algorithm on the JVM side against delayed ACKs on the
worker's); reads over it were 0.1-0.15 s slower and spent more CPU. ``--worker-socket tcp``
measures Spark's default. The parquet read uses no Python worker, so the setting does not touch it.

Wall time on a shared machine moves with whatever else runs, so each read also reports the
CPU seconds this process's children spent on it (the broker, Spark's JVM and its Python
workers; read from ``/proc``, Linux only, else omitted): a figure that waiting for the CPU
does not inflate, and that says where the cost is.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["main", "run"]


def _start_broker(data_dir: pathlib.Path) -> tuple[subprocess.Popen[bytes], str]:
    script = pathlib.Path(sys.executable).parent / "rivven-broker"
    command = [str(script)] if script.exists() else [
        sys.executable, "-m", "rivven_broker.cli.broker_main"]
    command += ["--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--http", "off",
                "--sync-policy", "none", "--log-level", "WARNING"]
    popen = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert popen.stdout is not None
    deadline = time.monotonic() + 30
    line = b""
    while b"\n" not in line:
        if time.monotonic() > deadline or popen.poll() is not None:
            popen.kill()
            raise RuntimeError("rivven-broker did not start")
        if select.select([popen.stdout], [], [], 1.0)[0]:
            line += os.read(popen.stdout.fileno(), 4096)
    return popen, line.split()[3].decode()


def _produce(bootstrap: str, topic: str, partitions: int, records: int, size: int) -> float:
    from rivven_broker.client import Admin, Producer

    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions)
    rng = random.Random(1)
    started = time.perf_counter()
    with Producer(bootstrap, acks="all", linger_ms=20) as producer:
        for i in range(records):
            producer.send(topic, value=rng.randbytes(size), partition=i % partitions)
        producer.flush()
    return time.perf_counter() - started


def _session(worker_socket: str = "unix") -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("rivven-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.python.unix.domain.socket.enabled", str(worker_socket == "unix").lower())
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _timed_noop(df: Any) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def _children_cpu_s() -> float | None:
    """CPU seconds (user + system) of every live descendant of this process; None off Linux."""
    proc = pathlib.Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick_hz = os.sysconf("SC_CLK_TCK")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rfind(")") + 2:].split()
        parent[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick_hz
    me, total = os.getpid(), 0.0
    for pid, seconds in cpu.items():
        ancestor = parent.get(pid, 0)
        while ancestor > 1 and ancestor != me:
            ancestor = parent.get(ancestor, 0)
        if ancestor == me:
            total += seconds
    return total


def _measured_noop(df: Any) -> tuple[float, float | None]:
    """(wall seconds, children's CPU seconds or None) of one read into the noop sink."""
    before = _children_cpu_s()
    wall_s = _timed_noop(df)
    after = _children_cpu_s()
    return wall_s, None if before is None or after is None else after - before


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; returns every figure (see the module docstring). Blocks."""
    with tempfile.TemporaryDirectory(prefix="rivven-spark-bench-", dir=args.dir) as tmp:
        directory = pathlib.Path(tmp)
        popen = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            popen, bootstrap = _start_broker(directory / "broker")
        try:
            topic = f"spark-bench-{random.Random().getrandbits(32):08x}"
            produce_s = _produce(bootstrap, topic, args.partitions, args.records, args.size)
            spark = _session(args.worker_socket)
            rivven = (spark.read.format("rivven").option("bootstrap", bootstrap)
                      .option("subscribe", topic).load())
            parquet_path = str(directory / "same-rows.parquet")
            rivven.write.parquet(parquet_path)
            parquet = spark.read.parquet(parquet_path)
            assert parquet.count() == args.records
            for _ in range(args.warmup):  # warm both paths: JIT, Python workers, file cache
                _timed_noop(rivven)
                _timed_noop(parquet)
            rivven_s, parquet_s = [], []
            rivven_cpu_s, parquet_cpu_s = [], []
            for _ in range(args.rounds):
                wall_s, cpu_s = _measured_noop(rivven)
                rivven_s.append(wall_s)
                rivven_cpu_s.append(cpu_s)
                wall_s, cpu_s = _measured_noop(parquet)
                parquet_s.append(wall_s)
                parquet_cpu_s.append(cpu_s)
            spark.stop()
        finally:
            if popen is not None:
                popen.kill()
                popen.wait()
                if popen.stdout is not None:
                    popen.stdout.close()
    rows = args.records
    result = {
        "records": rows, "size_bytes": args.size, "partitions": args.partitions,
        "rounds": args.rounds, "warmup": args.warmup, "worker_socket": args.worker_socket,
        "produce_s": round(produce_s, 3),
        "rivven_s": [round(s, 3) for s in rivven_s],
        "parquet_s": [round(s, 3) for s in parquet_s],
        "rivven_rows_per_s_best": round(rows / min(rivven_s)),
        "rivven_rows_per_s_median": round(rows / statistics.median(rivven_s)),
        "parquet_rows_per_s_best": round(rows / min(parquet_s)),
        "parquet_rows_per_s_median": round(rows / statistics.median(parquet_s)),
    }
    result["ratio_median"] = round(statistics.median(parquet_s) / statistics.median(rivven_s), 3)
    result["ratio_best"] = round(min(parquet_s) / min(rivven_s), 3)
    if None not in rivven_cpu_s + parquet_cpu_s:
        result["rivven_cpu_s"] = [round(s, 2) for s in rivven_cpu_s]  # type: ignore[arg-type]
        result["parquet_cpu_s"] = [round(s, 2) for s in parquet_cpu_s]  # type: ignore[arg-type]
    return result


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point. Blocks for the whole run (about a minute)."""
    parser = argparse.ArgumentParser(prog="python -m rivven_spark.bench",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", help="a running broker (default: start one)")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="value bytes per record")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed reads of each source first, alternating (default 1)")
    parser.add_argument("--worker-socket", choices=("unix", "tcp"), default="unix",
                        help="Spark's link to its Python workers (default unix: see the "
                             "module docstring; tcp is Spark's default)")
    parser.add_argument("--dir", default=None, help="parent of the temporary directory")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['records']:,} records of {result['size_bytes']} B, "
          f"{result['partitions']} partitions, {result['rounds']} rounds, Python workers over "
          f"{result['worker_socket']} sockets (seconds per read):")
    print(f"  rivven : {result['rivven_s']}  best {result['rivven_rows_per_s_best']:,} rows/s,"
          f" median {result['rivven_rows_per_s_median']:,} rows/s")
    print(f"  parquet: {result['parquet_s']}  best {result['parquet_rows_per_s_best']:,} rows/s,"
          f" median {result['parquet_rows_per_s_median']:,} rows/s")
    print(f"  rivven / parquet: {result['ratio_median']}x (medians), "
          f"{result['ratio_best']}x (bests)")
    if "rivven_cpu_s" in result:
        print(f"  CPU s per read (broker + JVM + Python workers): rivven {result['rivven_cpu_s']}"
              f", parquet {result['parquet_cpu_s']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
