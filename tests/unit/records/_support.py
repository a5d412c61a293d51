"""Helpers shared by the record batch tests: re-framing a batch after editing it."""

from __future__ import annotations

from rivven_broker.records.header import (
    CRC_START,
    HEADER,
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    BatchHeader,
    compute_crc,
)


def reframe(batch: bytes, section: bytes | None = None, **fields: int) -> bytes:
    """``batch`` with a new records section and/or header fields, length and CRC made right.

    Field names are ``BatchHeader``'s; the CRC is recomputed over the result, so the bytes pass
    the CRC check and only deeper checks can reject them.
    """
    header = BatchHeader._make(HEADER.unpack_from(batch))
    if section is None:
        section = batch[HEADER_BYTES:]
    header = header._replace(
        batch_length=HEADER_BYTES - LOG_OVERHEAD_BYTES + len(section), **fields
    )
    draft = bytearray(HEADER.pack(*header) + section)
    crc = compute_crc(draft)
    return bytes(HEADER.pack(*header._replace(crc=crc))) + section


def recrc(batch: bytes | bytearray) -> bytes:
    """``batch`` with its CRC recomputed (after an edit in the covered region)."""
    out = bytearray(batch)
    out[17:CRC_START] = compute_crc(out).to_bytes(4, "big")
    return bytes(out)
