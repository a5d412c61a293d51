"""Shared fixtures of the integration tests: brokers on real loopback sockets and real files.

Goal: give every integration test (the broker's own and the clients') a running broker with
one line, in two flavours, and a minimal raw-protocol client to talk to it.

- ``start_broker`` (async, trio tests): ``running = await start_broker(**overrides)`` starts a
  ``Broker`` in the test's own trio run, on ``127.0.0.1`` port 0 (client and HTTP), with a data
  directory under ``tmp_path``. ``overrides`` are ``BrokerConfig`` fields (``sync_policy=
  "none"``, ``idle_timeout_ms=200`` ...). Returns a ``RunningBroker`` (``.port``,
  ``.http_port``, ``.address`` "127.0.0.1:PORT", ``.data_dir``, ``.broker``); every broker is
  shut down gracefully at the end of the test. ``broker`` is ``start_broker()`` with defaults.
- ``threaded_broker`` (sync, any test, any event loop): ``running = threaded_broker(**overrides)``
  is ``start_broker`` in a trio run on a thread of its own, for tests whose body runs under
  asyncio as well as trio (``tests/loops.py``). ``trio_thread`` is that thread:
  ``trio_thread.start(service.serve)`` starts a service there (``nursery.start``) and
  ``trio_thread.call(fn, *args)`` runs an async function there; the broker's objects are
  touched only through ``call``.
- ``broker_process`` (sync, any test): ``proc = broker_process(*flags, data_dir=None)`` runs
  the real ``rivven-broker`` executable as a subprocess on free ports (it prints the bound
  ports; the fixture reads them) and returns a ``BrokerProcess`` (``.port``, ``.http_port``,
  ``.address``, ``.data_dir``, ``.popen``, ``.terminate()`` -> exit code, ``.kill()``).
  Leftover processes are killed at the end of the test. Pass the same ``data_dir`` again to
  restart on the same data; ``nofile=(soft, hard)`` starts it with that descriptor limit;
  ``stderr`` is passed to ``Popen`` (e.g. a file, to read its log).
- ``connect`` (async): ``client = await connect(port)`` opens a ``RawClient``: a trio TCP
  stream driving the protocol's ``ClientConnection``. ``await client.call(request)`` sends one
  request and returns its response; ``send``/``receive`` pipeline; ``send_raw`` writes any
  bytes; ``receive_raw_frame`` reads one frame without the client core. Closed at the end.
- ``connect_blocking`` (sync): ``client = connect_blocking(port)`` is the same over a plain
  blocking socket (``BlockingRawClient``: ``call``, ``send``, ``receive``), for sync tests and
  subprocess brokers. Closed at the end.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, AsyncIterator, Callable, Iterator

import attrs
import pytest
import trio

from rivven_broker.protocol.connection import ClientConnection, ResponseReceived
from rivven_broker.protocol.framing import Frame
from rivven_broker.protocol.message_base import Request, Response
from rivven_broker.server.broker import Broker
from rivven_broker.server.config import BrokerConfig, HostPort
from rivven_broker.server.env import RealEnv

_READY_TIMEOUT_S = 30.0


# --- in-process brokers --------------------------------------------------------------------------


@attrs.define
class RunningBroker:
    broker: Broker
    data_dir: pathlib.Path
    port: int
    http_port: int | None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def _loopback_broker(directory: pathlib.Path, overrides: dict[str, Any]) -> Broker:
    """A broker on ephemeral loopback ports (clients and HTTP) with its data in ``directory``."""
    settings: dict[str, Any] = {
        "data_dir": str(directory),
        "listen": HostPort("127.0.0.1", 0),
        "http": HostPort("127.0.0.1", 0),
        "shutdown_timeout_ms": 5_000,
    }
    settings.update(overrides)
    config = BrokerConfig(**settings)
    return Broker(RealEnv(config.data_dir), config)


@pytest.fixture
async def start_broker(
    nursery: trio.Nursery, tmp_path: pathlib.Path
) -> AsyncIterator[Callable[..., Any]]:
    started: list[RunningBroker] = []

    async def start(*, data_dir: pathlib.Path | None = None, **overrides: Any) -> RunningBroker:
        directory = data_dir or tmp_path / f"broker-data-{len(started)}"
        broker = _loopback_broker(directory, overrides)
        addresses = await nursery.start(broker.serve)
        http_port = addresses.http.port if addresses.http is not None else None
        running = RunningBroker(broker, pathlib.Path(broker.config.data_dir),
                                addresses.listen.port, http_port)
        started.append(running)
        return running

    yield start
    for running in started:
        running.broker.request_shutdown()
    for running in started:
        with trio.fail_after(30):
            await running.broker.wait_stopped()


@pytest.fixture
async def broker(start_broker: Callable[..., Any]) -> RunningBroker:
    return await start_broker()


class TrioThread:
    """A trio run on a thread of its own, serving tasks started from other threads."""

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        ready = threading.Event()

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._token = trio.lowlevel.current_trio_token()
                ready.set()
                await trio.sleep_forever()

        self._thread = threading.Thread(target=trio.run, args=(main,), name="trio-services",
                                        daemon=True)
        self._thread.start()
        assert ready.wait(10), "the trio thread did not start"

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``await fn(*args)`` in the trio thread; its result. Blocks the calling thread (also
        from inside another event loop: a test body's, which has nothing else to do)."""
        assert self._token is not None and self._nursery is not None
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        async def run() -> None:
            try:
                done.set_result(await fn(*args))
            except BaseException as exc:  # handed to the caller, cancellation included
                done.set_exception(exc)

        self._token.run_sync_soon(self._nursery.start_soon, run)
        return done.result(timeout=60)

    def start(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``nursery.start(fn, *args)`` in the trio thread: what ``fn`` reported started."""
        assert self._nursery is not None
        return self.call(self._nursery.start, fn, *args)

    def stop(self) -> None:
        assert self._nursery is not None and self._token is not None
        self._token.run_sync_soon(self._nursery.cancel_scope.cancel)
        self._thread.join(30)


@pytest.fixture
def trio_thread() -> Iterator[TrioThread]:
    thread = TrioThread()
    yield thread
    thread.stop()


@pytest.fixture
def threaded_broker(
    trio_thread: TrioThread, tmp_path: pathlib.Path
) -> Iterator[Callable[..., RunningBroker]]:
    started: list[RunningBroker] = []

    def start(**overrides: Any) -> RunningBroker:
        broker = _loopback_broker(tmp_path / f"threaded-broker-{len(started)}", overrides)
        addresses = trio_thread.start(broker.serve)
        http_port = addresses.http.port if addresses.http is not None else None
        running = RunningBroker(broker, pathlib.Path(broker.config.data_dir), addresses.listen.port,
                                http_port)
        started.append(running)
        return running

    yield start

    async def stop_all() -> None:
        for running in started:
            running.broker.request_shutdown()
        for running in started:
            with trio.fail_after(30):
                await running.broker.wait_stopped()

    trio_thread.call(stop_all)


# --- a raw protocol client -----------------------------------------------------------------------


class RawClient:
    """A trio stream plus ``ClientConnection``: enough protocol to drive a broker in tests."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.core = ClientConnection()
        self._raw = bytearray()

    async def send(self, request: Request) -> int:
        """Send one request (no wait for its answer); return its correlation id."""
        correlation_id, data = self.core.send_request(request)
        await self.stream.send_all(data)
        return correlation_id

    async def receive(self) -> ResponseReceived:
        """The next response, in request order."""
        while True:
            event = self.core.next_event()
            if event is not None:
                return event
            data = await self.stream.receive_some(1 << 20)
            if not data:
                raise EOFError("the broker closed the connection")
            self.core.receive_data(data)

    async def call(self, request: Request) -> Response:
        await self.send(request)
        return (await self.receive()).response

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive_raw_frame(self) -> Frame | None:
        """One frame read without the client core; None if the broker closed first."""
        while True:
            if len(self._raw) >= 4:
                (length,) = struct.unpack_from(">I", self._raw)
                if len(self._raw) >= 4 + length:
                    format, correlation_id = struct.unpack_from(">BI", self._raw, 4)
                    payload = bytes(self._raw[9 : 4 + length])
                    del self._raw[: 4 + length]
                    return Frame(format, correlation_id, payload)
            data = await self.stream.receive_some(1 << 20)
            if not data:
                return None
            self._raw += data

    async def closed_by_peer(self) -> bool:
        """True once the broker has closed the connection (reads until EOF or reset)."""
        try:
            while await self.stream.receive_some(1 << 16):
                pass
        except trio.BrokenResourceError:
            pass
        return True

    async def aclose(self) -> None:
        await self.stream.aclose()


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., Any]]:
    clients: list[RawClient] = []

    async def open_client(port: int, host: str = "127.0.0.1") -> RawClient:
        stream = await trio.open_tcp_stream(host, port)
        client = RawClient(stream)
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        await trio.aclose_forcefully(client.stream)


