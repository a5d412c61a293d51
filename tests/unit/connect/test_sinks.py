"""The three sinks: the JSON shape, the file sink's rotation/fsync/repair, stdout, and the
webhook against a tiny HTTP server in the test (500 then 200 is retried; 400 is permanent).
Options are checked at build time with the path named."""

from __future__ import annotations

import base64
import io
import json
import os

import h11
import pytest
import trio

from rivven_broker.client.types import Record
from rivven_connect.core.config import ConnectConfigError, SinkConfig
from rivven_connect.sinks import SinkError, build_sink, record_json
from rivven_connect.sinks.file import FileSink
from rivven_connect.sinks.http_webhook import WebhookSink
from rivven_connect.sinks.stdout import StdoutSink


def rec(offset: int, value: bytes | None = b'{"n": 1}', key: bytes | None = b"k",
        headers: tuple = (), partition: int = 0) -> Record:
    return Record("t", partition, offset, 1_700_000_000_000 + offset, key, value, headers)


def sink_config(connector: str, config: dict) -> SinkConfig:
    return SinkConfig(name="out", connector=connector, topics=("t",), consumer_group="g",
                      config=config)


# --- the JSON shape -----------------------------------------------------------------------------


def test_record_json_decodes_json_then_text_then_base64_and_says_which():
    shape = record_json(rec(3, value=b'{"a": [1]}', key=b"plain", headers=(("h", b"\xff"),
                                                                            ("t", b"x"))))
    assert shape == {"topic": "t", "partition": 0, "offset": 3,
                     "timestamp": 1_700_000_000_003, "key": "plain", "key_format": "text",
                     "value": {"a": [1]}, "value_format": "json",
                     "headers": [{"name": "h", "value": base64.b64encode(b"\xff").decode(),
                                  "format": "base64"},
                                 {"name": "t", "value": "x", "format": "text"}]}
    binary = record_json(rec(4, value=b"\x00\xfe", key=None))
    assert binary["value_format"] == "base64"
    assert base64.b64decode(binary["value"]) == b"\x00\xfe"
    assert binary["key"] is None and binary["key_format"] == "null"
    assert record_json(rec(5, value=b'"quoted"'))["value_format"] == "json"


@pytest.mark.parametrize("connector,config,path,problem", [
    ("file", {}, "sinks.out.config.path", "required"),
    ("file", {"path": "/x", "max_bytes": 10}, "sinks.out.config.max_bytes", "[1024"),
    ("file", {"path": "/x", "max_files": 0}, "sinks.out.config.max_files", "[1, "),
    ("file", {"path": "/x", "prefix": "a/b"}, "sinks.out.config.prefix", "letters"),
    ("file", {"path": "/x", "max_byte": 1}, "sinks.out.config.max_byte", "unknown option"),
    ("stdout", {"x": 1}, "sinks.out.config.x", "takes none"),
    ("http-webhook", {}, "sinks.out.config.url", "required"),
    ("http-webhook", {"url": "ftp://h/"}, "sinks.out.config.url", "http://"),
    ("http-webhook", {"url": "http://h/", "batch_size": 0}, "sinks.out.config.batch_size", ""),
    ("http-webhook", {"url": "http://h/", "headers": {"a": 1}}, "sinks.out.config.headers", ""),
    ("jdbc", {}, "sinks.out.connector", "not available"),
])
def test_bad_options_are_refused_at_build_naming_the_path(connector, config, path, problem):
    with pytest.raises(ConnectConfigError) as caught:
        build_sink(sink_config(connector, config))
    assert caught.value.path == path and problem in caught.value.problem


def test_numeric_options_accept_decimal_text_from_env():
    sink = build_sink(sink_config("file", {"path": "/x", "max_bytes": "4096"}))
    assert isinstance(sink, FileSink) and sink.max_bytes == 4096


# --- file ---------------------------------------------------------------------------------------


def read_lines(sink: FileSink) -> list[dict]:
    out = []
    for name in sink.files():
        with open(name, "rb") as handle:
            out.extend(json.loads(line) for line in handle)
    return out


async def test_file_sink_writes_json_lines_and_fsyncs_before_returning(tmp_path):
    synced: list[int] = []
    sink = FileSink(str(tmp_path / "out"), fsync=synced.append)
    await sink.write([rec(0), rec(1)])
    assert synced, "write returned without an fsync"
    file_syncs = len(synced)
    assert [row["offset"] for row in read_lines(sink)] == [0, 1]
    await sink.write([rec(2)])
    assert len(synced) == file_syncs + 1  # one fsync per write, the file's
    sink.close()
    assert [row["offset"] for row in read_lines(sink)] == [0, 1, 2]


async def test_file_sink_rotates_by_size_and_keeps_max_files(tmp_path):
    synced: list[int] = []
    sink = FileSink(str(tmp_path), max_bytes=1024, max_files=3, fsync=synced.append)
    longest = len(json.dumps(record_json(rec(100)), separators=(",", ":"))) + 1
    per_file = 1024 // longest  # at least this many lines fit in one file
    total = per_file * 7
    for start in range(0, total, 7):
        await sink.write([rec(n) for n in range(start, min(total, start + 7))])
    names = sink.files()
    assert [os.path.basename(n) for n in names] == [
        "records-00000005.jsonl", "records-00000006.jsonl", "records-00000007.jsonl"]
    assert all(os.path.getsize(n) <= 1024 for n in names)
    offsets = [row["offset"] for row in read_lines(sink)]
    assert offsets == list(range(total - len(offsets), total))  # the newest, whole, in order
    assert len(offsets) >= 2 * per_file + 1  # two full files and the current one
    for name in names[:-1]:  # a file was rolled only when the next line would not fit
        assert os.path.getsize(name) + longest > 1024
    sink.close()


