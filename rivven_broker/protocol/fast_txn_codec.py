"""Fast paths of the codec for ``AddPartitionsToTxn``, the transaction's per-partition message.

Theory of operation
-------------------
A transaction names every partition it writes to in ``AddPartitionsToTxn``: one topic
entry per topic, one partition answer per partition, and the request is retried as a whole
while the previous transaction's markers are still being written (CONCURRENT_TRANSACTIONS).
Through the generic codec (``codec.py``: the field walk and the validating attrs
constructors) a transaction over 50 topics costs ~3 us per struct, ~400 structs per round
across the producer and the broker (request decoded, two answers built - the success and the
failure one are made up front -, answer decoded).

The same rules as ``fast_codec`` hold here. ``decode_add_partitions`` and
``decode_add_partitions_response`` check that a decoded body is *plainly good* (exact types,
bounds, ASCII names) and then build the message directly; on anything else they return
``None`` and the caller takes the generic path, which raises exactly the error it always
raised. ``add_partitions_response_of`` builds the broker's answer without the validators,
only from what they already checked: the topic names and partition numbers of a validated
request, and an ``ErrorCode``. A test compares every path with the generic one on generated
messages.
"""

from __future__ import annotations

import attrs

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.fast_codec import (
    decode_topics, error_code_of, field_kinds, plain_name,
)
from rivven_broker.protocol.txn_messages import (
    AddPartitionsToTxn,
    AddPartitionsToTxnPartitionResponse,
    AddPartitionsToTxnResponse,
    AddPartitionsToTxnTopic,
    AddPartitionsToTxnTopicResponse,
)

__all__ = ["decode_add_partitions", "decode_add_partitions_response",
           "add_partitions_response_of"]

_new = object.__new__
_set = object.__setattr__


# The fast paths below know these exact field lists; a change to the classes must revisit them.
assert tuple(a.name for a in attrs.fields(AddPartitionsToTxn)) == (
    "transactional_id", "producer_id", "producer_epoch", "topics")
assert tuple(a.name for a in attrs.fields(AddPartitionsToTxnTopic)) == ("name", "partitions")
assert tuple(a.name for a in attrs.fields(AddPartitionsToTxnResponse)) == ("topics",)
assert tuple(a.name for a in attrs.fields(AddPartitionsToTxnTopicResponse)) == (
    "name", "partitions")
assert tuple(a.name for a in attrs.fields(AddPartitionsToTxnPartitionResponse)) == (
    "partition", "error_code")
assert all(attribute.metadata["since"] == 0 for cls in (
    AddPartitionsToTxn, AddPartitionsToTxnTopic, AddPartitionsToTxnResponse,
    AddPartitionsToTxnTopicResponse, AddPartitionsToTxnPartitionResponse)
    for attribute in attrs.fields(cls))

_REQUEST = field_kinds(AddPartitionsToTxn)
_ID_BYTES_MAX = _REQUEST["transactional_id"].bytes_max
_PRODUCER_ID_LO, _PRODUCER_ID_HI = _REQUEST["producer_id"].lo, _REQUEST["producer_id"].hi
_EPOCH_LO, _EPOCH_HI = _REQUEST["producer_epoch"].lo, _REQUEST["producer_epoch"].hi
_TOPICS_MAX = _REQUEST["topics"].length_max
_TOPIC = field_kinds(AddPartitionsToTxnTopic)
_NAME_BYTES_MAX = _TOPIC["name"].bytes_max
_PARTITIONS_MAX = _TOPIC["partitions"].length_max
_PARTITION_LO, _PARTITION_HI = _TOPIC["partitions"].lo, _TOPIC["partitions"].hi
_RESPONSE_TOPICS_MAX = field_kinds(AddPartitionsToTxnResponse)["topics"].length_max
_TOPIC_RESPONSE = field_kinds(AddPartitionsToTxnTopicResponse)
_RESPONSE_NAME_BYTES_MAX = _TOPIC_RESPONSE["name"].bytes_max
_RESPONSE_PARTITIONS_MAX = _TOPIC_RESPONSE["partitions"].length_max
_ANSWER = field_kinds(AddPartitionsToTxnPartitionResponse)
_ANSWER_LO, _ANSWER_HI = _ANSWER["partition"].lo, _ANSWER["partition"].hi
assert not _REQUEST["producer_id"].choices and not _REQUEST["producer_epoch"].choices
assert _TOPIC["partitions"].tag == "ints" and _ANSWER["error_code"].tag == "error_code"
assert not _REQUEST["transactional_id"].nullable and not _TOPIC["name"].nullable


