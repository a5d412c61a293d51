"""The ``rivven`` command line against a real broker subprocess.

Method: most commands run in-process through ``main(argv)`` (fast; stdout captured by
``capsys``) with ``--json``, and the JSON documents are checked field by field; producing
from stdin and the exit codes are checked by running the real ``rivven`` executable as a
subprocess. Exit codes: 0 success, 1 broker error or bad usage, 2 nothing listening.
"""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys

import pytest

from rivven_broker.cli.rivven_main import encode_bytes, main


def rivven_command() -> list[str]:
    script = pathlib.Path(sys.executable).parent / "rivven"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "rivven_broker.cli.rivven_main"]


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*rivven_command(), *args], input=stdin, capture_output=True,
                          timeout=60)


def call(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def proc(broker_process):
    return broker_process("--sync-policy", "none")


def test_topic_commands_round_trip(proc, capsys):
    b = ("--bootstrap", proc.address, "--json")
    code, out, _ = call(capsys, *b, "topic", "create", "orders", "--partitions", "2",
                        "--config", "retention.ms=3600000")
    assert code == 0 and json.loads(out)["created"] is True
    code, out, _ = call(capsys, *b, "topic", "list")
    assert code == 0
    assert json.loads(out)["topics"] == [{"name": "orders", "partitions": 2, "is_internal": False}]
    code, out, _ = call(capsys, *b, "topic", "describe", "orders")
    doc = json.loads(out)
    assert code == 0 and doc["partitions"] == 2 and doc["replication_factor"] == 1
    assert doc["configs"]["retention.ms"]["value"] == "3600000"
    assert [p["partition"] for p in doc["partition_info"]] == [0, 1]
    code, out, _ = call(capsys, *b, "topic", "alter", "orders", "--config", "retention.ms=60000")
    assert code == 0
    code, out, _ = call(capsys, *b, "topic", "describe", "orders")
    assert json.loads(out)["configs"]["retention.ms"]["value"] == "60000"
    code, out, err = call(capsys, *b, "topic", "create", "orders")
    assert code == 1 and "TOPIC_ALREADY_EXISTS" in err
    code, out, _ = call(capsys, *b, "cluster", "status")
    assert code == 0 and json.loads(out)["partitions"] == 2
    code, out, _ = call(capsys, *b, "ping")
    assert code == 0 and json.loads(out)["rtt_ms"] >= 0
    code, out, _ = call(capsys, *b, "topic", "delete", "orders")
    assert code == 0
    code, out, _ = call(capsys, *b, "topic", "list")
    assert json.loads(out)["topics"] == []


def test_produce_from_stdin_then_consume(proc, capsys):
    created = run("--bootstrap", proc.address, "topic", "create", "lines", "--partitions", "1")
    assert created.returncode == 0
    lines = b"alpha\nbeta\n\xff\xfe\ngamma\n"
    result = run("--bootstrap", proc.address, "--json", "produce", "lines", "--key", "k",
                 stdin=lines)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["count"] == 4 and doc["partitions"]["0"] == {
        "count": 4, "first_offset": 0, "last_offset": 3}
    code, out, _ = call(capsys, "--bootstrap", proc.address, "--json", "consume", "lines",
                        "--from-beginning", "--max", "3")
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["offset"] for r in records] == [0, 1, 2]
    assert [r["value"] for r in records] == ["alpha", "beta", encode_bytes(b"\xff\xfe")]
    assert records[2]["value"] == {"base64": "//4="}
    assert all(r["key"] == "k" and r["topic"] == "lines" for r in records)
    # without --follow, consume stops at the end offsets seen when it started
    code, out, _ = call(capsys, "--bootstrap", proc.address, "consume", "lines",
                        "--from-beginning")
    assert code == 0 and out.splitlines() == [
        "0\t0\tk\talpha", "0\t1\tk\tbeta", "0\t2\tk\tbase64://4=", "0\t3\tk\tgamma"]
    code, out, _ = call(capsys, "--bootstrap", proc.address, "--json", "consume", "lines",
                        "--partition", "0", "--offset", "3")
    assert code == 0 and [json.loads(line)["value"] for line in out.splitlines()] == ["gamma"]


def test_broker_errors_exit_1(proc, capsys):
    code, _, err = call(capsys, "--bootstrap", proc.address, "topic", "describe", "missing")
    assert code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in err
    code, _, err = call(capsys, "--bootstrap", proc.address, "group", "describe", "missing")
    assert code == 1 and "GROUP_ID_NOT_FOUND" in err


def test_exit_codes_of_the_executable(proc):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    result = run("--bootstrap", dead, "topic", "list")
    assert result.returncode == 2 and b"cannot" in result.stderr
    result = run("--bootstrap", proc.address, "topic", "describe", "nope")
    assert result.returncode == 1
    result = run("--bootstrap", proc.address, "topic", "frobnicate")
    assert result.returncode == 1 and b"usage" in result.stderr
    assert run("--help").returncode == 0


def test_global_options_after_the_command_and_the_version(proc):
    """`rivven topic list --json` as rpk and kafka-topics users type it: --json, --bootstrap
    and --timeout-ms are accepted before or after the command (after wins); --version."""
    created = run("topic", "create", "late", "--partitions", "1", "--bootstrap", proc.address,
                  "--json")
    assert created.returncode == 0 and json.loads(created.stdout)["created"] is True
    listed = run("--bootstrap", "127.0.0.1:1", "topic", "list", "--json",
                 "--bootstrap", proc.address, "--timeout-ms", "5000")
    assert listed.returncode == 0, listed.stderr
    assert [t["name"] for t in json.loads(listed.stdout)["topics"]] == ["late"]
    version = run("--version")
    assert version.returncode == 0 and version.stdout.decode().startswith("rivven ")


