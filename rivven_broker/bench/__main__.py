"""``python -m rivven_broker.bench SUITE [options]`` (also ``rivven bench ...``): run a benchmark.

Suites: ``produce``, ``consume``, ``e2e`` (the broker benchmark tool, against a broker it
starts or ``--bootstrap``, optionally side by side with ``--peer redis|nats``), ``suite`` (the
standard suite behind ``make bench``, which rewrites docs/performance.md) and ``storage``
(the partition log alone), ``membership`` (SWIM crash detection with real processes),
``controller`` (Raft commit latency, commands/s, failover with real processes), ``failover``
(partition leaders SIGKILLed under ``acks=all`` load: failover time, nothing lost),
``codecs`` (each compression codec's build and decode speed and ratio), ``connect`` (the
connector runtime: datagen to N routed topics, exactly-once), ``cdc`` (Postgres CDC: the
``postgres-cdc`` source against a throw-away Postgres 15, exactly-once). See
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from rivven_broker.bench import cdc, codecs, connect, controller, failover, membership, storage
from rivven_broker.bench.options import MODES, OptionsError, add_arguments, options_from_args


_DESCRIPTION = (
    "Benchmarks (see docs/performance.md). produce, consume, e2e: a broker this tool starts "
    "(or --bootstrap), optionally side by side with --peer redis|nats; suite: the standard "
    "suite of `make bench`, which rewrites docs/performance.md; storage: the partition log alone."
)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the suite, print its result. Returns the exit code. Blocks."""
    parser = argparse.ArgumentParser(prog="rivven bench", description=_DESCRIPTION)
    suites = parser.add_subparsers(dest="suite", required=True)
    for mode in MODES:
        add_arguments(suites.add_parser(mode, help=f"{mode} throughput and latency"))
    from rivven_broker.bench import suite

    suite.add_arguments(suites.add_parser("suite", help=suite.HELP, description=suite.HELP))
    storage.add_arguments(suites.add_parser("storage", help=storage.HELP, description=storage.HELP))
    membership.add_arguments(
        suites.add_parser("membership", help=membership.HELP, description=membership.HELP))
    controller.add_arguments(
        suites.add_parser("controller", help=controller.HELP, description=controller.HELP))
    failover.add_arguments(
        suites.add_parser("failover", help=failover.HELP, description=failover.HELP))
    codecs.add_arguments(suites.add_parser("codecs", help=codecs.HELP, description=codecs.HELP))
    connect.add_arguments(
        suites.add_parser("connect", help=connect.HELP, description=connect.HELP))
    cdc.add_arguments(suites.add_parser("cdc", help=cdc.HELP, description=cdc.HELP))
    args = parser.parse_args(argv)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # SIGTERM unwinds like Ctrl-C, so every server is stopped and every directory removed.
        signal.signal(signal.SIGTERM, _terminate)
    if args.suite == "storage":
        return storage.main(args)
    if args.suite == "membership":
        return membership.main(args)
    if args.suite == "controller":
        return controller.main(args)
    if args.suite == "failover":
        return failover.main(args)
    if args.suite == "codecs":
        return codecs.main(args)
    if args.suite == "connect":
        return connect.main(args)
    if args.suite == "cdc":
        return cdc.main(args)
    if args.suite == "suite":
        return suite.main(args)
    try:
        options = options_from_args(args.suite, args)
    except OptionsError as exc:
        parser.error(str(exc))
    from rivven_broker.bench import report, runner

    rounds = runner.run_bench(options)
    summary = report.summarize(rounds, options, storage.machine_description(options.data_dir or "/tmp"))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(report.format_summary(summary))
    failed = summary["lost"] or summary["duplicated"] or summary["rivven"]["unknown"]
    return 1 if failed or report.line_errors(summary) else 0


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
