"""The key ring and its file: parsing, key ids, rotation, and refusing open permissions."""

from __future__ import annotations

import os

import pytest

from rivven_broker.server.cluster.key_file import load_key_ring
from rivven_cluster.membership import KeyFileError, KeyRing, generate_key, key_id_of


def test_parsing_skips_blanks_and_comments_and_the_first_key_signs():
    ring = KeyRing.parse("# rotated 2026-11\n\n  first-secret-0123456789  \nsecond-secret-0123456789\n")
    assert ring.secrets == (b"first-secret-0123456789", b"second-secret-0123456789")
    assert ring.signing_key == b"first-secret-0123456789"
    assert ring.signing_key_id == key_id_of(b"first-secret-0123456789")
    assert ring.key_for(key_id_of(b"second-secret-0123456789")) == b"second-secret-0123456789"
    assert ring.key_for(b"\x00\x00\x00\x00") is None


def test_the_key_id_is_derived_and_never_the_key():
    secret = b"a-secret-that-must-not-leak"
    assert len(key_id_of(secret)) == 4 and key_id_of(secret) not in secret


@pytest.mark.parametrize("text,complaint", [
    ("", "holds no key"),
    ("# only a comment\n", "holds no key"),
    ("short\n", "at least 16"),
    ("same-secret-0123456789\nsame-secret-0123456789\n", "the same key twice"),
])
def test_bad_files_are_refused_clearly(text, complaint):
    with pytest.raises(KeyFileError, match=complaint):
        KeyRing.parse(text)


def test_generated_keys_are_long_and_parse():
    key = generate_key(bytes(range(32)))
    assert len(key) == 43 and KeyRing.parse(key).signing_key == key.encode()


def test_a_key_file_readable_by_others_is_refused_like_ssh_does(tmp_path):
    path = tmp_path / "cluster.key"
    path.write_text(generate_key(os.urandom(32)) + "\n")
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match=r"permissions 0644 .* too open.*chmod 600"):
        load_key_ring(str(path))
    os.chmod(path, 0o640)
    with pytest.raises(KeyFileError, match="too open"):
        load_key_ring(str(path))
    os.chmod(path, 0o600)
    assert len(load_key_ring(str(path))) == 1
    with pytest.raises(KeyFileError, match="cannot read"):
        load_key_ring(str(tmp_path / "missing.key"))