def test_keys_headers_formats_and_starting_points(proc):
    """produce: a key per line (--key-separator) and headers (-H); consume: --format with
    every field, --offset -N (from the end) and a time (@ms, ISO-8601); topic describe shows
    each partition's log start and high watermark."""
    b = ("--bootstrap", proc.address)
    assert run(*b, "topic", "create", "fmt", "--partitions", "1").returncode == 0
    lines = b"".join(b"k%d:v%d\n" % (i, i) for i in range(5)) + b"no key here\n"
    produced = run(*b, "produce", "fmt", "--key-separator", ":", "-H", "src=cli",
                   "--json", stdin=lines)
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout)["count"] == 6
    shown = run(*b, "consume", "fmt", "--from-beginning", "--format", r"%p/%o %k=%v [%h]\n")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.decode().splitlines() == [
        *(f"0/{i} k{i}=v{i} [src=cli]" for i in range(5)), "0/5 -=no key here [src=cli]"]
    last_two = run(*b, "consume", "fmt", "--offset", "-2", "--format", r"%o\n")
    assert last_two.stdout.split() == [b"4", b"5"]
    at_epoch = run(*b, "consume", "fmt", "--offset", "@0", "--format", r"%o\n")
    assert len(at_epoch.stdout.split()) == 6  # every record is after 1970
    future = run(*b, "consume", "fmt", "--offset", "2999-01-01T00:00:00Z", "--format", r"%o\n")
    assert future.returncode == 0 and future.stdout == b""
    timed = run(*b, "consume", "fmt", "--from-beginning", "--max", "1", "--format", r"%t %T\n")
    millis, topic = timed.stdout.decode().split()
    assert int(millis) > 1_600_000_000_000 and topic == "fmt"
    assert run(*b, "consume", "fmt", "--offset", "soon").returncode == 1
    assert run(*b, "consume", "fmt", "--format", "%q").returncode == 1
    described = json.loads(run(*b, "--json", "topic", "describe", "fmt").stdout)
    (partition,) = described["partition_info"]
    assert (partition["log_start_offset"], partition["high_watermark"]) == (0, 6)
    assert partition["size_bytes"] > 6 * 10  # six batches of a record each, on disk


def test_partition_time_json_and_group_reset_as_a_user_runs_them(proc):
    """Each as its own `rivven` process: produce --partition; consume from a time in the
    middle of the log (@ms and ISO-8601, exact to the record though all records share one
    batch); consume --json; group reset-offsets as a dry run, then --execute, --shift-by and
    --to-datetime."""
    from rivven_broker.client import Admin, Consumer, Producer, TopicPartition

    b = ("--bootstrap", proc.address)
    assert run(*b, "topic", "create", "when", "--partitions", "2").returncode == 0
    # 2030-01-01T00:00:00Z + i minutes, one batch on partition 0
    base_ms = 1_893_456_000_000
    with Producer(proc.address, linger_ms=100) as producer:
        for i in range(6):
            producer.send("when", value=b"m%d" % i, partition=0, timestamp_ms=base_ms + i * 60_000)
    assert run(*b, "produce", "when", "--partition", "1", stdin=b"one\ntwo\n").returncode == 0
    on_one = run(*b, "consume", "when", "--partition", "1", "--from-beginning",
                 "--format", r"%p %v\n")
    assert on_one.stdout.decode().splitlines() == ["1 one", "1 two"], on_one.stderr

    def offsets_from(start: str) -> list[int]:
        done = run(*b, "consume", "when", "--partition", "0", "--offset", start,
                   "--format", r"%o\n")
        assert done.returncode == 0, done.stderr
        return [int(o) for o in done.stdout.split()]

    assert offsets_from(f"@{base_ms + 2 * 60_000}") == [2, 3, 4, 5]
    assert offsets_from(f"@{base_ms + 2 * 60_000 + 1}") == [3, 4, 5]
    assert offsets_from("2030-01-01T00:04:00Z") == [4, 5]

    as_json = run(*b, "consume", "when", "--partition", "0", "--offset", "-1", "--json")
    (doc,) = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert (doc["partition"], doc["offset"], doc["timestamp_ms"]) == (0, 5, base_ms + 300_000)

    with Consumer(proc.address, group_id="planned", enable_auto_commit=False) as consumer:
        consumer.assign([TopicPartition("when", 0)])
        consumer.seek(TopicPartition("when", 0), 0)
        consumer.commit({TopicPartition("when", 0): 3})

    def reset(*extra: str) -> dict:
        done = run(*b, "--json", "group", "reset-offsets", "planned", "--topic", "when", *extra)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def committed() -> int | None:
        with Admin(proc.address) as admin:
            parts = admin.describe_group("planned").partitions
        return {p.partition: p.committed_offset for p in parts}.get(0)

    plan = reset("--to", "earliest")
    assert (plan["executed"], plan["offsets"]["0"], plan["current"]["0"]) == (False, 0, 3)
    assert committed() == 3  # a dry run changes nothing
    assert reset("--shift-by", "-2", "--execute")["offsets"]["0"] == 1
    assert committed() == 1
    assert reset("--to-datetime", "2030-01-01T00:03:30Z", "--execute")["offsets"]["0"] == 4
    assert committed() == 4
