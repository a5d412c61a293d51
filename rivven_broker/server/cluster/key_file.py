"""Reading ``--cluster-key-file``: the one place the cluster's key ring touches a file.

Theory of operation
-------------------
``load_key_ring(path)`` stats the file first and refuses it when group or others may read it
(as ssh refuses a private key), then parses it with ``rivven_cluster``'s pure ``KeyRing``.
The broker calls it at start and again on SIGHUP (key rotation: ``key_ring.py``).
"""

from __future__ import annotations

import os
import stat

from rivven_cluster.membership.key_ring import (
    DEVELOPMENT_KEY,
    KeyFileError,
    KeyRing,
    generate_key,
)

__all__ = ["load_key_ring", "generate_key", "KeyFileError", "KeyRing", "DEVELOPMENT_KEY"]


def load_key_ring(path: str) -> KeyRing:
    """Read ``path`` (refusing a file readable by group or others). Blocks on the file.

    Raises:
        KeyFileError: with a message for the operator.
    """
    try:
        status = os.stat(path)
    except OSError as exc:
        raise KeyFileError(f"--cluster-key-file: cannot read {path}: "
                           f"{exc.strerror or exc}") from exc
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        raise KeyFileError(
            f"--cluster-key-file: permissions {mode:04o} for {path} are too open: the key "
            f"must not be readable by group or others (chmod 600 {path})"
        )
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"--cluster-key-file: cannot read {path}: {exc}") from exc
    return KeyRing.parse(text, path)
