"""The blocking ``Consumer`` pauses the cyclic garbage collector only while ``poll`` decodes,
and only when asked (``pause_gc_while_decoding=True``: the switch is process-wide).

Goal: with the opt-in, ``poll`` turns the collector off while it decodes fetched batches and
hands the records out (a speed measure, see ``CollectorPause``), and must always put back the
state it found:
on a normal return, when decoding raises, and when the caller had disabled the collector
itself. Method: the public ``Consumer`` against ``FakeBroker`` (tests/unit/client/
fake_broker.py) over loopback sockets, checking ``gc.isenabled()`` after each ``poll`` and
that the records are whole; a corrupt stored batch makes the decode raise. The pause object
itself is checked directly. No sleeps: polls with timeouts.
"""

from __future__ import annotations

import gc

import anyio
import pytest

from rivven_broker.client import Consumer, CorruptMessageError, Producer, TopicPartition
from rivven_broker.client._collector import CollectorPause
from tests.loops import on_each_loop
from tests.unit.client.fake_broker import FakeBroker


@pytest.fixture
def fake():
    broker = FakeBroker().start()
    yield broker
    broker.stop()


@pytest.fixture
def collector_enabled():
    """Every test starts with the collector on and leaves it as the test suite expects."""
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def _fill(broker: FakeBroker, count: int) -> None:
    broker.create_topic("t", 1)
    with Producer(broker.bootstrap, linger_ms=5) as producer:
        for i in range(count):
            producer.send("t", value=b"v%d" % i, key=b"k%d" % (i % 3), headers={"h": b"%d" % i})


def test_poll_restores_an_enabled_collector_and_returns_whole_records(fake, collector_enabled):
    _fill(fake, 300)
    got = []
    with Consumer(fake.bootstrap, auto_offset_reset="earliest", max_poll_records=70,
                  pause_gc_while_decoding=True) as consumer:
        consumer.assign([TopicPartition("t", 0)])
        while len(got) < 300:
            batch = consumer.poll(timeout_ms=5000)
            assert gc.isenabled()
            assert batch, f"stalled after {len(got)} records"
            got += batch
    assert [r.offset for r in got] == list(range(300))
    assert [(r.topic, r.partition) for r in got] == [("t", 0)] * 300
    assert [r.value for r in got] == [b"v%d" % i for i in range(300)]
    assert [r.key for r in got] == [b"k%d" % (i % 3) for i in range(300)]
    assert [r.headers for r in got] == [(("h", b"%d" % i),) for i in range(300)]
    assert all(r.timestamp_ms > 0 for r in got)


def test_poll_leaves_a_disabled_collector_disabled(fake, collector_enabled):
    _fill(fake, 50)
    with Consumer(fake.bootstrap, auto_offset_reset="earliest",
                  pause_gc_while_decoding=True) as consumer:
        consumer.assign([TopicPartition("t", 0)])
        gc.disable()
        got = []
        while len(got) < 50:
            batch = consumer.poll(timeout_ms=5000)
            assert not gc.isenabled()
            assert batch
            got += batch
        gc.enable()
        assert consumer.poll(timeout_ms=0) == []
        assert gc.isenabled()


def test_poll_restores_the_collector_when_decoding_raises(fake, collector_enabled):
    _fill(fake, 20)
    base, batch = fake.logs[("t", 0)][0]
    corrupt = bytearray(batch)
    corrupt[-1] ^= 0xFF  # inside the records: the CRC no longer matches
    fake.logs[("t", 0)][0] = (base, bytes(corrupt))
    with Consumer(fake.bootstrap, auto_offset_reset="earliest",
                  pause_gc_while_decoding=True) as consumer:
        consumer.assign([TopicPartition("t", 0)])
        with pytest.raises(CorruptMessageError):
            for _ in range(100):
                consumer.poll(timeout_ms=5000)
        assert gc.isenabled()


def test_the_pause_puts_back_what_it_found(collector_enabled):
    pause = CollectorPause()
    pause.end()  # ending what never began changes nothing
    assert gc.isenabled()
    pause.begin()
    assert not gc.isenabled()
    pause.begin()  # a second begin keeps the first state
    pause.end()
    assert gc.isenabled()
    pause.end()
    assert gc.isenabled()
    gc.disable()
    pause.begin()
    pause.end()
    assert not gc.isenabled()


@on_each_loop
async def test_the_async_consumer_restores_the_collector_too(fake, collector_enabled):
    from rivven_broker.client.aio import open_consumer

    _fill(fake, 200)
    got = []
    with anyio.fail_after(20):
        async with open_consumer(fake.bootstrap, auto_offset_reset="earliest",
                                 pause_gc_while_decoding=True) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            while len(got) < 200:
                got += await consumer.poll(timeout_ms=1000, max_records=70)
                assert gc.isenabled()
    assert [r.value for r in got] == [b"v%d" % i for i in range(200)]


def test_without_the_opt_in_the_collector_is_never_touched(fake, collector_enabled,
                                                            monkeypatch):
    import rivven_broker.client._collector as collector_module

    calls = []
    monkeypatch.setattr(collector_module.gc, "disable", lambda: calls.append("disable"))
    _fill(fake, 100)
    for opt_in in (False, True):
        with Consumer(fake.bootstrap, auto_offset_reset="earliest",
                      pause_gc_while_decoding=opt_in) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            got = []
            while len(got) < 100:
                got += consumer.poll(timeout_ms=5000)
        assert bool(calls) is opt_in
