"""Thin raw-protocol pieces for the peers: Redis RESP (XADD, XREAD) and NATS (PUB, JetStream).

Theory of operation
-------------------
The peers' Python client libraries are slower than the servers and would measure themselves,
so the load generators speak the wire protocols directly, and this module holds everything
about those protocols that is not I/O: command encoding, request *templates*, and reply
counting/parsing. Pure and unit-tested; the worker processes (``peer_load.py``) own sockets.

A ``Template`` is the bytes of one request (a pipeline of ``batch`` XADDs, or ``batch`` NATS
PUBs) with the position of every record value in it. Each send copies the template and writes
the unit's ``ledger.MARK`` (producer, sequence, send time) at each position, so every message
is distinct and checkable, at the cost of one ``pack_into`` per message.

Counting replies without parsing each one (the load core must not be the bottleneck):
- Redis answers each XADD with a bulk string ``$<n>\\r\\n<id>\\r\\n``; an entry id holds only
  digits and ``-``, so the replies in a chunk are ``chunk.count(b"$")``. An error reply
  starts with ``-`` at the start of a line, which ``RespReplyCounter`` detects.
- NATS JetStream answers each PUB (with a reply subject) with one ``MSG`` to that subject;
  ``NatsAckCounter`` counts ``MSG `` with the last bytes of the previous chunk carried over
  (a marker split between two reads is counted once) and notices ``PING`` and errors.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

import attrs

from rivven_broker.bench.ledger import MARK, MARK_BYTES

__all__ = [
    "Template",
    "resp_command",
    "xadd_template",
    "RespReplyCounter",
    "RespError",
    "XREAD_ENTRY",
    "parse_xread",
    "nats_connect",
    "nats_pub",
    "pub_template",
    "NatsAckCounter",
    "NatsError",
    "jetstream_stream_config",
    "jetstream_consumer_config",
    "nats_server_config",
    "redis_server_args",
    "parse_nats_messages",
]


class RespError(RuntimeError):
    """Redis answered with an error reply."""


class NatsError(RuntimeError):
    """NATS answered with ``-ERR`` or a JetStream error."""


@attrs.frozen
class Template:
    """One request's bytes and where each message's value (and so its mark) starts."""

    data: bytes
    positions: tuple[int, ...]

    def fill(self, producer: int, first_sequence: int, send_ns: int) -> bytearray:
        """A copy with message ``i`` marked ``(producer, first_sequence + i, send_ns)``."""
        buf = bytearray(self.data)
        pack = MARK.pack_into
        sequence = first_sequence
        for position in self.positions:
            pack(buf, position, producer, sequence, send_ns)
            sequence += 1
        return buf


# --- Redis ------------------------------------------------------------------------------------


def resp_command(*args: bytes | str | int) -> bytes:
    """One RESP command (an array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, int):
            arg = str(arg)
        if isinstance(arg, str):
            arg = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


def xadd_template(stream: str, value_bytes: int, count: int) -> Template:
    """``count`` pipelined ``XADD stream * d <value>`` with values of ``value_bytes``."""
    assert value_bytes >= MARK_BYTES and count >= 1
    one = resp_command(b"XADD", stream, b"*", b"d", b"\x00" * value_bytes)
    value_at = len(one) - 2 - value_bytes
    return Template(one * count, tuple(value_at + i * len(one) for i in range(count)))


class RespReplyCounter:
    """Counts XADD replies (bulk strings) in a stream of chunks; raises on an error reply."""

    __slots__ = ("replies", "_last")

    def __init__(self) -> None:
        self.replies = 0
        self._last = b"\n"  # the byte before the stream: a line start

    def feed(self, chunk: bytes) -> int:
        """Count the replies starting in ``chunk``; return the running total.

        Raises:
            RespError: an error reply (a line starting with ``-``) appeared.
        """
        if not chunk:
            return self.replies
        if (self._last == b"\n" and chunk[:1] == b"-") or b"\n-" in chunk:
            start = chunk.find(b"-")
            raise RespError(chunk[start : start + 200].split(b"\r\n")[0].decode(errors="replace"))
        self._last = chunk[-1:]
        self.replies += chunk.count(b"$")
        return self.replies