async def test_file_sink_reopens_the_newest_file_and_cuts_a_partial_last_line(tmp_path):
    sink = FileSink(str(tmp_path), max_bytes=1 << 20)
    await sink.write([rec(0), rec(1)])
    sink.close()
    [name] = sink.files()
    with open(name, "ab") as handle:
        handle.write(b'{"topic":"t","partition":0,"off')  # a crash inside a write
    again = FileSink(str(tmp_path), max_bytes=1 << 20)
    await again.write([rec(2)])
    again.close()
    assert [row["offset"] for row in read_lines(again)] == [0, 1, 2]


async def test_file_sink_io_error_is_retriable_and_names_the_file(tmp_path):
    def failing(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    sink = FileSink(str(tmp_path), fsync=failing)
    with pytest.raises(SinkError) as caught:
        await sink.write([rec(0)])
    assert caught.value.retriable and "records-00000001.jsonl" in str(caught.value)
    sink.fsync = lambda descriptor: None
    await sink.write([rec(0)])  # reopened: at-least-once, the line may now be there twice
    assert {row["offset"] for row in read_lines(sink)} == {0}


# --- stdout -------------------------------------------------------------------------------------


async def test_stdout_sink_writes_one_line_per_record():
    stream = io.BytesIO()
    await StdoutSink(stream).write([rec(0), rec(1, value=b"text")])
    rows = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(r["offset"], r["value"], r["value_format"]) for r in rows] == [
        (0, {"n": 1}, "json"), (1, "text", "text")]


async def test_stdout_sink_on_a_closed_stream_is_permanent():
    stream = io.BytesIO()
    stream.close()
    with pytest.raises(SinkError) as caught:
        await StdoutSink(stream).write([rec(0)])
    assert not caught.value.retriable


# --- http-webhook -------------------------------------------------------------------------------


class Hook:
    """A tiny HTTP/1.1 server: answers each request with the next status of ``statuses``
    (the last one repeats) and keeps the JSON bodies it got."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.bodies: list[list] = []
        self.port = 0

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self.handle, listeners)

    async def handle(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        body = b""
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
        self.bodies.append(json.loads(body))
        status = self.statuses[min(len(self.bodies) - 1, len(self.statuses) - 1)]
        answer = b"ok"
        await stream.send_all(connection.send(h11.Response(
            status_code=status, headers=[("Content-Length", str(len(answer)))])) +
            connection.send(h11.Data(data=answer)) + connection.send(h11.EndOfMessage()))
        await stream.aclose()


async def webhook(nursery, statuses: list[int], **options) -> tuple[Hook, WebhookSink]:
    hook = Hook(statuses)
    await nursery.start(hook.serve)
    sink = WebhookSink(f"http://127.0.0.1:{hook.port}/hook?x=1", jitter=lambda: 0.0,
                       retry_backoff_ms=1, **options)
    return hook, sink


async def test_webhook_posts_json_arrays_in_batch_size_chunks():
    async with trio.open_nursery() as nursery:
        hook, sink = await webhook(nursery, [200], batch_size=2)
        await sink.write([rec(n) for n in range(5)])
        nursery.cancel_scope.cancel()
    assert [[row["offset"] for row in body] for body in hook.bodies] == [[0, 1], [2, 3], [4]]
    assert hook.bodies[0][0]["value"] == {"n": 1}


async def test_webhook_retries_a_500_then_succeeds_on_200():
    async with trio.open_nursery() as nursery:
        hook, sink = await webhook(nursery, [500, 503, 200])
        await sink.write([rec(0)])
        nursery.cancel_scope.cancel()
    assert len(hook.bodies) == 3 and sink.requests_sent == 3


async def test_webhook_400_is_permanent_and_not_retried():
    async with trio.open_nursery() as nursery:
        hook, sink = await webhook(nursery, [400])
        with pytest.raises(SinkError) as caught:
            await sink.write([rec(0)])
        nursery.cancel_scope.cancel()
    assert not caught.value.retriable and "HTTP 400" in str(caught.value)
    assert len(hook.bodies) == 1


async def test_webhook_gives_up_after_max_retries_with_a_retriable_error():
    async with trio.open_nursery() as nursery:
        hook, sink = await webhook(nursery, [500], max_retries=2)
        with pytest.raises(SinkError) as caught:
            await sink.write([rec(0)])
        nursery.cancel_scope.cancel()
    assert caught.value.retriable and len(hook.bodies) == 3


async def test_webhook_connection_refused_is_retriable():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nobody listens there now
    sink = WebhookSink(f"http://127.0.0.1:{port}/", max_retries=1, retry_backoff_ms=1,
                       jitter=lambda: 0.0)
    with pytest.raises(SinkError) as caught:
        await sink.write([rec(0)])
    assert caught.value.retriable