class BlockingRawClient:
    """A plain socket plus ``ClientConnection`` (the blocking twin of ``RawClient``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.core = ClientConnection()

    def send(self, request: Request) -> int:
        correlation_id, data = self.core.send_request(request)
        self.sock.sendall(data)
        return correlation_id

    def receive(self) -> ResponseReceived:
        while True:
            event = self.core.next_event()
            if event is not None:
                return event
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("the broker closed the connection")
            self.core.receive_data(data)

    def call(self, request: Request) -> Response:
        self.send(request)
        return self.receive().response

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def connect_blocking() -> Iterator[Callable[..., BlockingRawClient]]:
    clients: list[BlockingRawClient] = []

    def open_client(port: int, host: str = "127.0.0.1", timeout_s: float = 30.0) -> BlockingRawClient:
        sock = socket.create_connection((host, port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = BlockingRawClient(sock)
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        client.close()


# --- the real executable as a subprocess ---------------------------------------------------------


def _broker_command() -> list[str]:
    script = pathlib.Path(sys.executable).parent / "rivven-broker"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "rivven_broker.cli.broker_main"]


@attrs.define
class BrokerProcess:
    popen: subprocess.Popen[bytes]
    data_dir: pathlib.Path
    port: int
    http_port: int | None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (graceful shutdown); return the exit code."""
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout_s)

    def kill(self) -> int:
        """SIGKILL: the process dies at once, like a power cut for its unsynced state."""
        self.popen.kill()
        return self.popen.wait(30)