#: One XREAD entry with a single field ``d``: captures the id and the value length.
XREAD_ENTRY = re.compile(rb"\*2\r\n\$\d+\r\n(\d+-\d+)\r\n\*2\r\n\$1\r\nd\r\n\$(\d+)\r\n")
_ARRAY = re.compile(rb"\*(-?\d+)\r\n")


def parse_xread(buf: bytes) -> tuple[int, list[tuple[bytes, bytes]]] | None:
    """Parse one complete ``XREAD ... STREAMS s id`` reply at the start of ``buf``.

    Returns ``(bytes consumed, [(entry id, value), ...])`` or None when ``buf`` does not yet
    hold the whole reply. A null reply (nothing new) gives an empty list.

    Raises:
        RespError: an error reply or a shape other than one stream of ``d`` entries.
    """
    if buf[:1] == b"-":
        end = buf.find(b"\r\n")
        if end < 0:
            return None
        raise RespError(buf[:end].decode(errors="replace"))
    top = _ARRAY.match(buf)
    if top is None:
        return None if len(buf) < 16 and b"\r\n" not in buf else _bad(buf)
    if int(top.group(1)) <= 0:
        return top.end(), []
    # *1 -> *2 -> $<len> name -> *<entries>
    pos = top.end()
    second = _ARRAY.match(buf, pos)
    if second is None:
        return None if len(buf) - pos < 16 else _bad(buf)
    pos = second.end()
    if buf[pos : pos + 1] != b"$":
        return None if pos >= len(buf) else _bad(buf)
    line_end = buf.find(b"\r\n", pos)
    if line_end < 0:
        return None
    pos = line_end + 2 + int(buf[pos + 1 : line_end]) + 2
    entries_head = _ARRAY.match(buf, pos)
    if entries_head is None:
        return None if len(buf) - pos < 16 else _bad(buf)
    pos = entries_head.end()
    out: list[tuple[bytes, bytes]] = []
    match = XREAD_ENTRY.match
    for _ in range(int(entries_head.group(1))):
        entry = match(buf, pos)
        if entry is None:
            return None if len(buf) - pos < 64 else _bad(buf)
        start = entry.end()
        end = start + int(entry.group(2))
        if end + 2 > len(buf):
            return None
        out.append((entry.group(1), buf[start:end]))
        pos = end + 2
    return pos, out


def _bad(buf: bytes) -> None:
    raise RespError(f"unexpected XREAD reply: {buf[:80]!r}")


def redis_server_args(port: int, directory: str, appendfsync: str) -> list[str]:
    """``redis-server`` flags: loopback only, no RDB snapshots, AOF per ``appendfsync``
    (``always``/``everysec``; ``no`` turns the AOF off)."""
    args = [
        "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
        "--dir", directory, "--save", "", "--daemonize", "no", "--logfile", "",
        "--loglevel", "warning",
    ]
    if appendfsync == "no":
        args += ["--appendonly", "no"]
    else:
        args += ["--appendonly", "yes", "--appendfsync", appendfsync]
    return args


# --- NATS -------------------------------------------------------------------------------------


def nats_connect(name: str = "rivven-bench") -> bytes:
    """The CONNECT line (headers on: JetStream status messages need them) and a PING."""
    options = {
        "verbose": False, "pedantic": False, "tls_required": False, "name": name,
        "lang": "python-raw", "version": "0", "protocol": 1, "headers": True,
        "no_responders": True,
    }
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + b"\r\nPING\r\n"


def nats_pub(subject: str, reply: str | None, payload: bytes) -> bytes:
    """One ``PUB`` frame."""
    head = f"PUB {subject} {reply} {len(payload)}" if reply else f"PUB {subject} {len(payload)}"
    return head.encode() + b"\r\n" + payload + b"\r\n"


def pub_template(subject: str, reply: str, value_bytes: int, count: int) -> Template:
    """``count`` PUBs of ``value_bytes`` each, all answered to ``reply``."""
    assert value_bytes >= MARK_BYTES and count >= 1
    one = nats_pub(subject, reply, b"\x00" * value_bytes)
    value_at = len(one) - 2 - value_bytes
    return Template(one * count, tuple(value_at + i * len(one) for i in range(count)))