def _plain_int(value: object, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi


def _partition(value: object) -> object | None:
    return value if _plain_int(value, _PARTITION_LO, _PARTITION_HI) else None


def decode_add_partitions(body: object, version: int) -> AddPartitionsToTxn | None:
    """The ``AddPartitionsToTxn`` of a decoded body, or None when the body is anything but
    plainly valid (the caller then decodes it the generic way). Pure; never raises."""
    del version  # one version, every field at it
    if type(body) is not dict:
        return None
    transactional_id = body.get("transactional_id")
    producer_id = body.get("producer_id")
    producer_epoch = body.get("producer_epoch")
    topics = body.get("topics")
    if not plain_name(transactional_id, _ID_BYTES_MAX):
        return None
    if not _plain_int(producer_id, _PRODUCER_ID_LO, _PRODUCER_ID_HI) or not _plain_int(
            producer_epoch, _EPOCH_LO, _EPOCH_HI):
        return None
    built = decode_topics(topics, _TOPICS_MAX, _NAME_BYTES_MAX, _PARTITIONS_MAX, _partition,
                          AddPartitionsToTxnTopic)
    if built is None:
        return None
    result = _new(AddPartitionsToTxn)
    _set(result, "transactional_id", transactional_id)
    _set(result, "producer_id", producer_id)
    _set(result, "producer_epoch", producer_epoch)
    _set(result, "topics", built)
    return result


def _answer(body: object) -> AddPartitionsToTxnPartitionResponse | None:
    if type(body) is not dict:
        return None
    partition = body.get("partition")
    code = error_code_of(body.get("error_code"))
    if not _plain_int(partition, _ANSWER_LO, _ANSWER_HI) or code is None:
        return None
    result = _new(AddPartitionsToTxnPartitionResponse)
    _set(result, "partition", partition)
    _set(result, "error_code", code)
    return result


def decode_add_partitions_response(body: object, version: int
                                   ) -> AddPartitionsToTxnResponse | None:
    """The ``AddPartitionsToTxnResponse`` of a decoded body, or None when the body is anything
    but plainly valid (the caller then decodes it the generic way). Pure; never raises."""
    del version
    if type(body) is not dict:
        return None
    topics = body.get("topics")
    built = decode_topics(topics, _RESPONSE_TOPICS_MAX, _RESPONSE_NAME_BYTES_MAX,
                          _RESPONSE_PARTITIONS_MAX, _answer, AddPartitionsToTxnTopicResponse)
    if built is None:
        return None
    result = _new(AddPartitionsToTxnResponse)
    _set(result, "topics", built)
    return result


def add_partitions_response_of(request: AddPartitionsToTxn, code: ErrorCode
                               ) -> AddPartitionsToTxnResponse:
    """``code`` for every partition ``request`` names, without the validators: the names and
    partition numbers come from a validated request (see the module docstring). Pure."""
    assert type(code) is ErrorCode
    answers: dict[int, AddPartitionsToTxnPartitionResponse] = {}  # one object per partition
    topics = []
    for topic in request.topics:
        parts = []
        for partition in topic.partitions:
            answer = answers.get(partition)
            if answer is None:
                answer = answers[partition] = _new(AddPartitionsToTxnPartitionResponse)
                _set(answer, "partition", partition)
                _set(answer, "error_code", code)
            parts.append(answer)
        built = _new(AddPartitionsToTxnTopicResponse)
        _set(built, "name", topic.name)
        _set(built, "partitions", tuple(parts))
        topics.append(built)
    result = _new(AddPartitionsToTxnResponse)
    _set(result, "topics", tuple(topics))
    return result
