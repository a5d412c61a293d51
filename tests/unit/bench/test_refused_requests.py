"""A request answered with an error acknowledges nothing: the load does not count it, and the
run fails.

Method: ``run_producers`` drives one channel over a real socket pair whose far end, a thread,
answers every request with one byte, alternately a success and an error (the channel's
``feed`` puts the errors in ``failed``, as the Rivven and peer channels do). Only the successes
count as records and requests; the result says how many were refused. Then
``report.line_errors`` finds the error in a summarized line, which is what makes
``rivven bench`` exit 1 (a broker that refused every produce once measured 5.5M records/s).

The client line (``prepare_client_produce``) the same way: a stand-in ``Producer`` fails every
other record; only the sampled records that succeeded count (each for the hundred sent with
it), and the result says how many failed.
"""

from __future__ import annotations

import socket
import threading
import time

from concurrent.futures import Future

import pytest

from rivven_broker.bench import rivven_load
from rivven_broker.bench.options import BenchOptions
from rivven_broker.bench.report import line_errors, summarize
from rivven_broker.bench.runner import LineResult
from rivven_broker.bench.workers import (
    Channel,
    Window,
    WorkerResult,
    WorkerSpec,
    run_producers,
)

_RECORDS_PER_REQUEST = 10


class _OneByteChannel(Channel):
    """Sends b"r"; an answer byte b"k" is a success, b"e" an error."""

    def build(self, sequence: int, send_ns: int) -> tuple[bytes, int, int]:
        return b"r", 1, _RECORDS_PER_REQUEST

    def feed(self, data: bytes) -> int:
        for done, byte in enumerate(data):
            if byte == ord("e"):
                self.failed.append(self.acked + done)
        return len(data)


def _answer_alternately(sock: socket.socket, answered: list[bytes]) -> None:
    with sock:
        while data := sock.recv(4096):
            for _ in data:
                answer = b"k" if len(answered) % 2 == 0 else b"e"
                answered.append(answer)
                sock.sendall(answer)


def test_refused_requests_are_not_counted_and_fail_the_line():
    near, far = socket.socketpair()
    answered: list[bytes] = []
    server = threading.Thread(target=_answer_alternately, args=(far, answered), daemon=True)
    server.start()
    options = BenchOptions(mode="produce", duration_s=0.3, warmup_s=0.0, window=1)
    channel = _OneByteChannel(near, producer=0)
    result = WorkerResult("test-produce", 0)
    now = time.monotonic()
    try:
        run_producers([channel], Window(now, now, now + options.duration_s), options, 0.0,
                      result)
    finally:
        near.shutdown(socket.SHUT_WR)
        server.join(5.0)
        near.close()

    refused = len(channel.failed)
    assert refused >= 10 and channel.acked - refused >= 10  # both kinds answered, many times
    assert abs((channel.acked - refused) - refused) <= 1  # alternately
    succeeded = channel.acked - refused
    assert succeeded - 1 <= result.requests <= succeeded  # (the last may come in the drain)
    assert result.records == result.requests * _RECORDS_PER_REQUEST
    assert f"{refused} requests answered with an error (not counted)" in result.errors

    line = LineResult("rivven", "always", records=result.records, seconds=1.0,
                      errors=result.errors)
    summary = summarize([{"rivven": line}], options)
    assert line_errors(summary) == result.errors
    clean = summarize([{"rivven": LineResult("rivven", "always", records=1, seconds=1.0)}],
                      options)
    assert line_errors(clean) == []


class _HalfFailingProducer:
    """``Producer``'s surface as the client line uses it; every other record fails."""

    def __init__(self, bootstrap: str, **settings: object) -> None:
        self.sent = 0

    def partitions_for(self, topic: str) -> list[int]:
        return [0]

    def send(self, topic: str, value: bytes) -> Future:
        future: Future = Future()
        if self.sent % 2:
            future.set_exception(RuntimeError("NOT_ENOUGH_REPLICAS (the test's)"))
        else:
            future.set_result(self.sent)
        self.sent += 1
        return future

    def flush(self, timeout_s: float) -> None:
        pass

    def close(self, timeout_s: float) -> None:
        pass


def test_the_client_line_counts_only_acknowledged_records(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(rivven_load, "Producer", _HalfFailingProducer)
    monkeypatch.setattr(rivven_load, "_CLIENT_SAMPLE", 3)  # sampled: the 3rd, 6th, 9th, ...
    options = BenchOptions(mode="produce", duration_s=0.05, warmup_s=0.0)
    spec = WorkerSpec("client-produce", 0, options, ("127.0.0.1", 1), "bench")
    run = rivven_load.prepare_client_produce(spec)
    result = WorkerResult("client-produce", 0)
    now = time.monotonic()
    run(Window(now, now, now + options.duration_s), result)

    sampled = result.producers[0][1] // 3
    # Record n fails when n is odd: the sampled records 2, 5, 8, ... alternate.
    succeeded, failed = (sampled + 1) // 2, sampled // 2
    assert failed >= 10
    assert result.records == succeeded * 3
    assert result.errors == [f"{failed} sampled records failed (not counted), the first: "
                             "RuntimeError: NOT_ENOUGH_REPLICAS (the test's)"]
