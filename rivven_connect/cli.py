"""``rivven-connect --config connect.yaml [--bootstrap HOST:PORT,...] [--http HOST:PORT|off]``:
the runtime's process.

Exit codes: 0 every source and sink stopped (a source exhausted, or SIGTERM/SIGINT: the
batch in flight finished and committed; sinks run until the signal); 1 the configuration is
wrong (the ``ConnectConfigError`` message, which starts with the offending path, goes to
stderr), or the HTTP address cannot be bound; 2 the broker cannot be reached at start; 3 a
source or sink stopped in ``error`` (its error on stderr).

The bootstrap is ``--bootstrap``, else ``$RIVVEN_BOOTSTRAP``, else the file's
``broker.bootstrap``. The HTTP address is ``--http`` (``off``: none), else the file's
``http`` (default ``127.0.0.1:9095``; ``off`` or null: none). ``${NAME}`` in the file comes
from the process environment.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import urllib.request
from typing import Any, Sequence

import trio

from rivven_connect.core.config import ConnectConfig, ConnectConfigError, load_config
from rivven_connect.driver import (
    BrokerUnreachable,
    HttpUnavailable,
    SourceResult,
    find_error,
    run_connect,
)
from rivven_connect.sink_runner import SinkResult
from rivven_connect.sinks import Sink, build_sink
from rivven_connect.sources import Source, build_source

__all__ = ["main", "load", "fetch_mapping"]

EXIT_OK, EXIT_CONFIG, EXIT_BROKER, EXIT_SOURCE_ERROR = 0, 1, 2, 3
#: A ``Route`` transform's ``mapping_url``: the answer's size and time limits.
MAPPING_BYTES_MAX = 4 << 20
MAPPING_TIMEOUT_S = 10.0


def fetch_mapping(url: str) -> Any:
    """GET ``url`` once and parse its JSON body (at most ``MAPPING_BYTES_MAX`` bytes, within
    ``MAPPING_TIMEOUT_S``). Raises ``OSError`` (the request failed, or not 200) or
    ``ValueError`` (too large, not JSON)."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=MAPPING_TIMEOUT_S) as answer:  # noqa: S310
        if answer.status != 200:
            raise OSError(f"HTTP {answer.status}")
        body = answer.read(MAPPING_BYTES_MAX + 1)
    if len(body) > MAPPING_BYTES_MAX:
        raise ValueError(f"the answer is over {MAPPING_BYTES_MAX} bytes")
    return json.loads(body)


def load(path: str, environ: dict[str, str]
         ) -> tuple[ConnectConfig, dict[str, Source], dict[str, Sink]]:
    """The configuration in ``path``, its sources and sinks. Raises ``ConnectConfigError``."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ConnectConfigError("", f"cannot read the configuration: {error}") from error
    config = load_config(text, environ, fetch_mapping)
    sources = {name: build_source(source) for name, source in config.sources.items()}
    sinks = {name: build_sink(sink) for name, sink in config.sinks.items()}
    return config, sources, sinks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rivven-connect", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the connect.yaml file")
    parser.add_argument("--bootstrap", help="HOST:PORT[,HOST:PORT...] (overrides the file)")
    parser.add_argument("--http", help="HOST:PORT of the HTTP API, or off (overrides the file)")
    args = parser.parse_args(argv)
    environ = dict(os.environ)
    try:
        config, sources, sinks = load(args.config, environ)
    except ConnectConfigError as error:
        print(f"rivven-connect: {args.config}: {error}", file=sys.stderr)
        return EXIT_CONFIG
    bootstrap = args.bootstrap or environ.get("RIVVEN_BOOTSTRAP") or ",".join(config.bootstrap)
    http = config.http
    if args.http is not None:
        http = None if args.http == "off" else args.http
        if http is not None and not _is_host_port(http):
            print(f"rivven-connect: --http: {args.http!r} is not HOST:PORT or off",
                  file=sys.stderr)
            return EXIT_CONFIG
    try:
        results = trio.run(_serve, config, bootstrap, sources, sinks, http)
    except (BrokerUnreachable, HttpUnavailable, BaseExceptionGroup) as caught:
        error = find_error(caught, (BrokerUnreachable, HttpUnavailable))
        if error is None:
            raise
        print(f"rivven-connect: {error}", file=sys.stderr)
        return EXIT_BROKER if isinstance(error, BrokerUnreachable) else EXIT_CONFIG
    failed = False
    for result in results.values():
        print(result.describe() if isinstance(result, SinkResult) else _describe(result),
              file=sys.stderr)
        failed = failed or result.state == "error"
    return EXIT_SOURCE_ERROR if failed else EXIT_OK


def _is_host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and int(port) <= 65535


def _describe(result: SourceResult) -> str:
    line = (f"rivven-connect: source {result.name}: {result.state} at position "
            f"{result.position!r}, {result.records} records committed")
    return line + (f": {result.error}" if result.error else "")


async def _serve(config: ConnectConfig, bootstrap: str, sources: dict[str, Source],
                 sinks: dict[str, Sink], http: str | None) -> dict[str, SourceResult]:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        async def on_signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    stop.set()

        nursery.start_soon(on_signals)
        try:
            results = await run_connect(config, bootstrap, sources, stop, sinks=sinks,
                                        http=http)
        finally:
            nursery.cancel_scope.cancel()
    return results


if __name__ == "__main__":
    sys.exit(main())
