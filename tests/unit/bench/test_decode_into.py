"""``decode_records(record_type=..., prefix=...)``: decoding straight into the client's Record.

Goal: the consumer's hot loop can build the client's ``Record`` (topic, partition first)
directly, one object per record instead of two (docs/performance.md, "Into one Python
consumer"). Method: decode the same batches both ways (plain ``Record`` converted by hand, and
directly) for every path of the decoder (learned shape, field-by-field, records with headers,
a fetch starting mid-batch) and require equal results.
"""

from __future__ import annotations

from rivven_broker.client.types import Record as ClientRecord
from rivven_broker.records import BatchBuilder, decode_records, stamp


def _batch(base_offset: int, records: list[tuple[bytes | None, bytes | None, tuple]]) -> bytes:
    builder = BatchBuilder(batch_bytes_max=1 << 20)
    for number, (key, value, headers) in enumerate(records):
        assert builder.append(1_700_000_000_000 + number, key, value, headers)
    data = builder.build()
    return stamp(base_offset, len(data) - 12, 0) + data[16:]


def test_direct_decoding_equals_converting():
    same_shape = [(None, b"v" * 30, ())] * 50
    mixed = [(b"k1", b"one", ()), (None, None, ()), (b"key", b"x" * 7, (("h", b"1"), ("n", None)))]
    buf = _batch(0, same_shape) + _batch(50, mixed) + _batch(53, same_shape[:3])
    for min_offset in (0, 51, 54):
        plain = decode_records(buf, min_offset=min_offset)
        direct = decode_records(buf, min_offset=min_offset, record_type=ClientRecord,
                                prefix=("orders", 7))
        assert direct == [ClientRecord("orders", 7, *record) for record in plain]
        assert all(type(record) is ClientRecord for record in direct)
        assert direct[0].offset == min_offset