def _read_ready_line(popen: subprocess.Popen[bytes]) -> str:
    assert popen.stdout is not None
    deadline = time.monotonic() + _READY_TIMEOUT_S
    buffered = b""
    while b"\n" not in buffered:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("rivven-broker did not report ready in time")
        readable, _, _ = select.select([popen.stdout], [], [], remaining)
        if readable:
            chunk = os.read(popen.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"rivven-broker exited early with code {popen.wait()}")
            buffered += chunk
    return buffered.split(b"\n", 1)[0].decode()


def _port_of(text: str) -> int | None:
    return None if text == "off" else int(text.rsplit(":", 1)[1])


@pytest.fixture
def broker_process(tmp_path: pathlib.Path) -> Iterator[Callable[..., BrokerProcess]]:
    processes: list[BrokerProcess] = []

    def start(
        *flags: str,
        data_dir: pathlib.Path | None = None,
        nofile: tuple[int, int] | None = None,
        stderr: Any = None,
        env: dict[str, str] | None = None,
        defaults: bool = True,
    ) -> BrokerProcess:
        directory = data_dir or tmp_path / f"process-data-{len(processes)}"
        command = [  # (defaults=False: only ``flags``, the rest from ``env``, say)
            *_broker_command(), *(("--data-dir", str(directory), "--listen", "127.0.0.1:0",
                                   "--http", "127.0.0.1:0", "--log-level", "WARNING")
                                  if defaults else ()), *flags,
        ]

        def limit_descriptors() -> None:  # in the child, before exec
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, nofile)

        popen = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr,
                                 preexec_fn=limit_descriptors if nofile else None,
                                 env=None if env is None else {**os.environ, **env})
        try:
            line = _read_ready_line(popen)
        except BaseException:
            popen.kill()
            popen.wait()
            raise
        # "rivven-broker ready: clients HOST:PORT http HOST:PORT|off"
        words = line.split()
        assert words[:3] == ["rivven-broker", "ready:", "clients"], line
        process = BrokerProcess(popen, directory, _port_of(words[3]), _port_of(words[5]))
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.popen.poll() is None:
            process.popen.kill()
            process.popen.wait()
        if process.popen.stdout is not None:
            process.popen.stdout.close()
