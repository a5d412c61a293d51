"""``KeyRing``: the cluster's shared secrets; the first signs, every one verifies.

Theory of operation
-------------------
Every datagram (and, in later steps, every Raft and replication frame) between brokers is
authenticated with HMAC-SHA256 under a key of the ring. The ring comes from
``--cluster-key-file``: one secret a line (blank lines and ``#`` comments ignored), the first
line signs, all verify. So a key rotates in three steps with no restart — each step is an edit
of every broker's file followed by SIGHUP (the broker re-reads it):

1. *add* the new key as a second line everywhere (everyone now verifies it);
2. *use* it: make it the first line everywhere (everyone signs with it; the old one still
   verifies frames from brokers not yet switched);
3. *remove* the old line everywhere.

A frame names its key by a 4-byte *key id* derived from the key (HMAC-SHA256 of a fixed label
under the key, never the key itself), so the receiver picks the one key to try instead of
trying each (no CPU amplification from forged frames).

The file must not be readable by group or others (as ssh requires of private keys): the
broker's ``server/cluster/key_file.py`` reads it and refuses a looser mode. Secrets must be at least 16 characters;
``generate_key`` makes a fresh one (32 random bytes, base64url) for ``rivven cluster keygen``.
A cluster started with ``--peers`` but without a key file may use ``DEVELOPMENT_KEY`` only when
every cluster address is loopback (the broker decides that and warns).
"""

from __future__ import annotations

import base64
import hashlib
import hmac

__all__ = [
    "KeyRing", "KeyFileError", "DEVELOPMENT_KEY", "generate_key", "key_id_of",
]

KEY_ID_BYTES = 4
_KEY_ID_LABEL = b"rivven cluster key id"
_SECRET_CHARS_MIN = 16
_KEYS_MAX = 16

#: The built-in key of loopback-only development clusters. Public, so it protects nothing.
DEVELOPMENT_KEY = "rivven-development-key-loopback-only"


class KeyFileError(ValueError):
    """The key file is missing, unreadable, too open, empty or malformed (for the operator)."""


def key_id_of(secret: bytes) -> bytes:
    """The 4-byte id a frame names ``secret`` by."""
    return hmac.new(secret, _KEY_ID_LABEL, hashlib.sha256).digest()[:KEY_ID_BYTES]


class KeyRing:
    """An ordered set of secrets (the first signs). Immutable; pure."""

    def __init__(self, secrets: tuple[bytes, ...]) -> None:
        assert secrets, "a key ring has at least one key"
        assert len(secrets) <= _KEYS_MAX
        self.secrets = secrets
        self._by_id = {key_id_of(secret): secret for secret in secrets}
        assert len(self._by_id) == len(secrets), "two keys share a key id"
        self.signing_key_id = key_id_of(secrets[0])
        self.signing_key = secrets[0]

    @classmethod
    def parse(cls, text: str, where: str = "the key file") -> KeyRing:
        """The ring of ``text`` (one secret a line). Raises ``KeyFileError``."""
        secrets: list[bytes] = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if len(line) < _SECRET_CHARS_MIN:
                raise KeyFileError(f"{where}, line {number}: a key must be at least "
                                   f"{_SECRET_CHARS_MIN} characters (make one with "
                                   "`rivven cluster keygen`)")
            secret = line.encode("utf-8")
            if secret in secrets:
                raise KeyFileError(f"{where}, line {number}: the same key twice")
            secrets.append(secret)
        if not secrets:
            raise KeyFileError(f"{where} holds no key (make one with `rivven cluster keygen`)")
        if len(secrets) > _KEYS_MAX:
            raise KeyFileError(f"{where} holds {len(secrets)} keys; at most {_KEYS_MAX}")
        return cls(tuple(secrets))

    def key_for(self, key_id: bytes) -> bytes | None:
        """The secret named ``key_id``, or None when this ring has no such key."""
        return self._by_id.get(key_id)

    def __len__(self) -> int:
        return len(self.secrets)


def generate_key(random_bytes: bytes) -> str:
    """A new secret from 32 random bytes (the caller draws them from the OS): base64url."""
    assert len(random_bytes) == 32
    return base64.urlsafe_b64encode(random_bytes).decode("ascii").rstrip("=")
