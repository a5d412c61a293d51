"""``rivven-broker``: parse the settings, lock the data directory, run one broker until a signal.

Theory of operation
-------------------
``main()`` is the console entry point. It refuses to run under ``python -O`` (the broker's
invariants are ``assert`` statements), builds a ``BrokerConfig`` from the flags and the
optional TOML file (a bad value prints one clear line and exits 1), sets up logging, takes an
exclusive lock on ``<data-dir>/.lock`` (two brokers on one directory would corrupt it) and runs
``Broker.serve`` inside ``trio.run``. SIGINT or SIGTERM asks for a graceful shutdown (stop
accepting, finish in-flight requests, sync, close the logs) and the process exits 0; a second
signal cancels whatever is left. When the broker is serving it prints one line on stdout,
``rivven-broker ready: clients HOST:PORT http HOST:PORT``, with the ports actually bound (so
``--listen 127.0.0.1:0`` is usable by scripts and tests).

Just before that line it collects garbage once and freezes the heap (``gc.freeze``): what
start-up built (modules, classes, the recovered logs' state) lives as long as the process,
and without the freeze every full collection rescans it. Measured on this machine at a fixed
325 k records/s: one full collection every few seconds took 28 ms with 45 k tracked objects,
a stall every connection felt; after the freeze a full collection scans only what was made
since. Before serving it also tunes the C allocator to keep freed blocks for reuse
(``rivven_broker.process_memory``): fetch answers are MiB-sized byte strings, and without it
each one took fresh pages from the kernel (about 7,000 page faults per 1,000,000 records read).

Before the broker is built it raises its soft descriptor limit to the hard one
(``server/descriptors.py``): the default connection cap is derived from the limit in force.
Data files and directories are created 0640/0750.

With ``--peers`` it loads the cluster key ring from ``--cluster-key-file`` (refused when
group or others may read it), or uses the public development key with a loud warning when
every cluster address is loopback, and otherwise exits 2 saying how to make a key. SIGHUP
re-reads the key file (rotation without a restart).

Exit codes: 0 after a graceful shutdown, 2 for an unusable or missing cluster key, 1 for bad
settings, a locked or unusable data
directory, a port that cannot be bound, or a storage failure (a failed fsync stops the broker:
it never carries on after one).
"""

from __future__ import annotations

import datetime
import fcntl
import gc
import json
import logging
import os
import signal
import sys
from typing import Sequence

import trio

from rivven_broker import __version__
from rivven_broker.process_memory import keep_freed_memory
from rivven_broker.server.broker import Broker, BrokerAddresses, is_loopback
from rivven_broker.server.config import BrokerConfig, ConfigError, load_config
from rivven_broker.server.cluster.key_file import (
    DEVELOPMENT_KEY,
    KeyFileError,
    KeyRing,
    load_key_ring,
)
from rivven_broker.server.descriptors import raise_descriptor_limit
from rivven_broker.server.env import RealEnv
from rivven_broker.storage.errors import StorageError

__all__ = ["main"]

log = logging.getLogger("rivven_broker")


