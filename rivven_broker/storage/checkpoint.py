"""Small checkpoint files of a partition directory: one offset each, replaced atomically.

Theory of operation
-------------------
A partition log keeps two offsets outside its segments: the *log start offset* (raised by
``delete_records``) and the *recovery point* (below it every segment and its indexes were
fsynced, so recovery only sanity-checks them). Each lives in its own 18-byte file::

    offset size field
         0    4 magic     b"RVCK"
         4    2 version   u16 BE, 1
         6    8 value     i64 BE, the offset
        14    4 crc       u32 BE, CRC32C of bytes [0, 14)

A checkpoint is replaced by writing ``<name>.tmp``, fsyncing it, renaming it over ``<name>``
and fsyncing the directory, so a crash leaves either the old or the new value (a leftover
``.tmp`` is deleted by recovery). ``stage_checkpoint`` does the first step only, under a name
of its own, for a caller that fsyncs the file elsewhere (the group commit) and renames it
later (the partition log's recovery point). ``read_checkpoint`` returns ``None`` for a missing file and
raises ``CorruptLogError`` for a damaged one: a checkpoint is only ever replaced whole, so damage
means the disk lied, and guessing could lose acknowledged data.
"""

from __future__ import annotations

import posixpath
import struct

import crc32c as _crc32c

from rivven_broker.storage.errors import CorruptLogError
from rivven_broker.storage.file_store import FileStore

__all__ = [
    "LOG_START_OFFSET_FILE",
    "RECOVERY_POINT_FILE",
    "TMP_SUFFIX",
    "read_checkpoint",
    "write_checkpoint",
    "stage_checkpoint",
    "encode_checkpoint",
]

LOG_START_OFFSET_FILE = "log-start-offset.checkpoint"
RECOVERY_POINT_FILE = "recovery-point.checkpoint"
TMP_SUFFIX = ".tmp"

_MAGIC = b"RVCK"
_VERSION = 1
_BODY = struct.Struct(">4sHq")
_CRC = struct.Struct(">I")
_FILE_BYTES = _BODY.size + _CRC.size

assert _FILE_BYTES == 18


def encode_checkpoint(value: int) -> bytes:
    """The 18 bytes of a checkpoint holding ``value``. Pure."""
    assert value >= 0
    body = _BODY.pack(_MAGIC, _VERSION, value)
    return body + _CRC.pack(_crc32c.crc32c(body))


def read_checkpoint(store: FileStore, directory: str, name: str) -> int | None:
    """The offset in ``directory/name``, or ``None`` if the file does not exist.

    Blocks on file I/O.

    Raises:
        CorruptLogError: the file exists but is not a valid checkpoint.
        OSError: the store failed.
    """
    path = posixpath.join(directory, name)
    if not store.exists(path):
        return None
    handle = store.open(path, create=False)
    try:
        data = store.pread(handle, _FILE_BYTES + 1, 0)
    finally:
        store.close(handle)
    if len(data) != _FILE_BYTES:
        raise CorruptLogError(path, 0, f"checkpoint is {len(data)} bytes, not {_FILE_BYTES}")
    magic, version, value = _BODY.unpack_from(data)
    (crc,) = _CRC.unpack_from(data, _BODY.size)
    if magic != _MAGIC or version != _VERSION or crc != _crc32c.crc32c(data[: _BODY.size]):
        raise CorruptLogError(path, 0, "checkpoint magic, version or CRC is wrong")
    if value < 0:
        raise CorruptLogError(path, 6, f"checkpoint holds a negative offset {value}")
    return value


def write_checkpoint(store: FileStore, directory: str, name: str, value: int) -> None:
    """Replace ``directory/name`` with ``value``, durably (tmp, fsync, rename, fsync_dir).

    Blocks on two fsyncs.

    Raises:
        OSError: the store failed (the old value, or the new one, is in place).
    """
    path = posixpath.join(directory, name)
    tmp = path + TMP_SUFFIX
    handle = store.open(tmp)
    try:
        store.truncate(handle, 0)
        store.pwrite(handle, encode_checkpoint(value), 0)
        store.fsync(handle)
    finally:
        store.close(handle)
    store.rename(tmp, path)
    store.fsync_dir(directory)


def stage_checkpoint(store: FileStore, directory: str, name: str, value: int,
                     tag: str) -> tuple[int, str]:
    """Write ``value`` to ``directory/name.<tag>.tmp`` (not synced) for a later rename over
    ``name``; returns the open handle and that path. The caller fsyncs the handle before the
    rename, fsyncs the directory after it, and closes the handle. Blocks on file writes.

    Raises:
        OSError: the store failed (no handle is left open).
    """
    tmp = posixpath.join(directory, f"{name}.{tag}{TMP_SUFFIX}")
    handle = store.open(tmp)
    try:
        store.truncate(handle, 0)
        store.pwrite(handle, encode_checkpoint(value), 0)
    except BaseException:
        store.close(handle)
        raise
    return handle, tmp
