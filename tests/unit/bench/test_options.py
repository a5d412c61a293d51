"""Option parsing and checking of ``rivven bench``, and the durability mapping to the peers.

Method: parse real command lines with the tool's own parser, check the resulting
``BenchOptions``; check that every out-of-range or inconsistent option is refused with
``OptionsError`` naming the option; check the sync-policy mapping table of the docs.
"""

from __future__ import annotations

import argparse

import pytest

from rivven_broker.bench import __main__ as bench_main
from rivven_broker.bench.options import (
    BenchOptions,
    OptionsError,
    add_arguments,
    options_from_args,
    peer_sync_for,
)


def _parse(mode: str, *argv: str) -> BenchOptions:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return options_from_args(mode, parser.parse_args(list(argv)))


def test_defaults():
    options = _parse("produce")
    assert (options.record_bytes, options.batch, options.acks, options.sync) == (100, 100, -1, "always")
    assert options.rate == 0 and options.peer is None and options.pin


def test_every_flag_lands_in_its_field():
    options = _parse(
        "consume", "--size", "1024", "--batch", "64", "--linger-ms", "3", "--partitions", "4",
        "--producers", "2", "--connections", "3", "--consumers", "2", "--acks", "1",
        "--sync", "interval_ms=50", "--duration", "2.5", "--warmup", "0", "--rounds", "3",
        "--window", "16", "--rate", "5000", "--fetch-bytes", "65536", "--fill-records", "1000",
        "--peer", "redis", "--peer-sync", "everysec", "--client", "--no-pin", "--dir", "/tmp",
        "--broker-flag=--preallocate-bytes=1048576", "--topic", "t", "--no-verify",
        "--topic-config=segment.bytes=1048576", "--topic-config", "retention.ms=60000",
    )
    assert options.mode == "consume" and options.record_bytes == 1024 and options.batch == 64
    assert options.linger_ms == 3 and options.partitions == 4 and options.producers == 2
    assert options.connections == 3 and options.producer_connections == 6
    assert options.consumers == 2 and options.acks == 1 and options.sync == "interval_ms=50"
    assert options.duration_s == 2.5 and options.warmup_s == 0 and options.rounds == 3
    assert options.window == 16 and options.rate == 5000 and options.fetch_bytes == 65536
    assert options.fill_records == 1000 and options.effective_fill_records == 1000
    assert options.peer == "redis" and options.peer_sync == "everysec" and options.client_line
    assert not options.pin and options.data_dir == "/tmp" and not options.verify
    assert options.broker_flags == ("--preallocate-bytes=1048576",) and options.topic == "t"
    assert options.topic_config == ("segment.bytes=1048576", "retention.ms=60000")
    assert "consume 1024 B x 64/batch" in options.describe()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"mode": "fetch"}, "mode"),
        ({"record_bytes": 10}, "--size"),
        ({"batch": 0}, "--batch"),
        ({"batch": 100_000, "record_bytes": 1024}, "--batch x --size"),
        ({"producers": 0}, "--producers"),
        ({"connections": 65}, "--connections"),
        ({"sync": "sometimes"}, "--sync"),
        ({"sync": "interval_ms=0"}, "--sync"),
        ({"duration_s": 0}, "--duration"),
        ({"window": 65}, "--window"),
        ({"rate": -1}, "--rate"),
        ({"fetch_bytes": 10}, "--fetch-bytes"),
        ({"peer": "kafka"}, "--peer"),
        ({"peer_sync": "always"}, "--peer-sync needs --peer"),
        ({"peer": "redis", "peer_sync": "sometimes"}, "--peer-sync"),
        ({"peer": "nats", "bootstrap": "127.0.0.1:9092"}, "--bootstrap"),
        ({"acks": 0, "rate": 10}, "--acks 0"),
        ({"acks": 2}, "--acks"),
        ({"cluster": 3, "partitions": 2, "connections": 3}, "a multiple of P"),
        ({"cluster": 3, "bootstrap": "127.0.0.1:9092"}, "--cluster N"),
        ({"topic_config": ("segment.bytes",)}, "--topic-config must be KEY=VALUE"),
        ({"topic_config": ("=1",)}, "--topic-config must be KEY=VALUE"),
        ({"topic_config": ("segment.bytes=1048576",), "bootstrap": "127.0.0.1:9092"},
         "--topic-config configures"),
    ],
)
def test_bad_options_are_refused(fields, message):
    with pytest.raises(OptionsError, match=message.replace("-", r"\-")):
        BenchOptions(**fields)


def test_peer_durability_mapping():
    assert peer_sync_for("redis", "always") == "always"
    assert peer_sync_for("redis", "interval_ms=1000") == "everysec"
    assert peer_sync_for("redis", "none") == "no"
    assert peer_sync_for("nats", "always") == "always"
    assert peer_sync_for("nats", "none") == "default"
    assert peer_sync_for("nats", "always", "default") == "default"
    with pytest.raises(OptionsError):
        peer_sync_for("nats", "always", "everysec")


def test_the_command_line_refuses_bad_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_main.main(["produce", "--size", "5"])
    assert exit_info.value.code == 2
    assert "--size" in capsys.readouterr().err