class JsonLogFormatter(logging.Formatter):
    """``--log-format json``: one JSON object per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


def _setup_logging(level: str, log_format: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level), handlers=[handler])


def _lock_data_dir(data_dir: str) -> int:
    """Create ``data_dir`` and hold an exclusive lock on ``data_dir/.lock`` until exit."""
    os.makedirs(data_dir, 0o750, exist_ok=True)
    fd = os.open(os.path.join(data_dir, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"--data-dir: {data_dir} is in use by another broker") from None
    return fd


async def _watch_signals(
    broker: Broker, signals: trio.abc.ReceiveChannel[int], cancel: trio.CancelScope
) -> None:
    count = 0
    async for signum in signals:
        if signum == signal.SIGHUP:
            _reload_key_ring(broker)
            continue
        count += 1
        if count == 1:
            log.info("received %s: shutting down gracefully", signal.Signals(signum).name)
            broker.request_shutdown()
        else:
            log.warning("received %s again: stopping now", signal.Signals(signum).name)
            cancel.cancel()


def _reload_key_ring(broker: Broker) -> None:
    """SIGHUP: read --cluster-key-file again (key rotation); keep the old ring on a problem."""
    path = broker.config.cluster_key_file
    if path is None:
        log.info("received SIGHUP: no --cluster-key-file to reload")
        return
    try:
        ring = load_key_ring(path)
    except KeyFileError as exc:
        log.error("received SIGHUP: keeping the current cluster keys: %s", exc)
        return
    broker.reload_key_ring(ring)
    log.info("received SIGHUP: cluster keys reloaded from %s (%d keys)", path, len(ring))


def _cluster_key_ring(config: BrokerConfig) -> KeyRing | None:
    """The ring for --peers: the key file's, or the development key when every cluster
    address is loopback. Raises ``KeyFileError`` (the broker exits 2)."""
    if not config.peers:
        return None
    if config.cluster_key_file is not None:
        return load_key_ring(config.cluster_key_file)
    addresses = [config.cluster_address.host] + [peer.address.host for peer in config.peers]
    if all(is_loopback(host) for host in addresses):
        log.warning("NO CLUSTER KEY: --peers without --cluster-key-file; using the built-in "
                    "development key, which anyone can know. Only because every cluster address "
                    "is loopback. Make a key with `rivven cluster keygen > cluster.key; chmod 600 "
                    "cluster.key` and pass --cluster-key-file cluster.key")
        return KeyRing.parse(DEVELOPMENT_KEY)
    raise KeyFileError(
        "--peers with a cluster address that is not loopback needs --cluster-key-file (every "
        "datagram between brokers is authenticated with it). Make one with `rivven cluster "
        "keygen > cluster.key; chmod 600 cluster.key`, copy it to every broker, and pass "
        "--cluster-key-file cluster.key"
    )


async def _run(config: BrokerConfig, key_ring: KeyRing | None) -> None:
    env = RealEnv(config.data_dir)
    broker = Broker(env, config, key_ring=key_ring)
    broker.metrics.track_process()  # CPU, memory, open files, the collector: a real process
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_signals, broker, signals, nursery.cancel_scope)
            addresses: BrokerAddresses = await nursery.start(broker.serve)
            http = addresses.http if addresses.http is not None else "off"
            gc.collect()
            gc.freeze()  # start-up's objects live as long as the process: never rescan them
            print(f"rivven-broker ready: clients {addresses.listen} http {http}", flush=True)
            await broker.wait_stopped()
            nursery.cancel_scope.cancel()


def _operating_failure(exc: BaseException) -> BaseException | None:
    """The first storage or OS error in ``exc`` (perhaps nested in exception groups)."""
    if isinstance(exc, (StorageError, OSError)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _operating_failure(inner)
            if found is not None:
                return found
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the broker; return the process exit code (also used by ``sys.exit``). Blocks."""
    if sys.flags.optimize:
        print("rivven-broker: refusing to run under python -O: assertions are the broker's "
              "invariants", file=sys.stderr)
        return 1
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, environ=os.environ,
                             version=__version__)
    except ConfigError as exc:
        print(f"rivven-broker: {exc}", file=sys.stderr)
        return 1
    _setup_logging(config.log_level, config.log_format)
    try:
        key_ring = _cluster_key_ring(config)
    except KeyFileError as exc:
        print(f"rivven-broker: {exc}", file=sys.stderr)
        return 2
    try:
        lock = _lock_data_dir(config.data_dir)
    except (ConfigError, OSError) as exc:
        print(f"rivven-broker: {exc}", file=sys.stderr)
        return 1
    keep_freed_memory()  # MiB-sized fetch answers reuse freed heap blocks: no page faults
    before, after = raise_descriptor_limit()  # connections_max=-1 is derived from it
    if after != before:
        log.info("file descriptor limit raised from %d to %d", before, after)
    try:
        trio.run(_run, config, key_ring)
    except (OSError, StorageError, BaseExceptionGroup) as exc:
        failure = _operating_failure(exc)
        if failure is None:
            raise
        if isinstance(failure, StorageError):
            log.critical("storage failure, broker stopped: %s", failure)
        else:
            log.critical("cannot serve: %s", failure)
        return 1
    finally:
        os.close(lock)
    log.info("stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m rivven_broker.cli.broker_main`
    sys.exit(main())
