"""Schedule files: a realised fault schedule written as TOML, for ``--replay`` and ``--shrink``.

Theory of operation
-------------------
When a run fails, the simulator writes what it did as an explicit schedule: a ``[replay]``
table (scenario name and hash, seed, the trace digest and the broken invariants of the
original run) and the run's ``[[faults]]`` with every selector resolved and every random
nemesis fault spelled out. Replaying runs the same scenario and seed with the nemesis off and
exactly these faults; because fault generation draws from its own random streams, the replay
is the original run again, and its trace digest must match. A shrunk schedule is the same
file with fewer faults (its digest then differs, its invariant must not).

A failing schedule worth keeping becomes a *regression*: the file copied to
``sim/scenarios/regressions/`` with two more keys in ``[replay]``, ``about`` (what was wrong)
and ``fixed_in`` (the commit that fixed it). ``make test`` replays every regression against
its scenario (``tests/sim/test_regressions.py``) and requires it to pass.

This module is pure: it formats and parses text.
"""

from __future__ import annotations

import tomllib
import attrs

from sim.scenario import Fault, ScenarioError, parse_faults

__all__ = ["ScheduleFile", "dump_schedule", "load_schedule"]


@attrs.frozen
class ScheduleFile:
    scenario: str
    scenario_sha256: str
    seed: int
    trace_digest: str
    invariants: tuple[str, ...]
    faults: tuple[Fault, ...]
    shrunk: bool = False
    #: Regressions only: what was wrong, and the commit that fixed it.
    about: str = ""
    fixed_in: str = ""


def dump_schedule(schedule: ScheduleFile) -> str:
    """The TOML text of ``schedule``."""
    invariants = ", ".join(f'"{name}"' for name in schedule.invariants)
    head = [
        "# A realised fault schedule written by `python -m sim`. Replay it with",
        f"#   python -m sim <{schedule.scenario}.toml> --seed {schedule.seed} --replay <this file>",
        "[replay]",
        f'scenario = "{schedule.scenario}"',
        f'scenario_sha256 = "{schedule.scenario_sha256}"',
        f"seed = {schedule.seed}",
        f'trace_digest = "{schedule.trace_digest}"',
        f"invariants = [{invariants}]",
        f"shrunk = {'true' if schedule.shrunk else 'false'}",
        *([f"about = {_quoted(schedule.about)}"] if schedule.about else []),
        *([f"fixed_in = {_quoted(schedule.fixed_in)}"] if schedule.fixed_in else []),
        "",
    ]
    body = [fault.to_toml() + "\n" for fault in schedule.faults]
    return "\n".join(head + body)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def load_schedule(data: bytes) -> ScheduleFile:
    """Parse a schedule file. Raises ``ScenarioError``."""
    try:
        root = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"schedule: not valid TOML: {exc}") from None
    replay = root.get("replay")
    if not isinstance(replay, dict):
        raise ScenarioError("schedule: missing [replay] table")
    try:
        faults = parse_faults(root.get("faults", []), "faults")
        return ScheduleFile(
            scenario=str(replay["scenario"]),
            scenario_sha256=str(replay["scenario_sha256"]),
            seed=int(replay["seed"]),
            trace_digest=str(replay["trace_digest"]),
            invariants=tuple(str(name) for name in replay.get("invariants", [])),
            faults=faults,
            shrunk=bool(replay.get("shrunk", False)),
            about=str(replay.get("about", "")),
            fixed_in=str(replay.get("fixed_in", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ScenarioError):
            raise
        raise ScenarioError(f"schedule: bad [replay] table: {exc!r}") from None
