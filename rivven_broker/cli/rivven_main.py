"""``rivven``: the command line for topics, producing, consuming and cluster status.

Theory of operation
-------------------
``main(argv)`` parses the command line (argparse; usage errors exit 1, not argparse's 2, so the
exit codes stay CONTRACT's: 0 success, 1 an error the broker reported or bad usage, 2 cannot
connect), runs one command with the blocking client and prints either human-readable tables or,
with ``--json``, one JSON document (``consume``: one JSON object per record per line).

Bytes in JSON: a key, value or header value that is valid UTF-8 is printed as a string; any
other bytes as ``{"base64": "..."}``; null as ``null`` (docs/client.md).

``consume`` without ``--follow`` reads the end offsets of its partitions when it starts and
stops once it has reached them (or after ``--max`` records); with ``--follow`` it runs until
interrupted. ``consume --group G`` joins group G (committing what it printed when it stops)
and, without ``--follow``, stops once every partition it was assigned has reached the end
offset it had when the command started. ``group list|describe|delete|reset-offsets`` are the
group administration of docs/consumer-groups.md. ``bench`` hands its arguments to
``rivven_broker.bench.main``, imported only then.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import importlib
import json
import os
import sys
import time
from typing import Any, Callable, NoReturn, Sequence, TextIO

from rivven_broker import __version__
from rivven_broker.client import (
    Admin,
    ConnectionFailedError,
    Consumer,
    Producer,
    Record,
    RivvenError,
    TopicPartition,
)
from rivven_broker.server.cluster.key_file import generate_key

__all__ = ["main", "build_parser", "encode_bytes"]

EXIT_OK, EXIT_ERROR, EXIT_UNREACHABLE = 0, 1, 2


class UsageError(Exception):
    """Bad usage found after parsing (exit 1)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _add_global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options every command takes, before or after the command's name. Only the main
    parser has defaults: a subcommand's copies stay unset unless given, so they never
    overwrite a value given before the command."""
    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--bootstrap",
        default=default(os.environ.get("RIVVEN_BOOTSTRAP", "127.0.0.1:9092")),
        help="HOST:PORT[,HOST:PORT...] (default $RIVVEN_BOOTSTRAP or 127.0.0.1:9092)",
    )
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print JSON instead of tables")
    parser.add_argument("--timeout-ms", type=int, default=default(30_000),
                        help="request timeout")


class _Commands:
    """``add_parser`` that gives every command the global options too."""

    def __init__(self, subparsers: Any, common: argparse.ArgumentParser) -> None:
        self._subparsers = subparsers
        self._common = common

    def add_parser(self, name: str, *, global_options: bool = True,
                   **kwargs: Any) -> argparse.ArgumentParser:
        parents = [self._common] if global_options else []
        return self._subparsers.add_parser(name, parents=parents, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rivven", description="Rivven command line (see docs/client.md).")
    parser.add_argument("--version", action="version", version=f"rivven {__version__}")
    _add_global_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, defaults=False)
    commands = _Commands(
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), common)

    topic = commands.add_parser("topic", help="create, list, describe, alter, delete topics")
    topics = _Commands(topic.add_subparsers(dest="action", required=True, metavar="ACTION"),
                       common)
    create = topics.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=3)
    create.add_argument("--replication-factor", type=int, default=1)
    create.add_argument("--config", type=_key_value, action="append", default=[],
                        metavar="KEY=VALUE")
    topics.add_parser("list", help="list topics")
    topics.add_parser("describe", help="partitions, leaders and configs").add_argument("name")
    topics.add_parser("delete", help="delete a topic and its data").add_argument("name")
    alter = topics.add_parser(
        "alter", help="change topic configs (KEY= resets to default) and/or grow partitions")
    alter.add_argument("name")
    alter.add_argument("--config", type=_key_value, action="append", default=[],
                       metavar="KEY=VALUE")
    alter.add_argument("--partitions", type=int, metavar="N",
                       help="grow the topic to N partitions in total (it can only grow)")

    produce = commands.add_parser("produce", help="produce --value, or one record per stdin line")
    produce.add_argument("topic")
    produce.add_argument("--key", help="the key of every record (UTF-8)")
    produce.add_argument("--value", help="one record with this value (UTF-8); else stdin")
    produce.add_argument("--partition", type=int)
    produce.add_argument("-H", "--header", type=_key_value, action="append", default=[],
                         metavar="KEY=VALUE")
    produce.add_argument("--key-separator", metavar="SEP",
                         help="stdin lines are KEY SEP VALUE (split at the first SEP; a line "
                         "without it is a record without a key)")
    produce.add_argument("--acks", default="all", choices=["all", "1", "0"])
    produce.add_argument("--compression", default="none",
                         choices=["none", "gzip", "snappy", "lz4", "zstd"])

    consume = commands.add_parser("consume", help="print records of a topic")
    consume.add_argument("topic")
    consume.add_argument("--group", help="consume as a member of group G (commits on exit)")
    consume.add_argument("--from-beginning", action="store_true")
    consume.add_argument("--follow", action="store_true", help="keep waiting for new records")
    consume.add_argument("--max", type=int, help="stop after N records")
    consume.add_argument("--partition", type=int)
    consume.add_argument("--offset", metavar="O|-N|@MS|ISO-8601",
                         help="where to start: offset O (needs --partition), N before the "
                         "end, or the first record at or after a time (@ms since the epoch, "
                         "or an ISO-8601 time; no zone: UTC)")
    consume.add_argument("--format", metavar="FORMAT",
                         help="print each record by FORMAT: %%k key, %%v value, %%p partition, "
                         "%%o offset, %%t timestamp (ms), %%T topic, %%h headers (k=v,...), "
                         "%%%% a percent sign; \\n \\t escapes (default: "
                         "'%%p\\t%%o\\t%%k\\t%%v\\n')")
    consume.add_argument("--isolation", default="read_uncommitted",
                         choices=["read_uncommitted", "read_committed"])

    group = commands.add_parser("group", help="list, describe, delete, reset consumer groups")
    groups = _Commands(group.add_subparsers(dest="action", required=True, metavar="ACTION"),
                       common)
    groups.add_parser("list", help="list consumer groups")
    groups.add_parser("describe", help="members, assignments, offsets and lag").add_argument(
        "group")
    groups.add_parser("delete", help="delete a group without members").add_argument("group")
    reset = groups.add_parser(
        "reset-offsets", help="plan (and with --execute, apply) new committed offsets for a "
        "stopped group")
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", metavar="earliest|latest|OFFSET|timestamp=MS")
    where.add_argument("--shift-by", type=int, metavar="N",
                       help="N from the committed offset (negative: back), within the log")
    where.add_argument("--to-datetime", metavar="ISO-8601",
                       help="the first offset at or after this time, e.g. "
                       "2026-11-27T10:00:00Z (no zone: UTC)")
    reset.add_argument("--execute", action="store_true",
                       help="apply the plan (without it: print the plan only)")

    cluster = commands.add_parser("cluster", help="cluster status; a new cluster key")
    cluster.add_argument("action", choices=["status", "keygen"],
                         help="status: brokers and members as the bootstrap broker sees them; "
                         "keygen: print a new random key for --cluster-key-file")
    commands.add_parser("ping", help="round trip to a broker")
    bench = commands.add_parser("bench", help="benchmarks (docs/performance.md)",
                                add_help=False, global_options=False)
    bench.add_argument("args", nargs=argparse.REMAINDER)
    return parser


# --- output --------------------------------------------------------------------------------------
def encode_bytes(data: bytes | None) -> Any:
    """JSON form of bytes: the UTF-8 text when decodable, else ``{"base64": ...}``."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _text(data: bytes | None) -> str:
    if data is None:
        return "-"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")


