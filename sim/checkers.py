"""Checkers: the invariants a run must keep, judged from the history and the final read.

Theory of operation
-------------------
After a run the simulator holds three things: the ``History`` (what clients asked and were
told), the final read of every partition (``PartitionLog``: ground truth after the last crash
and restart), and violations the world noticed online (a node that kept serving after a failed
fsync, a node that died of an unexpected exception). ``check`` runs every enabled checker and
returns ``Violation``s, each naming its invariant and the history entries that prove it.

Invariants (names as in ``docs/invariants.md`` and ``[checks] disabled``):

- ``no_lost_acked_writes``: a send acknowledged (``ok``, acks 1 or all) under ``sync=always``
  is in the final log at its acknowledged offset with its value.
- ``offset_agreement``: every observation of ``(topic, partition, offset)`` (acks, polls, the
  final read) names the same value, and that value was sent by someone.
- ``monotonic_gapless``: a poll accounts for every offset in ``[from, to)`` (records and control
  records; compaction would be the other exception), in increasing order; the final read has no
  holes; on one connection a producer's acknowledged offsets grow in send order.
- ``no_duplicates``: no value appears twice in the final log, except values of a plain
  (non-idempotent) producer that resends on its own (the real client: ``resends`` in the send).
- ``no_failed_write_visible``: a send that ``fail``ed (definitely rejected) is never read.
- ``reads_durable``: everything a consumer read is still in the final log (consumers never read
  past the durable prefix: under ``sync=always`` the high watermark is the durable offset).
- ``batches_intact``: no fetch ever returned a malformed or CRC-failing batch.
- ``group_offsets_within_log``: a committed group offset never exceeds the partition's final
  high watermark (hook: no history has ``commit_offsets`` until consumer groups exist).
- ``group_commits_durable``: an acknowledged commit survives coordinator crashes and moves:
  a member given a partition starts reading at or after every commit of it acknowledged
  before that read began (else the group re-reads what it had committed), and every
  group's committed offset read from its coordinator after the run is at least the highest
  acknowledged commit.
- ``group_once_per_generation``: within one generation of a group, each partition is read
  by one member only (polls record the member's generation for the partitions it owns).
- ``transactions_atomic``: a ``read_committed`` poll never returns a value of an aborted or
  unfinished transaction, and a committed transaction's values are all in the final log (hook:
  transactional sends carry ``transactional_id``; ``commit``/``abort`` ops close them).
- ``liveness``: after the last fault healed, every producer gets a send acknowledged and every
  consumer reads something within ``liveness_within``.

``node_stops_after_fsync_failure`` and ``no_unexpected_node_failure`` are raised by the world
while the run goes on; they arrive here in ``online``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

import attrs

from sim.history import FAIL, INVOKE, OK, Entry, History
from sim.scenario import Scenario
from sim.workload import PartitionLog

__all__ = ["Violation", "RunFacts", "check"]

_EXAMPLES_MAX = 5


@attrs.frozen
class Violation:
    """An invariant broken: its name, what happened, and the history entries to look at."""

    invariant: str
    message: str
    entries: tuple[int, ...] = ()


@attrs.frozen
class RunFacts:
    """What the world knows besides the history, for the checkers."""

    final: Mapping[tuple[str, int], PartitionLog] | None
    producers: tuple[str, ...]
    consumers: tuple[str, ...]
    last_heal_ms: float
    end_ms: float
    online: tuple[Violation, ...] = ()
    read_error: str | None = None
    #: The run was cut short (a livelock): only the online findings mean anything.
    stopped: bool = False
    #: Every group's committed offsets after the run (``{"topic/partition": offset}``).
    group_offsets: Mapping[str, Mapping[str, int]] | None = None


def check(scenario: Scenario, history: History, facts: RunFacts) -> list[Violation]:
    """Run every enabled checker. Returns violations, invariant by invariant."""
    sends = _sends(history)
    polls = [(i, c) for i, c in history.completions("poll", OK)]
    found = [v for v in facts.online if scenario.checked(v.invariant)]
    if facts.stopped:
        return _summarised(found)
    final = facts.final
    if final is None:
        found.append(Violation("liveness", f"the final read failed: {facts.read_error}"))
    checkers = []
    if final is not None:
        checkers += [
            ("no_lost_acked_writes", lambda: _lost_writes(sends, final)),
            ("reads_durable", lambda: _reads_durable(polls, final)),
            ("no_failed_write_visible", lambda: _failed_visible(sends, polls, final)),
            ("no_duplicates", lambda: _duplicates(sends, final)),
        ]
    checkers += [
        ("offset_agreement", lambda: _offset_agreement(sends, polls, final)),
        ("monotonic_gapless", lambda: _gapless(sends, polls, final)),
        ("batches_intact", lambda: _intact(history, final)),
        ("group_offsets_within_log", lambda: _group_offsets(history, final)),
        ("group_commits_durable", lambda: _group_commits(history, facts.group_offsets)),
        ("group_once_per_generation", lambda: _once_per_generation(history)),
        ("transactions_atomic", lambda: _transactions(history, sends, polls, final)),
        ("liveness", lambda: _liveness(scenario, history, facts)),
    ]
    for name, checker in checkers:
        if scenario.checked(name):
            found.extend(checker())
    return _summarised(found)


# --- helpers ---------------------------------------------------------------------------------

_Send = tuple[Entry, Entry]  # (invoke, completion)


def _sends(history: History) -> list[_Send]:
    return list(history.completions("send"))


def _limited(invariant: str, problems: list[tuple[str, tuple[int, ...]]]) -> list[Violation]:
    return [Violation(invariant, message, entries) for message, entries in problems]


def _summarised(violations: list[Violation]) -> list[Violation]:
    """At most ``_EXAMPLES_MAX`` violations per invariant, plus a count of the rest."""
    by_invariant: dict[str, list[Violation]] = {}
    for violation in violations:
        by_invariant.setdefault(violation.invariant, []).append(violation)
    out = []
    for invariant, found in by_invariant.items():
        out += found[:_EXAMPLES_MAX]
        if len(found) > _EXAMPLES_MAX:
            out.append(Violation(invariant, f"... and {len(found) - _EXAMPLES_MAX} more like these"))
    return out


def _acked_offsets(send: _Send) -> Iterable[tuple[tuple[str, int, int], str]]:
    invoke, done = send
    base = done.value["offset"]
    for i, value in enumerate(invoke.value["values"]):
        yield (invoke.value["topic"], invoke.value["partition"], base + i), value


def _acked(sends: list[_Send]) -> Iterable[_Send]:
    return (s for s in sends if s[1].type == OK and s[0].value["acks"] != 0)


# --- the checkers ----------------------------------------------------------------------------


def _lost_writes(sends: list[_Send], final: Mapping[tuple[str, int], PartitionLog]) -> list[Violation]:
    problems = []
    for send in _acked(sends):
        for (topic, partition, offset), value in _acked_offsets(send):
            log = final.get((topic, partition))
            if log is None or offset < log.log_start_offset:
                continue
            found = log.records.get(offset)
            if found != value:
                where = "is missing" if found is None else f"holds {found!r}"
                problems.append((
                    f"{value!r} acknowledged at {topic}/{partition}@{offset}, but the final log "
                    f"{where} there (high watermark {log.high_watermark})",
                    (send[0].index, send[1].index),
                ))
    return _limited("no_lost_acked_writes", problems)


def _offset_agreement(sends: list[_Send], polls: list[tuple[Entry, Entry]],
                      final: Mapping[tuple[str, int], PartitionLog] | None) -> list[Violation]:
    sent = {v for invoke, _ in sends for v in invoke.value["values"]}
    seen: dict[tuple[str, int, int], tuple[str, int]] = {}
    problems = []

    def observe(key: tuple[str, int, int], value: Any, entry: int) -> None:
        if value not in sent:
            problems.append((f"{key[0]}/{key[1]}@{key[2]} holds {value!r}, which nobody sent",
                             (entry,) if entry >= 0 else ()))
        first = seen.setdefault(key, (value, entry))
        if first[0] != value:
            problems.append((
                f"{key[0]}/{key[1]}@{key[2]} read as {first[0]!r} and as {value!r}",
                tuple(e for e in (first[1], entry) if e >= 0),
            ))

    for send in _acked(sends):
        for key, value in _acked_offsets(send):
            observe(key, value, send[1].index)
    for _, poll in polls:
        for offset, value in poll.value["records"]:
            observe((poll.value["topic"], poll.value["partition"], offset), value, poll.index)
    for (topic, partition), log in sorted((final or {}).items()):
        for offset, value in sorted(log.records.items()):
            observe((topic, partition, offset), value, -1)
    return _limited("offset_agreement", problems)


def _gapless(sends: list[_Send], polls: list[tuple[Entry, Entry]],
             final: Mapping[tuple[str, int], PartitionLog] | None) -> list[Violation]:
    problems = []
    for _, poll in polls:
        v = poll.value
        offsets = [offset for offset, _ in v["records"]]
        if offsets != sorted(set(offsets)):
            problems.append((f"{v['topic']}/{v['partition']}: poll offsets not increasing",
                             (poll.index,)))
        accounted = set(offsets) | set(v["control"])
        missing = [o for o in range(v["from"], v["to"]) if o not in accounted]
        if missing:
            problems.append((
                f"{v['topic']}/{v['partition']}: poll of [{v['from']}, {v['to']}) skipped "
                f"offset(s) {missing[:10]}", (poll.index,)))
    for (topic, partition), log in sorted((final or {}).items()):
        for start, end, missing in log.holes:
            problems.append((f"{topic}/{partition}: final read of [{start}, {end}) skipped "
                             f"offset(s) {missing}", ()))
    last: dict[tuple[str, int, str, int], tuple[int, int]] = {}
    for invoke, done in sorted(sends, key=lambda send: send[0].index):
        if done.type != OK or invoke.value["acks"] == 0 or "session" not in invoke.value:
            continue  # only the thin client sends in a known order on a known connection
        key = (invoke.value["topic"], invoke.value["partition"], invoke.process,
               invoke.value.get("session", 0))
        offset = done.value["offset"]
        previous = last.get(key)
        if previous is not None and offset <= previous[0]:
            problems.append((
                f"{key[2]} sent to {key[0]}/{key[1]} in order but got offset {offset} after "
                f"{previous[0]}", (previous[1], done.index)))
        last[key] = (offset, done.index)
    return _limited("monotonic_gapless", problems)


def _duplicates(sends: list[_Send], final: Mapping[tuple[str, int], PartitionLog]) -> list[Violation]:
    may_repeat = {v for invoke, _ in sends if invoke.value.get("resends") and not invoke.value["idempotent"]
                  for v in invoke.value["values"]}
    where: dict[Any, str] = {}
    problems = []
    for (topic, partition), log in sorted(final.items()):
        for offset, value in sorted(log.records.items()):
            here = f"{topic}/{partition}@{offset}"
            if value in where and value not in may_repeat:
                problems.append((f"{value!r} is in the log twice: {where[value]} and {here}", ()))
            else:
                where[value] = here
    return _limited("no_duplicates", problems)


def _failed_visible(sends: list[_Send], polls: list[tuple[Entry, Entry]],
                    final: Mapping[tuple[str, int], PartitionLog]) -> list[Violation]:
    failed = {v: done.index for invoke, done in sends if done.type == FAIL
              for v in invoke.value["values"]}
    problems = []
    for _, poll in polls:
        for offset, value in poll.value["records"]:
            if value in failed:
                problems.append((f"{value!r} was rejected but a consumer read it at {offset}",
                                 (failed[value], poll.index)))
    for (topic, partition), log in sorted(final.items()):
        for offset, value in sorted(log.records.items()):
            if value in failed:
                problems.append((f"{value!r} was rejected but is in the log at "
                                 f"{topic}/{partition}@{offset}", (failed[value],)))
    return _limited("no_failed_write_visible", problems)


def _reads_durable(polls: list[tuple[Entry, Entry]],
                   final: Mapping[tuple[str, int], PartitionLog]) -> list[Violation]:
    problems = []
    for _, poll in polls:
        log = final.get((poll.value["topic"], poll.value["partition"]))
        if log is None:
            continue
        for offset, value in poll.value["records"]:
            if offset >= log.log_start_offset and log.records.get(offset) != value:
                problems.append((
                    f"{poll.process} read {value!r} at {log.topic}/{log.partition}@{offset}, "
                    f"which the final log does not hold (high watermark {log.high_watermark})",
                    (poll.index,)))
                break
    return _limited("reads_durable", problems)


def _intact(history: History, final: Mapping[tuple[str, int], PartitionLog] | None) -> list[Violation]:
    problems = [(f"{e.process} got a bad batch: {e.value['error']}", (e.index,))
                for e in history if e.f == "corrupt_batch"]
    for log in (final or {}).values():
        problems += [(f"final read of {log.topic}/{log.partition}: {text}", ()) for text in log.corrupt]
    return _limited("batches_intact", problems)


def _group_offsets(history: History,
                   final: Mapping[tuple[str, int], PartitionLog] | None) -> list[Violation]:
    if final is None:
        return []
    problems = []
    for _, done in history.completions("commit_offsets", OK):
        for key, offset in done.value["offsets"].items():
            topic, _, partition = key.rpartition("/")
            log = final.get((topic, int(partition)))
            if log is not None and offset > log.high_watermark:
                problems.append((f"group {done.value['group']} committed {key}@{offset} beyond "
                                 f"the log end {log.high_watermark}", (done.index,)))
    return _limited("group_offsets_within_log", problems)


def _group_commits(history: History,
                   group_offsets: Mapping[str, Mapping[str, int]] | None) -> list[Violation]:
    if group_offsets is None:
        return []
    acked: dict[tuple[str, str], tuple[int, int]] = {}  # (group, key) -> (offset, entry)
    for _, done in history.completions("commit_offsets", OK):
        for key, offset in done.value["offsets"].items():
            best = acked.get((done.value["group"], key))
            if best is None or offset > best[0]:
                acked[(done.value["group"], key)] = (offset, done.index)
    problems = []
    commits = sorted(  # (acknowledged at, group, key, offset, entry)
        (done.time_ms, done.value["group"], key, offset, done.index)
        for _, done in history.completions("commit_offsets", OK)
        for key, offset in done.value["offsets"].items())
    for start, poll in history.completions("poll", OK):
        if not poll.value.get("assigned"):
            continue
        key = f"{poll.value['topic']}/{poll.value['partition']}"
        first = poll.value["records"][0][0]
        before = [(offset, index) for at, group, k, offset, index in commits
                  if at < start.time_ms and group == poll.value["group"] and k == key]
        if before and max(before)[0] > first:
            offset, index = max(before)
            problems.append((f"group {poll.value['group']}: {poll.process} was given {key} and "
                             f"read from {first}, below the acknowledged commit {offset}",
                             (index, poll.index)))
    for (group, key), (offset, index) in sorted(acked.items()):
        now = group_offsets.get(group, {}).get(key)
        if now is None or now < offset:
            problems.append((f"group {group} acknowledged a commit of {key}@{offset}; after the "
                             f"run its offset is {now}", (index,)))
    return _limited("group_commits_durable", problems)


def _once_per_generation(history: History) -> list[Violation]:
    owners: dict[tuple[str, int, str, int], tuple[str, int]] = {}  # -> (member, entry)
    problems = []
    for _, poll in history.completions("poll", OK):
        generation = poll.value.get("generation")
        if generation is None:
            continue
        key = (poll.value["group"], generation, poll.value["topic"], poll.value["partition"])
        first = owners.setdefault(key, (poll.process, poll.index))
        if first[0] != poll.process:
            problems.append((f"group {key[0]} generation {generation}: {first[0]} and "
                             f"{poll.process} both read {key[2]}/{key[3]}",
                             (first[1], poll.index)))
    return _limited("group_once_per_generation", problems)


def _transactions(history: History, sends: list[_Send], polls: list[tuple[Entry, Entry]],
                  final: Mapping[tuple[str, int], PartitionLog] | None) -> list[Violation]:
    values_of: dict[tuple[str, int], list[str]] = defaultdict(list)  # (txn id, number) -> values
    number: dict[str, int] = defaultdict(int)
    fate: dict[tuple[str, int], str] = {}  # "commit" | "abort" | "unknown"
    ending: dict[int, tuple[str, int]] = {}  # invoke index of commit/abort -> transaction
    for entry in history:
        if entry.type == INVOKE and entry.f == "send" and entry.value.get("transactional_id"):
            txn = entry.value["transactional_id"]
            values_of[(txn, number[txn])].extend(entry.value["values"])
        elif entry.type == INVOKE and entry.f in ("commit", "abort"):
            txn = entry.value["transactional_id"]
            ending[entry.index] = (txn, number[txn])
            fate[(txn, number[txn])] = "unknown"
            number[txn] += 1
        elif entry.f in ("commit", "abort") and entry.invoke in ending:
            key = ending[entry.invoke]
            fate[key] = entry.f if entry.type == OK else ("abort" if entry.type == FAIL else "unknown")
    if not values_of:
        return []
    invisible = {v: key for key, values in values_of.items() if fate.get(key) in (None, "abort")
                 for v in values}
    problems = []
    for _, poll in polls:
        if poll.value.get("isolation") != "read_committed":
            continue
        for offset, value in poll.value["records"]:
            if value in invisible:
                problems.append((f"read_committed {poll.process} read {value!r} of transaction "
                                 f"{invisible[value]} which did not commit", (poll.index,)))
    if final is not None:
        present = {v for log in final.values() for v in log.records.values()}
        for key, values in values_of.items():
            if fate.get(key) == "commit":
                gone = [v for v in values if v not in present]
                if gone:
                    problems.append((f"committed transaction {key} lost {gone[:5]}", ()))
    return _limited("transactions_atomic", problems)


def _liveness(scenario: Scenario, history: History, facts: RunFacts) -> list[Violation]:
    start = facts.last_heal_ms
    end = start + scenario.checks.liveness_within_ms
    if end > facts.end_ms:
        return []
    progressed: set[str] = set()
    for entry in history:
        if start < entry.time_ms <= end and entry.type != "invoke":
            if entry.f == "send" and (entry.type == OK or entry.value.get("error") == "acks=0"):
                progressed.add(entry.process)
            elif entry.f == "poll" and entry.type == OK:
                progressed.add(entry.process)
    problems = [
        (f"{name} made no progress within {scenario.checks.liveness_within_ms} ms after the "
         f"last heal at {start / 1000:.3f}s", ())
        for name in (*facts.producers, *facts.consumers) if name not in progressed
    ]
    return _limited("liveness", problems)
