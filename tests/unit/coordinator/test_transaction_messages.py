"""The transaction messages (api keys 40-44) and Produce v1's ``duplicate`` on the wire.

Method: the generic protocol tests already round-trip every registered message with
Hypothesis and check docs/protocol.md; here we pin what is specific: the api keys, the
structural bounds (epochs are i16 values, -1 meaning none), and that ``duplicate`` travels only
at Produce v1 (a v0 response cannot carry it, a v0 payload decodes with it false).
"""

from __future__ import annotations

import msgpack
import pytest

from rivven_broker.protocol import codec
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from rivven_broker.protocol.messages import (
    REQUEST_TYPES,
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    AddPartitionsToTxnTopic,
    EndTxn,
    EndTxnResponse,
    InitProducerId,
    InitProducerIdResponse,
    Produce,
    ProducePartitionResponse,
    ProduceResponse,
    ProduceTopicResponse,
    TxnOffsetCommit,
    TxnOffsetCommitPartition,
    TxnOffsetCommitTopic,
)


def test_api_keys_are_40_to_44():
    assert {key: REQUEST_TYPES[key] for key in range(40, 45)} == {
        40: InitProducerId,
        41: AddPartitionsToTxn,
        42: AddOffsetsToTxn,
        43: TxnOffsetCommit,
        44: EndTxn,
    }


def test_defaults_mean_none():
    request = InitProducerId()
    assert (request.transactional_id, request.producer_id, request.producer_epoch) == (
        None,
        -1,
        -1,
    )
    assert request.transaction_timeout_ms == 60_000
    assert (InitProducerIdResponse().producer_id, InitProducerIdResponse().producer_epoch) == (
        -1,
        -1,
    )


@pytest.mark.parametrize(
    "build",
    [
        lambda: InitProducerId("t", producer_epoch=32768),
        lambda: InitProducerId("t", producer_epoch=-2),
        lambda: InitProducerId("t", producer_id=-2),
        lambda: EndTxn("t", 1, 0, 1),  # committed must be a bool
        lambda: AddPartitionsToTxn("t", 1, 0, [AddPartitionsToTxnTopic("a", ("0",))]),
        lambda: TxnOffsetCommit(
            "t", "g", 1, 0, topics=[TxnOffsetCommitTopic("a", [TxnOffsetCommitPartition(0, -1)])]
        ),
        lambda: TxnOffsetCommit(
            "t", "g", 1, 0,
            topics=[TxnOffsetCommitTopic("a", [TxnOffsetCommitPartition(0, 1, "m" * 4097)])],
        ),
    ],
)
def test_structural_bounds_are_enforced(build):
    with pytest.raises(LocalProtocolError):
        build()


def test_transaction_messages_round_trip():
    messages = [
        InitProducerId("t", 1000, 5, 3),
        AddPartitionsToTxn("t", 5, 3, [AddPartitionsToTxnTopic("a", (0, 2))]),
        AddOffsetsToTxn("t", 5, 3, "g"),
        TxnOffsetCommit(
            "t", "g", 5, 3, 7, "m-1", [TxnOffsetCommitTopic("a", [TxnOffsetCommitPartition(0, 9)])]
        ),
        EndTxn("t", 5, 3, True),
    ]
    for message in messages:
        assert codec.decode_request(codec.encode_request(message)) == message
    response = EndTxnResponse(ErrorCode.PRODUCER_FENCED, "fenced")
    assert codec.decode_response(codec.encode_response(response)) == response


def _produce_response(duplicate: bool) -> ProduceResponse:
    partition = ProducePartitionResponse(0, base_offset=42, duplicate=duplicate)
    return ProduceResponse(topics=(ProduceTopicResponse("t", (partition,)),))


def test_duplicate_travels_at_produce_v1_only():
    assert Produce.VERSIONS == ProduceResponse.VERSIONS == (0, 1)
    dup = _produce_response(True)
    assert codec.decode_response(codec.encode_response(dup, 1)) == dup
    with pytest.raises(LocalProtocolError) as refused:
        codec.encode_response(dup, 0)
    assert refused.value.code == ErrorCode.UNSUPPORTED_VERSION
    plain_v0 = codec.encode_response(_produce_response(False), 0)
    decoded, version = codec.decode_response_and_version(plain_v0)
    assert version == 0 and decoded.topics[0].partitions[0].duplicate is False
    request_v0 = codec.encode_request(Produce(), 0)
    assert codec.decode_request_and_version(request_v0)[1] == 0


def test_a_v1_response_without_duplicate_is_malformed():
    payload = msgpack.unpackb(codec.encode_response(_produce_response(False), 1))
    del payload[2]["topics"][0]["partitions"][0]["duplicate"]
    with pytest.raises(RemoteProtocolError):
        codec.decode_response(msgpack.packb(payload))