def _table(out: TextIO, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")


class Output:
    def __init__(self, json_mode: bool, out: TextIO) -> None:
        self.json = json_mode
        self.out = out

    def document(self, doc: Any, human: Callable[[TextIO], None]) -> None:
        if self.json:
            json.dump(doc, self.out, sort_keys=True)
            self.out.write("\n")
        else:
            human(self.out)


# --- commands ------------------------------------------------------------------------------------
def _admin(args: argparse.Namespace) -> Admin:
    return Admin(args.bootstrap, request_timeout_ms=args.timeout_ms)


def cmd_topic(args: argparse.Namespace, out: Output) -> int:
    with _admin(args) as admin:
        if args.action == "create":
            admin.create_topic(args.name, args.partitions, args.replication_factor,
                               dict(args.config))
            doc = {"topic": args.name, "partitions": args.partitions,
                   "replication_factor": args.replication_factor, "created": True}
            out.document(doc, lambda o: o.write(
                f"created topic {args.name} ({args.partitions} partitions, "
                f"replication factor {args.replication_factor})\n"))
        elif args.action == "list":
            listing = admin.list_topics()
            doc = {"topics": [t._asdict() for t in listing]}
            rows = [(t.name, t.partitions, t.is_internal) for t in listing]
            out.document(doc, lambda o: _table(o, ["TOPIC", "PARTITIONS", "INTERNAL"], rows))
        elif args.action == "describe":
            description = admin.describe_topic(args.name)
            _describe(description, _log_offsets(admin, description), out)
        elif args.action == "delete":
            admin.delete_topic(args.name)
            out.document({"topic": args.name, "deleted": True},
                         lambda o: o.write(f"deleted topic {args.name}\n"))
        else:
            _alter(admin, args, out)
    return EXIT_OK


def _alter(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    """``topic alter``: configs (all or none) and/or a partition count (checked first)."""
    assert args.config or args.partitions is not None, "main() checks this"
    doc: dict[str, Any] = {"topic": args.name}
    lines = []
    if args.partitions is not None:  # refuse a bad count before changing any config
        admin.create_partitions(args.name, args.partitions, validate_only=True)
    if args.config:
        changes = {key: (value if value != "" else None) for key, value in args.config}
        admin.alter_topic_config(args.name, changes)
        doc["configs"] = changes
        lines.append(f"updated {len(changes)} config(s) of {args.name}\n")
    if args.partitions is not None:
        admin.create_partitions(args.name, args.partitions)
        doc["partitions"] = args.partitions
        lines.append(f"topic {args.name} now has {args.partitions} partitions\n")
    out.document(doc, lambda o: o.write("".join(lines)))


def _log_offsets(admin: Admin,
                 description: Any) -> dict[int, tuple[int | None, int | None, int | None]]:
    """``partition -> (log start, high watermark, size in bytes)`` from the leaders (None:
    not available, e.g. a partition without a leader)."""
    try:
        logs = admin.describe_logs(description.name)
    except RivvenError:
        logs = {}
    found: dict[int, tuple[int | None, int | None, int | None]] = {}
    for info in description.partition_info:
        tp = TopicPartition(description.name, info.partition)
        try:
            end = admin.list_offsets({tp: -1})[tp].offset
        except RivvenError:
            end = None
        log = logs.get(info.partition)
        found[info.partition] = (None if log is None else log.log_start_offset, end,
                                 None if log is None else log.size_bytes)
    return found


def _describe(description: Any,
              offsets: dict[int, tuple[int | None, int | None, int | None]],
              out: Output) -> None:
    doc = {
        "topic": description.name,
        "partitions": description.partitions,
        "replication_factor": description.replication_factor,
        "configs": {k: v._asdict() for k, v in sorted(description.configs.items())},
        "partition_info": [dict(p._asdict(), log_start_offset=offsets[p.partition][0],
                                high_watermark=offsets[p.partition][1],
                                size_bytes=offsets[p.partition][2])
                           for p in description.partition_info],
    }

    def human(o: TextIO) -> None:
        o.write(f"topic {description.name}: {description.partitions} partitions, "
                f"replication factor {description.replication_factor}\n\n")
        _table(o, ["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "LOG START",
                   "HIGH WATERMARK", "BYTES", "ERROR"],
               [(p.partition, p.leader, p.leader_epoch, ",".join(map(str, p.replicas)),
                 ",".join(map(str, p.isr)), *offsets[p.partition], p.error)
                for p in description.partition_info])
        o.write("\n")
        _table(o, ["CONFIG", "VALUE", "DEFAULT"],
               [(k, "<sensitive>" if v.is_sensitive else v.value, v.is_default)
                for k, v in sorted(description.configs.items())])

    out.document(doc, human)


def _read_records(args: argparse.Namespace) -> Any:
    """``(key, value)`` of each record to send: ``--value``, or stdin lines (split at the
    first ``--key-separator`` when given; ``--key`` is the key of the others)."""
    key = None if args.key is None else args.key.encode("utf-8")
    if args.value is not None:
        yield key, args.value.encode("utf-8")
        return
    separator = None if args.key_separator is None else args.key_separator.encode("utf-8")
    for line in sys.stdin.buffer:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if separator and separator in line:
            line_key, _, value = line.partition(separator)
            yield line_key, value
        else:
            yield key, line


def cmd_produce(args: argparse.Namespace, out: Output) -> int:
    with _admin(args) as admin:
        admin.ping()  # fail fast (exit 2) when nothing listens
    if args.key_separator == "":
        raise UsageError("--key-separator must not be empty")
    headers = [(k, v.encode("utf-8")) for k, v in args.header]
    futures = []
    with Producer(args.bootstrap, acks=args.acks, compression=args.compression,
                  request_timeout_ms=args.timeout_ms, max_block_ms=args.timeout_ms,
                  client_id="rivven-cli") as producer:
        for key, value in _read_records(args):
            futures.append(producer.send(args.topic, value=value, key=key,
                                         headers=headers or None, partition=args.partition))
        producer.flush()
    partitions: dict[int, dict[str, int]] = {}
    for future in futures:
        meta = future.result()  # raises the first delivery error (exit 1 or 2)
        entry = partitions.setdefault(meta.partition, {"count": 0, "first_offset": meta.offset})
        entry["count"] += 1
        entry["last_offset"] = meta.offset
    doc = {"topic": args.topic, "count": len(futures),
           "partitions": {str(p): v for p, v in sorted(partitions.items())}}
    out.document(doc, lambda o: o.write(
        f"produced {len(futures)} record(s) to {args.topic}"
        + "".join(f"\n  partition {p}: offsets {v['first_offset']}..{v['last_offset']}"
                  for p, v in sorted(partitions.items())) + "\n"))
    return EXIT_OK


def cmd_consume(args: argparse.Namespace, out: Output) -> int:
    if args.format is not None:  # a bad format fails before anything is read
        format_record(args.format, Record(args.topic, 0, 0, 0, None, None, ()))
    if args.group is not None:
        return _consume_group(args, out)
    start = _start(args.offset)
    if start is not None and start[0] == "offset" and args.partition is None:
        raise UsageError("--offset needs --partition")
    reset = "earliest" if args.from_beginning else "latest"
    with Consumer(bootstrap=args.bootstrap, auto_offset_reset=reset, isolation_level=args.isolation,
                  request_timeout_ms=args.timeout_ms, client_id="rivven-cli") as consumer:
        with _admin(args) as admin:
            admin.ping()  # fail fast (exit 2) when nothing listens
        partitions = consumer.partitions_for_topic(args.topic)
        if args.partition is not None:
            if args.partition not in partitions:
                raise UsageError(f"{args.topic} has no partition {args.partition}")
            partitions = [args.partition]
        tps = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(tps)
        _seek_to_start(consumer, tps, start)
        ends = None if args.follow else consumer.end_offsets(tps)
        _consume_loop(consumer, tps, ends, args.max, out, args.format)
    return EXIT_OK


def _start(text: str | None) -> tuple[str, int] | None:
    """``--offset``: ("offset", O), ("back", N) or ("time", ms); None: not given."""
    if text is None:
        return None
    text = text.strip()
    if text.isdigit():
        return "offset", int(text)
    if text.startswith("-") and text[1:].isdigit() and int(text[1:]) > 0:
        return "back", int(text[1:])
    if text.startswith("@") and text[1:].isdigit():
        return "time", int(text[1:])
    return "time", max(_iso_ms(text, "--offset", "an offset, -N, @MS or an ISO-8601 time"), 0)


def _iso_ms(text: str, option: str, expected: str) -> int:
    """Milliseconds since the epoch of an ISO-8601 time (``Z`` allowed; no zone: UTC)."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{option}: {text!r} is not {expected}, e.g. "
                         "2026-11-27T10:00:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return int(moment.timestamp() * 1000)


def _seek_to_start(consumer: Consumer, tps: list[TopicPartition],
                   start: tuple[str, int] | None) -> None:
    if start is None:
        return
    kind, value = start
    if kind == "offset":
        consumer.seek(tps[0], value)
    elif kind == "back":
        ends, beginnings = consumer.end_offsets(tps), consumer.beginning_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(ends[tp] - value, beginnings[tp]))
    else:
        found = consumer.offsets_for_times({tp: value for tp in tps})
        ends = consumer.end_offsets(tps)
        for tp in tps:
            at = found.get(tp)
            consumer.seek(tp, ends[tp] if at is None else at.offset)


def _consume_loop(consumer: Consumer, tps: list[TopicPartition], ends: dict | None,
                  limit: int | None, out: Output, form: str | None) -> None:
    seen = 0
    pending = set()
    if ends is not None:
        pending = {tp for tp in tps if consumer.position(tp) < ends[tp]}
    while (ends is None or pending) and (limit is None or seen < limit):
        for record in consumer.poll(timeout_ms=500):
            tp = TopicPartition(record.topic, record.partition)
            if ends is not None and record.offset >= ends[tp]:
                continue
            _print_record(record, out, form)
            seen += 1
            if limit is not None and seen >= limit:
                break
        if ends is not None:
            done = {tp for tp in pending if consumer.position(tp) >= ends[tp]}
            consumer.pause(done)  # nothing more to read there
            pending -= done
        out.out.flush()


def _consume_group(args: argparse.Namespace, out: Output) -> int:
    if args.partition is not None or args.offset is not None:
        raise UsageError("--group takes no --partition or --offset (the group assigns)")
    reset = "earliest" if args.from_beginning else "latest"
    with _admin(args) as admin:
        admin.ping()  # fail fast (exit 2) when nothing listens
        ends = None
        if not args.follow:
            partitions = admin.describe_topic(args.topic).partitions
            specs = {TopicPartition(args.topic, p): -1 for p in range(partitions)}
            ends = {tp: found.offset for tp, found in admin.list_offsets(specs).items()}
    with Consumer(bootstrap=args.bootstrap, group_id=args.group, auto_offset_reset=reset,
                  isolation_level=args.isolation, request_timeout_ms=args.timeout_ms,
                  client_id="rivven-cli") as consumer:
        consumer.subscribe([args.topic])
        seen = 0
        while args.max is None or seen < args.max:
            records = consumer.poll(timeout_ms=500, max_records=(
                None if args.max is None else min(args.max - seen, 500)))
            for record in records:
                _print_record(record, out, args.format)
            seen += len(records)
            out.out.flush()
            assigned = consumer.assignment()
            if ends is not None and assigned and not records and all(
                consumer.position(tp) >= ends.get(tp, 0) for tp in assigned
            ):
                break
    return EXIT_OK


_FORMAT_FIELDS = {
    "k": lambda r: _text(r.key), "v": lambda r: _text(r.value), "p": lambda r: str(r.partition),
    "o": lambda r: str(r.offset), "t": lambda r: str(r.timestamp_ms), "T": lambda r: r.topic,
    "h": lambda r: ",".join(f"{k}={_text(v)}" for k, v in r.headers), "%": lambda r: "%",
}


def format_record(form: str, record: Any) -> str:
    """rpk-style ``--format``: ``%k %v %p %o %t %T %h %%`` and ``\\n \\t \\\\`` escapes.

    Raises:
        UsageError: an unknown ``%`` directive or escape.
    """
    out = []
    index = 0
    while index < len(form):
        char = form[index]
        if char in "%\\" and index + 1 < len(form):
            code = form[index + 1]
            if char == "%" and code in _FORMAT_FIELDS:
                out.append(_FORMAT_FIELDS[code](record))
            elif char == "\\" and code in "nt\\":
                out.append({"n": "\n", "t": "\t", "\\": "\\"}[code])
            else:
                raise UsageError(f"--format: unknown {char}{code} (use %k %v %p %o %t %T %h "
                                 "%%, \\n \\t)")
            index += 2
            continue
        if char in "%\\":
            raise UsageError(f"--format: a lone {char} at the end")
        out.append(char)
        index += 1
    return "".join(out)


def _print_record(record: Any, out: Output, form: str | None = None) -> None:
    if form is not None and not out.json:
        out.out.write(format_record(form, record))
        return
    if out.json:
        doc = {
            "topic": record.topic, "partition": record.partition, "offset": record.offset,
            "timestamp_ms": record.timestamp_ms, "key": encode_bytes(record.key),
            "value": encode_bytes(record.value),
            "headers": [[k, encode_bytes(v)] for k, v in record.headers],
        }
        out.out.write(json.dumps(doc, sort_keys=True) + "\n")
    else:
        out.out.write(f"{record.partition}\t{record.offset}\t{_text(record.key)}\t"
                      f"{_text(record.value)}\n")


def cmd_cluster(args: argparse.Namespace, out: Output) -> int:
    if args.action == "keygen":  # no broker needed: 32 bytes from the OS, one line
        out.out.write(generate_key(os.urandom(32)) + "\n")
        return EXIT_OK
    with _admin(args) as admin:
        status = admin.cluster_status()
    doc = status._asdict()
    doc["brokers"] = [b._asdict() for b in status.brokers]
    doc["members"] = [member._asdict() for member in status.members]
    if status.raft is not None:
        doc["raft"] = {**status.raft._asdict(),
                       "voters": [voter._asdict() for voter in status.raft.voters]}

    def human(o: TextIO) -> None:
        o.write(f"cluster {status.cluster_id or '-'}: controller {status.controller_id}, "
                f"{status.topics} topics, {status.partitions} partitions "
                f"({status.partitions_without_leader} without leader)\n\n")
        _table(o, ["NODE", "HOST", "PORT", "RACK"],
               [(b.node_id, b.host, b.port, b.rack) for b in status.brokers])
        o.write("\nmembers (membership as this broker sees it):\n")
        _table(o, ["NODE", "STATE", "INCARNATION", "CLIENT", "CLUSTER", "RACK"],
               [(x.node_id, x.state, x.incarnation, f"{x.host}:{x.port}",
                 f"{x.cluster_host}:{x.cluster_port}" if x.cluster_host else "-", x.rack or "-")
                for x in status.members])
        raft = status.raft
        if raft is not None:
            o.write(f"\ncontroller (Raft) as this broker sees it: {raft.role} in term "
                    f"{raft.term}, leader {raft.leader if raft.leader is not None else '-'}, "
                    f"commit index {raft.commit_index}, applied {raft.last_applied}\n")
            _table(o, ["VOTER", "LINK", "MATCH INDEX"],
                   [(v.node_id, "up" if v.connected else "down",
                     "-" if v.match_index is None else v.match_index) for v in raft.voters])

    out.document(doc, human)
    return EXIT_OK


def cmd_ping(args: argparse.Namespace, out: Output) -> int:
    with _admin(args) as admin:
        admin.ping()  # connects and handshakes
        start = time.perf_counter()
        admin.ping()
        rtt_ms = (time.perf_counter() - start) * 1000
    out.document({"bootstrap": args.bootstrap, "rtt_ms": round(rtt_ms, 3)},
                 lambda o: o.write(f"pong from {args.bootstrap} in {rtt_ms:.2f} ms\n"))
    return EXIT_OK


def cmd_group(args: argparse.Namespace, out: Output) -> int:
    with _admin(args) as admin:
        if args.action == "list":
            listing = admin.list_groups()
            rows = [(g.group_id, g.state, g.protocol_type or "-") for g in listing]
            out.document({"groups": [g._asdict() for g in listing]},
                         lambda o: _table(o, ["GROUP", "STATE", "PROTOCOL TYPE"], rows))
        elif args.action == "describe":
            _describe_group(admin.describe_group(args.group), out)
        elif args.action == "delete":
            admin.delete_group(args.group)
            out.document({"group": args.group, "deleted": True},
                         lambda o: o.write(f"deleted group {args.group}\n"))
        else:
            _reset_offsets(admin, args, out)
    return EXIT_OK


def _reset_target(args: argparse.Namespace) -> str:
    if args.shift_by is not None:
        return f"shift={args.shift_by}"
    if args.to_datetime is not None:
        return f"timestamp={_iso_ms(args.to_datetime, '--to-datetime', 'an ISO-8601 time')}"
    return args.to


def _reset_offsets(admin: Admin, args: argparse.Namespace, out: Output) -> None:
    """``group reset-offsets``: a dry run printing the plan unless ``--execute``, as Kafka's
    kafka-consumer-groups.sh."""
    target = _reset_target(args)
    plan = admin.reset_offsets(args.group, args.topic, target, dry_run=True)
    try:
        current = {TopicPartition(p.topic, p.partition): p.committed_offset
                   for p in admin.describe_group(args.group).partitions}
    except RivvenError:
        current = {}
    if args.execute:
        plan = admin.reset_offsets(args.group, args.topic, target)
    rows = [(tp.topic, tp.partition, current.get(tp), offset)
            for tp, offset in sorted(plan.items())]
    doc = {"group": args.group, "topic": args.topic, "executed": args.execute,
           "offsets": {str(tp.partition): o for tp, o in sorted(plan.items())},
           "current": {str(tp.partition): current.get(tp) for tp in sorted(plan)}}

    def human(o: TextIO) -> None:
        _table(o, ["TOPIC", "PARTITION", "CURRENT", "NEW OFFSET"], rows)
        if not args.execute:
            o.write("dry run: nothing changed; add --execute to apply\n")

    out.document(doc, human)


def _describe_group(description: Any, out: Output) -> None:
    doc = {
        "group": description.group_id, "state": description.state,
        "protocol_type": description.protocol_type, "protocol": description.protocol,
        "members": [
            dict(m._asdict(), assignment=[list(tp) for tp in m.assignment])
            for m in description.members
        ],
        "partitions": [p._asdict() for p in description.partitions],
    }

    def human(o: TextIO) -> None:
        o.write(f"group {description.group_id}: {description.state}, protocol "
                f"{description.protocol or '-'}, {len(description.members)} members\n\n")
        _table(o, ["TOPIC", "PARTITION", "COMMITTED", "LOG END", "LAG", "MEMBER"],
               [(p.topic, p.partition, p.committed_offset, p.log_end_offset, p.lag,
                 p.member_id or None) for p in description.partitions])
        if description.members:
            o.write("\n")
            _table(o, ["MEMBER", "INSTANCE", "CLIENT", "HOST", "PARTITIONS"],
                   [(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                     ",".join(f"{tp.topic}-{tp.partition}" for tp in m.assignment) or None)
                    for m in description.members])

    out.document(doc, human)


def cmd_bench(args: argparse.Namespace, out: Output) -> int:
    try:
        bench = importlib.import_module("rivven_broker.bench")
        entry = getattr(bench, "main", None)
        if entry is None:
            entry = importlib.import_module("rivven_broker.bench.__main__").main
    except (ModuleNotFoundError, AttributeError) as error:
        raise UsageError(f"the benchmark tool is not available: {error}") from error
    os.environ.setdefault("RIVVEN_BOOTSTRAP", args.bootstrap)
    return int(entry(list(args.args)) or 0)


COMMANDS = {"topic": cmd_topic, "produce": cmd_produce, "consume": cmd_consume,
            "group": cmd_group, "cluster": cmd_cluster, "ping": cmd_ping, "bench": cmd_bench}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``rivven``; returns the exit code (0 ok, 1 broker error or bad usage, 2 unreachable)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if args.command == "bench":  # everything after "bench" is the tool's, verbatim
        args.args = argv[argv.index("bench") + 1:]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "topic" and args.action == "alter":
        if not args.config and args.partitions is None:
            parser.error("topic alter needs --config KEY=VALUE and/or --partitions N")
    out = Output(args.json, sys.stdout)
    try:
        return COMMANDS[args.command](args, out)
    except ConnectionFailedError as error:
        _report(error.message, args.json)
        return EXIT_UNREACHABLE
    except (RivvenError, UsageError) as error:
        _report(str(error), args.json)
        return EXIT_ERROR
    except ValueError as error:  # a bad option value (client configuration)
        _report(str(error), args.json)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `rivven consume ... | head`
        sys.stderr.close()
        return EXIT_OK


def _report(message: str, json_mode: bool) -> None:
    if json_mode:
        sys.stderr.write(json.dumps({"error": message}) + "\n")
    else:
        sys.stderr.write(f"rivven: error: {message}\n")


if __name__ == "__main__":
    sys.exit(main())
