"""``stop_on_io_error``: which failures of a skippable disk operation stop the node."""

from __future__ import annotations

import errno

import pytest

from rivven_broker.storage.errors import StorageError, SyncFailedError, stop_on_io_error


def _wrapped(code: int) -> StorageError:
    try:
        try:
            raise OSError(code, "injected", "f")
        except OSError as exc:
            raise StorageError("checkpoint of t-0") from exc
    except StorageError as outer:
        return outer


@pytest.mark.parametrize("code", [errno.EIO, errno.EROFS])
def test_an_io_error_stops_the_node_even_behind_a_storage_error(code: int) -> None:
    with pytest.raises(SyncFailedError, match="the checkpoint: .*injected"):
        stop_on_io_error(OSError(code, "injected"), "the checkpoint")
    with pytest.raises(SyncFailedError):
        stop_on_io_error(_wrapped(code), "the checkpoint")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.ENOENT, errno.EEXIST])
def test_a_full_disk_or_a_missing_file_may_be_retried(code: int) -> None:
    stop_on_io_error(OSError(code, "injected"), "the checkpoint")
    stop_on_io_error(_wrapped(code), "the checkpoint")
    stop_on_io_error(StorageError("not I/O at all"), "the checkpoint")
