"""``replication-offset.checkpoint``: the high watermark of every replicated partition.

A leader computes its high watermark from its followers' fetches; a restarted broker has
none until they fetch again. So every few seconds the replica manager writes what it knows
(as leader: its own; as follower: the leader's last answer) to one file in the data directory,
and a broker that leads after a restart starts from it (clamped to its log end). Kafka keeps
the same file. A value can only be low, never wrong: everything below a high watermark was on
disk on every ISR member when it was computed.

Format: a version line, then ``high_watermark partition topic`` a line (topic names hold no
spaces). Replaced whole: tmp, fsync, rename, fsync of the directory. A damaged file is
ignored (with a warning): the high watermarks then start low and catch up at the first
fetches.
"""

from __future__ import annotations

import logging
import posixpath

from rivven_broker.storage.checkpoint import TMP_SUFFIX
from rivven_broker.storage.file_store import FileStore

__all__ = ["HIGH_WATERMARKS_FILE", "read_high_watermarks", "write_high_watermarks"]

log = logging.getLogger(__name__)

HIGH_WATERMARKS_FILE = "replication-offset.checkpoint"
_VERSION_LINE = "rivven-high-watermarks 1"
_FILE_BYTES_MAX = 64 << 20


def read_high_watermarks(store: FileStore, directory: str = "") -> dict[tuple[str, int], int]:
    """What the file holds (empty when missing or damaged). Blocks on file I/O."""
    path = posixpath.join(directory, HIGH_WATERMARKS_FILE) if directory else HIGH_WATERMARKS_FILE
    if not store.exists(path):
        return {}
    handle = store.open(path, create=False)
    try:
        data = store.pread(handle, _FILE_BYTES_MAX, 0)
    finally:
        store.close(handle)
    try:
        lines = data.decode("ascii").splitlines()
        if not lines or lines[0] != _VERSION_LINE:
            raise ValueError("not a high-watermark checkpoint")
        values = {}
        for line in lines[1:]:
            offset, partition, topic = line.split(" ")
            if int(offset) < 0 or int(partition) < 0:
                raise ValueError(line)
            values[(topic, int(partition))] = int(offset)
        return values
    except (UnicodeDecodeError, ValueError) as exc:
        log.warning("%s is damaged (%s): high watermarks start from the first fetches", path,
                    exc)
        return {}


def write_high_watermarks(store: FileStore, values: dict[tuple[str, int], int],
                          directory: str = "") -> None:
    """Replace the file with ``values``, durably. Blocks on two fsyncs.

    Raises:
        OSError: the store failed (the old file, or the new one, is in place).
    """
    path = posixpath.join(directory, HIGH_WATERMARKS_FILE) if directory else HIGH_WATERMARKS_FILE
    body = "\n".join([_VERSION_LINE, *(f"{hw} {p} {t}" for (t, p), hw in sorted(values.items()))])
    tmp = path + TMP_SUFFIX
    handle = store.open(tmp)
    try:
        store.truncate(handle, 0)
        store.pwrite(handle, (body + "\n").encode("ascii"), 0)
        store.fsync(handle)
    finally:
        store.close(handle)
    store.rename(tmp, path)
    store.fsync_dir(directory)
