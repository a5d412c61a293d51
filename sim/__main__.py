"""``python -m sim SCENARIO.toml [--seed N | --seeds A..B] [--jobs N] [--check-determinism]
[--replay FILE] [--shrink]``: run a scenario deterministically and judge it.

Theory of operation
-------------------
The command prints the scenario, its hash and the versions that decide a run (Python, trio,
rivven, git commit) first, then one line per seed. Exit status 0 means every checked
invariant held for every seed; 1 means at least one broke (or, with ``--check-determinism``, a
seed gave two different traces); 2 means bad usage or an unreadable scenario. ``--jobs N``
runs up to N seeds at once in worker processes (a sweep on N cores); lines still come in seed
order.

On a violation it prints, per broken invariant, what is wrong and the first history entries
that show it (with the faults and node events just before), writes the realised fault
schedule to ``OUT/<scenario>-seed<N>.toml`` and prints the exact command that replays it.
``--replay FILE`` runs that schedule with the nemesis off and says whether the trace is
identical to the original run's. ``--shrink`` then removes faults while the same invariant
still breaks and writes the smaller schedule next to the first.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import multiprocessing
import os
import pathlib
import platform
import shlex
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Iterator, Sequence

import trio

from rivven_broker.process_memory import keep_freed_memory
from sim import log_context
from sim.scenario import Fault, Scenario, ScenarioError, load
from sim.schedule import ScheduleFile, dump_schedule, load_schedule
from sim.shrink import shrink
from sim.world import RunResult, run_in_worker, run_scenario

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_ENTRIES_SHOWN = 8
_CONTEXT_EVENTS = 6


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", help="the scenario TOML file")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seed", type=int, help="run this seed (default: the scenario's)")
    seeds.add_argument("--seeds", help="run an inclusive range of seeds, A..B")
    parser.add_argument("--check-determinism", action="store_true",
                        help="run each seed twice and compare the trace digests")
    parser.add_argument("--replay", metavar="FILE", help="replay a realised fault schedule")
    parser.add_argument("--shrink", action="store_true",
                        help="on failure, remove faults while the same invariant still breaks")
    parser.add_argument("--out", default="sim-failures", metavar="DIR",
                        help="where failure schedules are written (default: ./sim-failures)")
    parser.add_argument("--trace", metavar="FILE", help="write the readable trace of the run")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                        help="run up to N seeds at once, each in its own process (default 1)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show broker logs")
    return parser


def _seeds(args: argparse.Namespace, scenario: Scenario, replay: ScheduleFile | None) -> list[int]:
    if args.seeds:
        first, sep, last = args.seeds.partition("..")
        if not sep or not first.isdigit() or not last.isdigit() or int(first) > int(last):
            raise ScenarioError(f"--seeds: expected A..B with A <= B, got {args.seeds!r}")
        return list(range(int(first), int(last) + 1))
    if args.seed is not None:
        return [args.seed]
    return [replay.seed if replay is not None else scenario.seed]


def _git_commit() -> str:
    head = _ROOT / ".git" / "HEAD"
    try:
        text = head.read_text().strip()
        if text.startswith("ref: "):
            ref = text[5:]
            path = _ROOT / ".git" / ref
            if path.exists():
                return path.read_text().strip()[:12]
            for line in (_ROOT / ".git" / "packed-refs").read_text().splitlines():
                if line.endswith(" " + ref):
                    return line.split()[0][:12]
            return "unknown"
        return text[:12]
    except OSError:
        return "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _banner(scenario: Scenario, path: str, seeds: list[int]) -> None:
    seed_text = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}..{seeds[-1]}"
    print(f"sim: scenario {scenario.name} ({path}, sha256 {scenario.sha256}) seed {seed_text}")
    print(f"sim: python {platform.python_version()}, trio {trio.__version__}, "
          f"rivven-trio {_version('rivven-trio')}, git {_git_commit()}, "
          f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', 'random')}")
    if scenario.test.any:
        print(f"sim: TEST SWITCHES ON: {scenario.test}")


def _summary(result: RunResult) -> str:
    stats = result.stats
    return (f"trace {result.trace_digest[:16]}, {stats.get('send.ok', 0)} sends ok, "
            f"{stats.get('poll.ok', 0)} polls, {stats['faults']} faults, "
            + (f"{stats['controller_acknowledged']} controller commands over "
               f"{stats['controller_terms']} terms, " if "controller_terms" in stats else "")
            + f"{stats['virtual_s']} virtual s")


def _show_entries(result: RunResult, indexes: Sequence[int]) -> None:
    history = result.history
    wanted: set[int] = set()
    for index in sorted(set(indexes))[:_ENTRIES_SHOWN]:
        entry = history.entries[index]
        wanted.add(index)
        if entry.invoke is not None:
            wanted.add(entry.invoke)
    if not wanted:
        return
    first, last = min(wanted), max(wanted)
    events = [e for e in history.entries
              if e.process == "nemesis" or e.f in ("crash", "start", "stopped", "fsync_failed")]
    before = [e for e in events if e.index < first][-_CONTEXT_EVENTS // 2:]
    after = [e for e in events if e.index > last][:_CONTEXT_EVENTS // 2]
    print("    faults and node events around it:")
    for entry in before + [e for e in events if first < e.index < last] + after:
        print(f"      {entry.describe()}")
    print("    first bad history entries:")
    for index in sorted(wanted):
        print(f"      {history.entries[index].describe()}")


def _report_failure(result: RunResult, args: argparse.Namespace) -> pathlib.Path:
    broken: dict[str, list] = {}
    for violation in result.violations:
        broken.setdefault(violation.invariant, []).append(violation)
    for invariant, violations in broken.items():
        print(f"  VIOLATED {invariant}")
        shown = violations[:3] + [v for v in violations[3:] if v.message.startswith("... and ")]
        for violation in shown:
            print("    " + violation.message.replace("\n", "\n    "))
        _show_entries(result, [i for v in violations for i in v.entries])
    path = _write_schedule(result, list(result.schedule), args, shrunk=False)
    print(f"  realised fault schedule: {path}")
    print(f"  replay: {_replay_command(args.scenario, result.seed, path)}")
    return path


def _write_schedule(result: RunResult, faults: list[Fault], args: argparse.Namespace, *,
                    shrunk: bool) -> pathlib.Path:
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "-shrunk" if shrunk else ""
    path = out / f"{result.scenario.name}-seed{result.seed}{suffix}.toml"
    invariants = tuple(dict.fromkeys(v.invariant for v in result.violations))
    path.write_text(dump_schedule(ScheduleFile(
        result.scenario.name, result.scenario.sha256, result.seed, result.trace_digest,
        invariants, tuple(faults), shrunk)))
    return path


def _replay_command(scenario_path: str, seed: int, schedule: pathlib.Path) -> str:
    return shlex.join(["python", "-m", "sim", scenario_path, "--seed", str(seed),
                       "--replay", str(schedule)])


def _run_once(scenario: Scenario, seed: int, faults: list[Fault] | None,
              trace_path: str | None) -> RunResult:
    if trace_path is None:
        return run_scenario(scenario, seed, schedule=faults)
    with open(trace_path, "w") as file:
        return run_scenario(scenario, seed, schedule=faults,
                            trace_sink=lambda line: file.write(line + "\n"))


def _check_determinism(scenario: Scenario, seed: int,
                       faults: list[Fault] | None) -> RunResult | None:
    """Run twice; the first result when both traces agree, else None (after saying where)."""
    lines: list[list[str]] = [[], []]
    results = [run_scenario(scenario, seed, schedule=faults, trace_sink=lines[i].append)
               for i in range(2)]
    digests = [result.trace_digest for result in results]
    if digests[0] == digests[1]:
        print(f"  deterministic: both runs traced {digests[0][:16]}")
        return results[0]
    print(f"  NONDETERMINISTIC: {digests[0][:16]} != {digests[1][:16]}")
    for number, (a, b) in enumerate(zip(*lines)):
        if a != b:
            print(f"    first divergence at trace event {number}:\n      run 1: {a}\n      run 2: {b}")
            break
    return None


def _shrink(result: RunResult, args: argparse.Namespace) -> None:
    invariant = result.violations[0].invariant
    print(f"  shrinking {len(result.schedule)} faults while {invariant} still breaks ...")

    def run(faults: list[Fault]) -> set[str]:
        return {v.invariant for v in run_scenario(result.scenario, result.seed, schedule=faults).violations}

    faults, runs = shrink(result.schedule, invariant, run)
    smaller = run_scenario(result.scenario, result.seed, schedule=faults)
    path = _write_schedule(smaller, faults, args, shrunk=True)
    print(f"  shrunk to {len(faults)} fault(s) in {runs} runs: {path}")
    print(f"  replay: {_replay_command(args.scenario, result.seed, path)}")


def _results(scenario: Scenario, seeds: list[int], faults: list[Fault] | None,
             args: argparse.Namespace) -> Iterator[tuple[int, RunResult | None]]:
    """Every seed's result in seed order (None: a determinism check failed). With ``--jobs``
    the runs go to worker processes; each run is as deterministic there as here."""
    if args.jobs > 1 and len(seeds) > 1:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter, no forked state
        with ProcessPoolExecutor(min(args.jobs, len(seeds)), mp_context=context) as pool:
            runs = pool.map(run_in_worker, [scenario] * len(seeds), seeds,
                            [faults] * len(seeds))
            yield from zip(seeds, runs)
        return
    for seed in seeds:
        if args.check_determinism:
            yield seed, _check_determinism(scenario, seed, faults)
        else:
            yield seed, _run_once(scenario, seed, faults, args.trace)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    keep_freed_memory()  # as rivven-broker does: the simulated disks copy MiB buffers
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL,
                        format=log_context.FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(log_context.ActorFilter())
    if args.verbose:
        logging.getLogger("rivven_broker").setLevel(logging.INFO)
    try:
        scenario = load(args.scenario)
        replay = None
        if args.replay:
            replay = load_schedule(pathlib.Path(args.replay).read_bytes())
        seeds = _seeds(args, scenario, replay)
    except (ScenarioError, OSError) as exc:
        print(f"sim: {exc}", file=sys.stderr)
        return 2
    _banner(scenario, args.scenario, seeds)
    faults = list(replay.faults) if replay is not None else None
    if replay is not None:
        print(f"sim: replaying {args.replay}: {len(faults or [])} faults, nemesis off")
        if replay.scenario_sha256 != scenario.sha256:
            print("sim: warning: the scenario changed since the schedule was written")
    if args.jobs < 1 or (args.jobs > 1 and (args.check_determinism or args.trace)):
        print("sim: --jobs must be >= 1, and 1 with --check-determinism or --trace",
              file=sys.stderr)
        return 2
    failed = 0
    for seed, result in _results(scenario, seeds, faults, args):
        if result is None:
            failed += 1
            continue
        verdict = "ok" if result.ok else "FAILED: " + ", ".join(
            dict.fromkeys(v.invariant for v in result.violations))
        print(f"sim: seed {seed} {verdict} ({_summary(result)})")
        if replay is not None and replay.seed == seed:
            same = result.trace_digest == replay.trace_digest
            print("sim: replay reproduced the original run exactly" if same else
                  "sim: replay trace differs from the original run (shrunk or edited schedule?)")
        if not result.ok:
            failed += 1
            _report_failure(result, args)
            if args.shrink:
                _shrink(result, args)
    if len(seeds) > 1:
        print(f"sim: {len(seeds) - failed} of {len(seeds)} seeds ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
