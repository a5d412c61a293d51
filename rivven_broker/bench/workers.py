"""Load-generator processes: the spawn entry point, the shared send/receive loops, the results.

Theory of operation
-------------------
The coordinator (``runner.py``) starts every producer and consumer as its own process
(multiprocessing *spawn*: a fresh interpreter, nothing inherited but the pickled
``WorkerSpec``), pinned to the load CPU. ``worker_main`` connects, answers ``"ready"`` on its
pipe, receives the start time ``t0`` (``time.monotonic()`` is the system-wide monotonic clock on
Linux, so all processes agree on it), runs, and sends back one ``WorkerResult``.

Every run has a warmup ``[t0, t0 + warmup)`` and a measured window ``[start, end)``. Units
acknowledged (or, for consumers, received) inside the window count towards throughput and go
into per-second ``Buckets``; latencies of requests completing inside the window go into the
HDR histogram (one value per request, in microseconds).

``run_producers`` drives any number of *channels* (one connection each, ``Channel`` below)
with non-blocking sends and one ``select.poll`` over all of them:

- closed loop: each channel keeps ``window`` requests in flight; latency runs from the send;
- fixed rate (``rate_per_channel`` requests/s): request ``k`` of channel ``g`` (its producer
  number, of ``N = producers x connections`` over all load processes) is *intended* at
  ``t0 + (k + g / N) / rate``: the channels take turns, so the server sees one request every
  ``1 / (N x rate)`` s, not all ``N`` at once every ``1 / rate`` s (a burst of sixteen
  one-record requests every 5.3 ms at 3,000/s, whose queue was most of the latency
  measured). It is sent at once when due (up to ``window_open_loop`` in flight) and its
  latency runs from the intended time, so a stalled server shows up as latency instead of
  silently lowering the offered load (coordinated omission).

After ``end`` producers stop sending and wait (bounded) for what is in flight, so the ledger
(``ledger.py``) knows exactly what was acknowledged.

A load generator is an instrument: its own pauses must not show up as the server's latency.
Python's cyclic garbage collector was one (measured: at a fixed 150 k records/s the Rivven
generator's full collections, scanning every object its imports had made, put p99 at 77-89 ms
while the broker itself answered every request within 10 ms; with the collector paused, p99
5.4-7.1 ms). So ``instrument_collector`` freezes what preparation built (``gc.freeze``: no
collection rescans it) and pauses the collector for the run, restoring it afterwards; a run
allocates no reference cycles, and reference counting frees everything else. The
``client-*`` kinds are exempt: they measure the public Python client, whose collector work is
part of what a user gets.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import socket
import time
import traceback
from collections import deque
from typing import Any, Callable, Iterator

import attrs

from rivven_broker.bench.options import BenchOptions
from rivven_broker.bench.stats import Buckets, Latency

__all__ = [
    "WorkerSpec",
    "WorkerResult",
    "Channel",
    "Window",
    "worker_main",
    "run_producers",
    "connect",
    "DRAIN_S",
]

#: After the window: how long producers wait for in-flight requests before giving up.
DRAIN_S = 30.0
_RECEIVE_BYTES = 4 * 1024 * 1024
_POLL_MS_MAX = 100


@attrs.frozen
class WorkerSpec:
    """What one worker process does. Pickled into the spawned process."""

    kind: str  # a key of the KINDS registry (rivven_load / peer_load)
    index: int
    options: BenchOptions
    address: tuple[str, int]
    topic: str
    cpu: int | None = None
    producer_base: int = 0  # first producer id of this worker (one per connection)
    partitions: tuple[int, ...] = (0,)
    rate_per_channel: float = 0.0  # requests/s per connection; 0 = closed loop
    expected_units: int = 0  # consumers: records in the log to read
    #: Raw producers: each partition's leader, by partition; with them each connection
    #: sends to one partition only, over a connection to its leader (``--cluster`` runs of
    #: several partitions). Empty: every connection to ``address``, partitions in turn.
    leaders: tuple[tuple[str, int], ...] = ()


@attrs.define
class WorkerResult:
    """What one worker measured (picklable)."""

    kind: str
    index: int
    records: int = 0  # records acknowledged / received inside the window
    payload_bytes: int = 0  # record value bytes of those (1 MB = 10**6 bytes in reports)
    wire_bytes: int = 0  # batch bytes (headers included) for broker-side consume figures
    requests: int = 0
    latency: bytes = b""  # ``Latency.encode()``
    buckets: list[int] = attrs.Factory(list)
    producers: list[tuple[int, int, int, tuple[int, ...]]] = attrs.Factory(list)
    errors: list[str] = attrs.Factory(list)
    seconds: float = 0.0  # measured seconds (the client consumer: time to read everything)
    load_cpu_s: float = 0.0  # producers: this process's CPU seconds inside the window
    extra: dict[str, Any] = attrs.Factory(dict)


@attrs.frozen
class Window:
    """The timing of one run: ``t0`` (start), warmup ends at ``start``, measuring until ``end``."""

    t0: float
    start: float
    end: float

    @classmethod
    def of(cls, t0: float, options: BenchOptions) -> Window:
        return cls(t0, t0 + options.warmup_s, t0 + options.warmup_s + options.duration_s)


def connect(address: tuple[str, int]) -> socket.socket:
    """A blocking TCP connection with Nagle off and large buffers."""
    sock = socket.create_connection(address, timeout=30.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, 4 * 1024 * 1024)
    sock.settimeout(None)
    return sock


class Channel:
    """One producer connection. Subclasses build requests and recognise answers.

    ``build(sequence, send_ns) -> (bytes, units)`` makes the next request (``units`` = the
    ledger units it carries: one batch for Rivven, ``batch`` records for a peer);
    ``feed(data) -> int`` takes received bytes and returns how many of the oldest in-flight
    requests they completed (in order). Failed units go to ``failed``.
    """

    def __init__(self, sock: socket.socket, producer: int) -> None:
        self.sock = sock
        self.producer = producer
        self.next_sequence = 0  # next ledger unit
        self.acked = 0  # ledger units answered (in order)
        self.failed: list[int] = []
        self.failed_seen = 0  # of ``failed``, how many ``run_producers`` has matched to requests
        self.in_flight: deque[tuple[float, int, int]] = deque()  # (intended, units, records)
        self.next_due = 0.0
        self.fire_and_forget = False  # acks=0: a request completes when sent

    def build(self, sequence: int, send_ns: int) -> tuple[bytes | bytearray, int, int]:
        """``(request bytes, ledger units, records)``."""
        raise NotImplementedError

    def feed(self, data: bytes) -> int:
        raise NotImplementedError

    def send(self, intended: float) -> None:
        data, units, records = self.build(self.next_sequence, time.monotonic_ns())
        self.sock.sendall(data)
        self.next_sequence += units
        self.in_flight.append((intended, units, records))

    def close(self) -> None:
        self.sock.close()


def first_due(t0: float, producer: int, channels_total: int, interval: float) -> float:
    """When channel ``producer`` (of ``channels_total``) sends its first request: its turn
    within the first ``interval`` at a fixed rate (module docstring), ``t0`` in a closed
    loop (``interval`` 0)."""
    return t0 + (producer % channels_total) / channels_total * interval


def run_producers(
    channels: list[Channel],
    window: Window,
    options: BenchOptions,
    rate_per_channel: float,
    result: WorkerResult,
) -> None:
    """Drive ``channels`` closed-loop or at a fixed rate until ``window.end``; then drain.

    Fills ``result`` (records, bytes, requests, latency, buckets, producers). Only
    acknowledged requests count: one answered with an error adds to none of the figures, and
    ``result.errors`` says how many there were. Blocks. Raises ``OSError`` /
    ``ConnectionError`` when a connection fails.
    """
    latency = Latency()
    buckets = Buckets(options.duration_s)
    interval = 1.0 / rate_per_channel if rate_per_channel > 0 else 0.0
    depth = options.window if not interval else max(options.window, 64)
    by_fd = {channel.sock.fileno(): channel for channel in channels}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    channels_total = options.producers * options.connections
    for channel in channels:
        channel.next_due = first_due(window.t0, channel.producer, channels_total, interval)
    counted = [0, 0]  # acknowledged records, requests inside the window
    refusals = [0]  # requests answered with an error (their records are not counted)
    record_bytes = options.record_bytes
    start, end = window.start, window.end

    def complete(channel: Channel, count: int, now: float) -> None:
        failed = channel.failed
        for _ in range(count):
            intended, units, records = channel.in_flight.popleft()
            channel.acked += units
            refused = False  # an answer with an error acknowledges nothing: not counted
            while channel.failed_seen < len(failed) and failed[channel.failed_seen] < channel.acked:
                channel.failed_seen += 1
                refused = True
            if refused:
                refusals[0] += 1
            elif start <= now < end:
                latency.record_us((now - intended) * 1e6)
                buckets.add(now - start, records)
                counted[0] += records
                counted[1] += 1

    _sleep_until(window.t0)
    cpu_at_start: float | None = None  # the load's own CPU, from the window's start
    while True:
        now = time.monotonic()
        if now >= end:
            break
        if cpu_at_start is None and now >= start:
            cpu_at_start = time.process_time()
        for channel in channels:
            if interval:
                while channel.next_due <= now and len(channel.in_flight) < depth:
                    channel.send(channel.next_due)
                    channel.next_due += interval
            else:
                while len(channel.in_flight) < depth:
                    channel.send(now)
            if channel.fire_and_forget:
                complete(channel, len(channel.in_flight), time.monotonic())
        timeout_s = end - now
        if interval:
            timeout_s = min(timeout_s, min(c.next_due for c in channels) - now)
        _receive(poller, by_fd, max(0.0, timeout_s), complete)
    if cpu_at_start is not None:
        result.load_cpu_s = time.process_time() - cpu_at_start
    deadline = time.monotonic() + DRAIN_S
    while any(c.in_flight for c in channels) and time.monotonic() < deadline:
        if all(c.fire_and_forget for c in channels):
            break
        _receive(poller, by_fd, 0.1, complete)
    result.records += counted[0]
    result.requests += counted[1]
    result.payload_bytes += counted[0] * record_bytes
    result.latency = latency.encode()
    result.buckets = buckets.counts
    result.seconds = options.duration_s
    for channel in channels:
        result.producers.append(
            (channel.producer, channel.next_sequence, channel.acked, tuple(channel.failed))
        )
        if channel.in_flight:
            result.errors.append(
                f"producer {channel.producer}: {len(channel.in_flight)} requests unanswered"
            )
    if refusals[0]:
        result.errors.append(f"{refusals[0]} requests answered with an error (not counted)")


def _receive(
    poller: select.poll,
    by_fd: dict[int, Channel],
    timeout_s: float,
    complete: Callable[[Channel, int, float], None],
) -> None:
    # Whole milliseconds, rounded down: waking late would send late, and a fixed-rate load
    # measures latency from the intended send time, so the generator's own lateness would
    # count as the server's. Under a millisecond: poll without waiting, yield the CPU to the
    # other load processes, and come back (the caller loops until the send is due).
    timeout_ms = min(_POLL_MS_MAX, int(timeout_s * 1000))
    events = poller.poll(timeout_ms)
    if not events and timeout_ms == 0 and timeout_s > 0:
        os.sched_yield()
    for fd, _ in events:
        channel = by_fd[fd]
        data = channel.sock.recv(_RECEIVE_BYTES)
        if not data:
            raise ConnectionError(f"producer {channel.producer}: the server closed the connection")
        done = channel.feed(data)
        if done:
            complete(channel, done, time.monotonic())


#: Kinds that measure the public Python client: its garbage collection is part of the figure.
CLIENT_KINDS = frozenset({"client-produce", "client-consume"})


@contextlib.contextmanager
def instrument_collector(kind: str) -> Iterator[None]:
    """Freeze the heap built so far and pause the cyclic collector while the block runs,
    unless ``kind`` measures the Python client (see the module docstring). Restores it."""
    if kind in CLIENT_KINDS or not gc.isenabled():
        yield
        return
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def _sleep_until(at: float) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def worker_main(spec: WorkerSpec, pipe: Any) -> None:
    """The spawned process's entry point: pin, prepare, say ready, run at ``t0``, report.

    Every exception is reported on the pipe as a ``WorkerResult`` with ``errors`` set.
    """
    from rivven_broker.bench.kinds import KINDS  # the registry imports this module
    from rivven_broker.bench.storage import tune_malloc

    result = WorkerResult(spec.kind, spec.index)
    ready = False
    try:
        if spec.cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {spec.cpu})
        tune_malloc()  # fresh MiB buffers per fetch must not page-fault in (storage.py)
        prepare = KINDS[spec.kind]
        run = prepare(spec)  # connects; returns the function that runs the load
        pipe.send("ready")
        ready = True
        t0 = pipe.recv()
        with instrument_collector(spec.kind):
            run(Window.of(t0, spec.options), result)
    except BaseException as exc:  # reported, not raised: the coordinator decides
        result.errors.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
        if not ready:
            pipe.send("ready")  # unblock the coordinator; it finds the error in the result
            pipe.recv()
    pipe.send(result)
    pipe.close()