class NatsAckCounter:
    """Counts ``MSG`` deliveries (JetStream publish acks) in a stream of chunks."""

    __slots__ = ("acks", "_tail", "pings")

    def __init__(self) -> None:
        self.acks = 0
        self.pings = 0
        self._tail = b""

    def feed(self, chunk: bytes) -> int:
        """Count the acks completed by ``chunk``; return the running total. ``pings`` counts
        the server's PINGs seen (the caller answers each with PONG).

        Raises:
            NatsError: ``-ERR`` or a JetStream error answer.
        """
        tail = self._tail
        data = tail + chunk
        if b"-ERR" in data or b'"error"' in data:
            start = max(data.find(b"-ERR"), data.find(b'"error"'))
            raise NatsError(data[start : start + 200].decode(errors="replace"))
        # Markers wholly inside the carried tail were counted with the previous chunk.
        self.acks += data.count(b"MSG ") - tail.count(b"MSG ")
        self.pings += data.count(b"PING\r\n") - tail.count(b"PING\r\n")
        self._tail = data[-5:]
        return self.acks


_MSG = re.compile(rb"MSG [^\r\n]* (\d+)\r\n")
_HMSG = re.compile(rb"HMSG [^\r\n]* (\d+) (\d+)\r\n")


def parse_nats_messages(buf: bytes, pos: int = 0) -> tuple[int, list[bytes], list[bytes], int]:
    """Parse whole NATS server messages from ``buf[pos:]``.

    Returns ``(new position, payloads of MSG, header blocks of HMSG, PINGs)``; an incomplete
    message at the end is left for the next call. ``+OK``, ``PONG`` and ``INFO`` are skipped.
    JetStream sends pull statuses (``NATS/1.0 404 No Messages`` ...) as HMSG headers.

    Raises:
        NatsError: ``-ERR``.
    """
    payloads: list[bytes] = []
    statuses: list[bytes] = []
    pings = 0
    match = _MSG.match
    end = len(buf)
    while pos < end:
        found = match(buf, pos)
        if found is not None:
            start = found.end()
            stop = start + int(found.group(1))
            if stop + 2 > end:
                break
            payloads.append(buf[start:stop])
            pos = stop + 2
            continue
        found = _HMSG.match(buf, pos)
        if found is not None:  # HMSG ... <header bytes> <total bytes>
            start = found.end()
            stop = start + int(found.group(2))
            if stop + 2 > end:
                break
            statuses.append(buf[start : start + int(found.group(1))])
            pos = stop + 2
            continue
        line_end = buf.find(b"\r\n", pos)
        if line_end < 0:
            break
        line = buf[pos:line_end]
        if line.startswith(b"-ERR"):
            raise NatsError(line.decode(errors="replace"))
        if line == b"PING":
            pings += 1
        elif line.startswith((b"MSG", b"HMSG")):
            raise NatsError(f"unparsable message line {line[:80]!r}")
        pos = line_end + 2
    return pos, payloads, statuses, pings


def jetstream_stream_config(name: str, subjects: Sequence[str]) -> bytes:
    """The JSON body of ``$JS.API.STREAM.CREATE.<name>``: file storage, one replica."""
    config = {
        "name": name, "subjects": list(subjects), "storage": "file", "retention": "limits",
        "discard": "old", "num_replicas": 1, "max_msgs": -1, "max_bytes": -1,
    }
    return json.dumps(config, separators=(",", ":")).encode()


def jetstream_consumer_config(stream: str, durable: str) -> bytes:
    """The JSON body of ``$JS.API.CONSUMER.DURABLE.CREATE.<stream>.<durable>``: a pull
    consumer from the first message, no acks (``AckNone``)."""
    config = {
        "stream_name": stream,
        "config": {
            "durable_name": durable, "ack_policy": "none", "deliver_policy": "all",
            "replay_policy": "instant", "max_waiting": 512,
        },
    }
    return json.dumps(config, separators=(",", ":")).encode()


def nats_server_config(port: int, store_dir: str, sync: str) -> str:
    """A ``nats-server`` config: loopback only, JetStream file store in ``store_dir``;
    ``sync`` ``always`` fsyncs every write, ``default`` keeps the server's default."""
    assert sync in ("always", "default")
    sync_line = "  sync_interval: always\n" if sync == "always" else ""
    return (
        f"listen: 127.0.0.1:{port}\n"
        "max_payload: 8MB\n"
        "jetstream {\n"
        f"  store_dir: {json.dumps(store_dir)}\n"
        "  max_file_store: 64GB\n"
        f"{sync_line}"
        "}\n"
    )
