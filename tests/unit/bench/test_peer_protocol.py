"""The peers' thin wire clients: RESP and NATS encoding, templates, reply counting, parsing.

Method: compare encodings with the protocols' documented byte forms; fill templates and read
the marks back; feed reply streams cut at every possible point (Hypothesis chooses the cuts)
and check the counters count each reply once and notice errors and PINGs; parse XREAD replies
and NATS message streams, whole and truncated.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.bench.ledger import MARK
from rivven_broker.bench.peer_protocol import (
    NatsAckCounter,
    NatsError,
    RespError,
    RespReplyCounter,
    jetstream_consumer_config,
    jetstream_stream_config,
    nats_connect,
    nats_pub,
    nats_server_config,
    parse_nats_messages,
    parse_xread,
    pub_template,
    redis_server_args,
    resp_command,
    xadd_template,
)


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    pieces, last = [], 0
    for point in points + [len(data)]:
        pieces.append(data[last:point])
        last = point
    return pieces


def test_resp_command_is_an_array_of_bulk_strings():
    assert resp_command(b"XADD", "s", b"*", 5) == b"*4\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\n5\r\n"


def test_xadd_template_marks_every_value():
    template = xadd_template("bench", 32, 3)
    filled = bytes(template.fill(9, 100, 777))
    assert filled.count(b"XADD") == 3
    assert [MARK.unpack_from(filled, p) for p in template.positions] == [
        (9, 100, 777), (9, 101, 777), (9, 102, 777)
    ]
    one = resp_command(b"XADD", "bench", b"*", b"d", MARK.pack(9, 100, 777) + bytes(12))
    assert filled.startswith(one)
    assert MARK.unpack_from(template.data, template.positions[0]) == (0, 0, 0)  # untouched


REPLY = b"$15\r\n1700000000000-0\r\n"


@given(st.integers(0, 50), st.lists(st.integers(0, 2000), max_size=10))
def test_resp_counter_counts_each_reply_once_however_cut(replies, cuts):
    counter = RespReplyCounter()
    for piece in _cut(REPLY * replies, cuts):
        counter.feed(piece)
    assert counter.replies == replies


def test_resp_counter_raises_on_error_replies():
    with pytest.raises(RespError, match="ERR wrong"):
        RespReplyCounter().feed(b"-ERR wrong number\r\n")
    counter = RespReplyCounter()
    counter.feed(REPLY)
    with pytest.raises(RespError, match="OOM"):
        counter.feed(b"-OOM no memory\r\n")


def _xread_reply(entries: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(
        b"*2\r\n$%d\r\n%s\r\n*2\r\n$1\r\nd\r\n$%d\r\n%s\r\n" % (len(i), i, len(v), v)
        for i, v in entries
    )
    return b"*1\r\n*2\r\n$5\r\nbench\r\n*%d\r\n" % len(entries) + body


def test_parse_xread_whole_partial_and_empty():
    entries = [(b"1-0", b"a" * 30), (b"1-1", b"\r\n*2" + b"b" * 26)]
    reply = _xread_reply(entries)
    assert parse_xread(reply + b"extra") == (len(reply), entries)
    for end in range(len(reply)):
        assert parse_xread(reply[:end]) is None
    assert parse_xread(b"*-1\r\n") == (5, [])
    with pytest.raises(RespError):
        parse_xread(b"-ERR no\r\n")


def test_redis_server_args_bind_loopback_and_set_the_aof():
    args = redis_server_args(7000, "/tmp/x", "always")
    assert args[args.index("--bind") + 1] == "127.0.0.1"
    assert args[args.index("--appendfsync") + 1] == "always"
    assert args[args.index("--appendonly") + 1] == "yes"
    assert "--appendfsync" not in redis_server_args(7000, "/tmp/x", "no")


def test_nats_frames():
    assert nats_pub("s", "_INBOX.1", b"hey") == b"PUB s _INBOX.1 3\r\nhey\r\n"
    assert nats_pub("s", None, b"") == b"PUB s 0\r\n\r\n"
    connect = nats_connect()
    assert connect.startswith(b"CONNECT {") and connect.endswith(b"\r\nPING\r\n")
    assert json.loads(connect[8:].split(b"\r\n")[0])["headers"] is True
    template = pub_template("bench", "_INBOX.a", 40, 2)
    filled = bytes(template.fill(1, 5, 6))
    assert filled.count(b"PUB bench _INBOX.a 40\r\n") == 2
    assert MARK.unpack_from(filled, template.positions[1]) == (1, 6, 6)


ACK = b'MSG _INBOX.acks.0 1 26\r\n{"stream":"bench","seq":12}\r\n'


@given(st.integers(0, 40), st.integers(0, 3), st.lists(st.integers(0, 3000), max_size=12))
def test_nats_ack_counter_counts_each_ack_once_however_cut(acks, pings, cuts):
    counter = NatsAckCounter()
    for piece in _cut(ACK * acks + b"PING\r\n" * pings, cuts):
        counter.feed(piece)
    assert (counter.acks, counter.pings) == (acks, pings)


def test_nats_ack_counter_raises_on_errors():
    with pytest.raises(NatsError):
        NatsAckCounter().feed(b"-ERR 'Slow Consumer'\r\n")
    with pytest.raises(NatsError):
        NatsAckCounter().feed(b'MSG i 1 40\r\n{"error":{"code":503,"description":"x"}}\r\n')


def test_parse_nats_messages_payloads_statuses_and_pings():
    stream = (
        b"+OK\r\nMSG bench 2 $JS.ACK.bench.c1.1.1.1.1.0 3\r\nabc\r\n"
        b"PING\r\nMSG bench 2 2\r\nxy\r\n"
        b"HMSG _INBOX.p 2 28 28\r\nNATS/1.0 404 No Messages\r\n\r\n\r\n"
    )
    position, payloads, statuses, pings = parse_nats_messages(stream)
    assert position == len(stream)
    assert payloads == [b"abc", b"xy"]
    assert statuses == [b"NATS/1.0 404 No Messages\r\n\r\n"] and pings == 1
    cut = stream.index(b"xy") + 1
    position, payloads, _, _ = parse_nats_messages(stream[:cut])
    assert payloads == [b"abc"] and stream[position:].startswith(b"MSG bench 2 2")
    with pytest.raises(NatsError):
        parse_nats_messages(b"-ERR 'Authorization Violation'\r\n")


def test_jetstream_configs():
    stream = json.loads(jetstream_stream_config("bench", ["bench"]))
    assert stream["storage"] == "file" and stream["num_replicas"] == 1
    consumer = json.loads(jetstream_consumer_config("bench", "c1"))
    assert consumer["config"]["ack_policy"] == "none" and consumer["stream_name"] == "bench"
    assert "sync_interval: always" in nats_server_config(4222, "/d", "always")
    default = nats_server_config(4222, "/d", "default")
    assert "sync_interval" not in default and "listen: 127.0.0.1:4222" in default
