"""The crash-safe swap of a rewritten segment, and the repair of one a crash interrupted.

Theory of operation
-------------------
Compaction (``cleaner.py``) rewrites a sealed segment ``X`` into ``X.{log,index,timeindex}``
``.cleaned`` files, fsynced with their directory, and then swaps them in (``swap_in``), each
step durable before the next::

    1   rename X.index.cleaned, X.timeindex.cleaned -> .swap ; fsync dir
    2   rename X.log.cleaned -> X.log.swap ; fsync dir        (commit point)
    3   remove X.log, X.index, X.timeindex ; fsync dir
    4   rename X.index.swap, X.timeindex.swap -> final ; fsync dir
    5   rename X.log.swap -> X.log ; fsync dir

``recover_swaps(store, directory)`` runs before recovery (``recovery.py``) lists a
partition's segments: with ``X.log.swap`` present the new version wins (old files removed,
swaps renamed in; an index without its swap is removed and recovery rebuilds it from the
log), otherwise every ``.cleaned``/``.swap`` file of ``X`` is removed and the old segment
stands. So a crash at any point leaves the old segment or the new one visible, never neither
and never both. The names and this protocol live here, so that opening a log does not depend
on the compaction cleaner.
"""

from __future__ import annotations

import posixpath

from rivven_broker.storage.file_store import FileStore
from rivven_broker.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    parse_segment_file_name,
    segment_file_name,
)

__all__ = [
    "CLEANED_SUFFIX",
    "SWAP_SUFFIX",
    "SEGMENT_SUFFIXES",
    "swap_file_name",
    "swap_in",
    "recover_swaps",
]

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
_INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
#: A segment's files: its log and both indexes.
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)


def swap_file_name(base_offset: int, suffix: str, extra: str = "") -> str:
    """The name of the segment file at ``base_offset`` with ``suffix``, plus ``extra``
    (``CLEANED_SUFFIX``, ``SWAP_SUFFIX`` or nothing)."""
    return segment_file_name(base_offset, suffix) + extra


def swap_in(store: FileStore, directory: str, base: int) -> None:
    """Steps 1-5 of the module docstring for the segment at ``base``, whose ``.cleaned``
    files are written and fsynced. Blocks on file I/O; raises ``OSError`` if the store
    fails (a crash or error at any step leaves what ``recover_swaps`` repairs)."""

    def path(suffix: str, extra: str = "") -> str:
        return posixpath.join(directory, swap_file_name(base, suffix, extra))

    for suffix in _INDEX_SUFFIXES:
        store.rename(path(suffix, CLEANED_SUFFIX), path(suffix, SWAP_SUFFIX))
    store.fsync_dir(directory)
    store.rename(path(LOG_SUFFIX, CLEANED_SUFFIX), path(LOG_SUFFIX, SWAP_SUFFIX))
    store.fsync_dir(directory)  # the commit point: from here on the new segment wins
    for suffix in SEGMENT_SUFFIXES:
        if store.exists(path(suffix)):
            store.remove(path(suffix))
    store.fsync_dir(directory)
    for suffix in _INDEX_SUFFIXES:
        store.rename(path(suffix, SWAP_SUFFIX), path(suffix))
    store.fsync_dir(directory)
    store.rename(path(LOG_SUFFIX, SWAP_SUFFIX), path(LOG_SUFFIX))
    store.fsync_dir(directory)


def _leftovers(names: list[str]) -> dict[int, set[str]]:
    """Base offset -> names of its ``.cleaned``/``.swap`` files."""
    found: dict[int, set[str]] = {}
    for name in names:
        for extra in (CLEANED_SUFFIX, SWAP_SUFFIX):
            if name.endswith(extra):
                parsed = parse_segment_file_name(name[: -len(extra)])
                if parsed is not None:
                    found.setdefault(parsed[0], set()).add(name)
    return found


def recover_swaps(store: FileStore, directory: str) -> list[str]:
    """Finish or roll back interrupted swaps in ``directory`` (see the module docstring);
    return the names removed or renamed. Blocks on file I/O (one directory fsync if anything
    changed). Raises ``OSError`` if the store fails."""
    if not store.exists(directory):
        return []
    names = store.listdir(directory)
    present = set(names)
    changed: list[str] = []

    def path(name: str) -> str:
        return posixpath.join(directory, name)

    for base, leftover in sorted(_leftovers(names).items()):
        log_swap = swap_file_name(base, LOG_SUFFIX, SWAP_SUFFIX)
        if log_swap in leftover:  # committed: the new segment wins
            for suffix in _INDEX_SUFFIXES:
                swap = swap_file_name(base, suffix, SWAP_SUFFIX)
                final = swap_file_name(base, suffix)
                if swap in leftover:
                    store.rename(path(swap), path(final))
                    leftover.discard(swap)
                elif final in present:
                    store.remove(path(final))  # which version it indexes is unknown: rebuild
                changed.append(final)
            store.rename(path(log_swap), path(swap_file_name(base, LOG_SUFFIX)))
            leftover.discard(log_swap)
            changed.append(log_swap)
        for name in sorted(leftover):  # .cleaned files, or a swap that never committed
            store.remove(path(name))
            changed.append(name)
    if changed:
        store.fsync_dir(directory)
    return changed
