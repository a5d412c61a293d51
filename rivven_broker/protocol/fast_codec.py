"""Fast paths of the codec for the messages of the produce hot path.

Theory of operation
-------------------
The generic codec (``codec.py``) walks each class's declared fields and builds every part
through its validating attrs constructor. That is right for every message, and costs a large
share of the broker's CPU for the one it sees most: ``Produce`` (and its ``ProduceResponse``),
and of the producer's for the answer it decodes (``decode_produce_response``: ~10 us per
partition answered the generic way, a transaction over 50 topics has 51).

The fast paths here never decide anything the generic path would decide differently. Each
checks that its input is *plainly good* (exact types, bounds, ASCII names, the fields each
version carries) and then builds the result directly; on anything else it returns ``None``
and the caller takes the generic path, which raises exactly the error it always raised. So a
bad payload meets the same ``RemoteProtocolError`` (code and message) as before, and a good
one gives an equal message.

Building skips the attrs validators (``object.__new__`` and ``object.__setattr__`` on the
frozen, slotted classes) only because every field was checked here first against the same
``FieldKind`` the validator reads; a test compares both paths on generated messages. The
messages built once per produce (the request's three, the answer's three) set their slots
through the slots' own descriptors (``_slot_setters``): half the cost of
``object.__setattr__`` by name (0.3 against 0.6 us for an answer's partition).

The commonest answer of all — one partition appended, no error — is encoded from a cached
*template* per (topic, partition, version) (``produce_answer_payload``): the msgpack bytes
between its three variable integers (base offset, log append time, log start offset) are
packed once, so an answer costs three small ``packb`` calls and a join, byte for byte what
the generic path packs (a test compares them). ``produce_appended_payload`` fills it from the
numbers alone, for a broker that answers an append without building the ``ProduceResponse``
(``server/produce_answers.py``).

The broker's own answer to a successful append is built the same way
(``produce_partition_appended``, ``produce_response_of``): its fields are a partition number
and a topic name from a request that was already validated, offsets and times the log
assigned, and partition answers made here or by the validating constructors (errors, which
are rare, keep those). Cheap ``assert``s state what the validators would have checked.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import attrs
import msgpack

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import field_kind
from rivven_broker.protocol.messages import (
    Produce,
    ProducePartition,
    ProducePartitionResponse,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResponse,
)

__all__ = [
    "decode_produce",
    "decode_topics",
    "decode_produce_response",
    "error_code_of",
    "field_kinds",
    "plain_name",
    "produce_answer_payload",
    "produce_appended_payload",
    "produce_response_to_wire",
    "produce_partition_appended",
    "produce_response_of",
    "produce_response_of_one",
]

_new = object.__new__
_NO_ERROR = ErrorCode.NONE
_set = object.__setattr__


def field_kinds(cls: type) -> dict[str, Any]:
    """Each field's ``FieldKind`` by name (what the validators check)."""
    return {attribute.name: field_kind(attribute) for attribute in attrs.fields(cls)}


def _names(cls: type) -> tuple[str, ...]:
    return tuple(attribute.name for attribute in attrs.fields(cls))


def _slot_setters(cls: type) -> tuple[Callable[[object, object], None], ...]:
    """The ``__set__`` of each field's slot descriptor, in field order: a slotted class's
    fields set without looking their names up (frozen classes refuse ``setattr``; these, like
    ``object.__setattr__``, do not ask)."""
    descriptors = [cls.__dict__[name] for name in _names(cls)]
    assert all(type(descriptor) is types.MemberDescriptorType for descriptor in descriptors)
    return tuple(descriptor.__set__ for descriptor in descriptors)


# The fast paths below know these exact field lists; a change to the classes must revisit them.
assert _names(Produce) == ("acks", "timeout_ms", "topics", "transactional_id")
assert _names(ProduceTopic) == ("name", "partitions")
assert _names(ProducePartition) == ("partition", "records")
assert _names(ProduceResponse) == ("topics", "throttle_time_ms")
assert _names(ProduceTopicResponse) == ("name", "partitions")
assert _names(ProducePartitionResponse) == (
    "partition", "error_code", "base_offset", "log_append_time_ms", "log_start_offset",
    "error_message", "duplicate",
)
assert all(attribute.metadata["since"] == 0 for cls in (Produce, ProduceTopic, ProducePartition)
           for attribute in attrs.fields(cls))

_PRODUCE = field_kinds(Produce)
_ACKS = _PRODUCE["acks"].choices
_TIMEOUT_LO, _TIMEOUT_HI = _PRODUCE["timeout_ms"].lo, _PRODUCE["timeout_ms"].hi
_TOPICS_MAX = _PRODUCE["topics"].length_max
_TXN_ID_BYTES_MAX = _PRODUCE["transactional_id"].bytes_max
_TOPIC = field_kinds(ProduceTopic)
_NAME_BYTES_MAX = _TOPIC["name"].bytes_max
_PARTITIONS_MAX = _TOPIC["partitions"].length_max
_PARTITION = field_kinds(ProducePartition)
_PARTITION_LO, _PARTITION_HI = _PARTITION["partition"].lo, _PARTITION["partition"].hi
assert _PRODUCE["transactional_id"].nullable and not _TOPIC["name"].nullable
assert _PARTITION["records"].tag == "bin"
_RESPONSE = field_kinds(ProduceResponse)
_THROTTLE_LO, _THROTTLE_HI = _RESPONSE["throttle_time_ms"].lo, _RESPONSE["throttle_time_ms"].hi
_RESPONSE_TOPICS_MAX = _RESPONSE["topics"].length_max
_TOPIC_RESPONSE = field_kinds(ProduceTopicResponse)
_RESPONSE_NAME_BYTES_MAX = _TOPIC_RESPONSE["name"].bytes_max
_RESPONSE_PARTITIONS_MAX = _TOPIC_RESPONSE["partitions"].length_max
_ANSWER = field_kinds(ProducePartitionResponse)
_ANSWER_INTS = tuple((name, _ANSWER[name].lo, _ANSWER[name].hi) for name in (
    "partition", "base_offset", "log_append_time_ms", "log_start_offset"))
_MESSAGE_BYTES_MAX = _ANSWER["error_message"].bytes_max
assert _ANSWER["error_message"].nullable and _ANSWER["duplicate"].tag == "bool"
assert _ANSWER["error_code"].tag == "error_code" and not _ANSWER_INTS[0][1] < -(2**31)
assert attrs.fields(ProducePartitionResponse).duplicate.metadata["since"] == 1
assert all(attribute.metadata["since"] == 0 for cls in (ProduceResponse, ProduceTopicResponse)
           for attribute in attrs.fields(cls))
_set_produce = _slot_setters(Produce)
_set_topic = _slot_setters(ProduceTopic)
_set_partition = _slot_setters(ProducePartition)
_set_response = _slot_setters(ProduceResponse)
_set_topic_response = _slot_setters(ProduceTopicResponse)
_set_answer = _slot_setters(ProducePartitionResponse)


def plain_name(value: object, bytes_max: int) -> bool:
    """An ASCII str within ``bytes_max`` (anything else goes the generic way)."""
    return type(value) is str and len(value) <= bytes_max and value.isascii()


def _partition(body: object) -> ProducePartition | None:
    if type(body) is not dict:
        return None
    partition = body.get("partition")
    records = body.get("records")
    if type(partition) is not int or not _PARTITION_LO <= partition <= _PARTITION_HI:
        return None
    if type(records) is not bytes:
        return None
    result = _new(ProducePartition)
    _set(result, "partition", partition)
    _set(result, "records", records)
    return result


def decode_topics(topics: object, topics_max: int, name_bytes_max: int, partitions_max: int,
                  partition: Callable[[object], Any], topic_cls: type) -> tuple | None:
    """The ``topic_cls`` (fields ``name`` and ``partitions``) of each item of a decoded topic
    list, every partition decoded by ``partition`` (None: not plainly valid); None when any
    of it is not plainly valid (the caller then decodes it the generic way). The one topic
    walk of the fast codecs (Produce, its answer, AddPartitionsToTxn, its answer). Pure;
    never raises."""
    if type(topics) is not tuple or len(topics) > topics_max:
        return None
    built = []
    for item in topics:
        if type(item) is not dict:
            return None
        name = item.get("name")
        partitions = item.get("partitions")
        if not plain_name(name, name_bytes_max):
            return None
        if type(partitions) is not tuple or len(partitions) > partitions_max:
            return None
        decoded = []
        for part in partitions:
            value = partition(part)
            if value is None:
                return None
            decoded.append(value)
        topic = _new(topic_cls)
        _set(topic, "name", name)
        _set(topic, "partitions", tuple(decoded))
        built.append(topic)
    return tuple(built)


def _one_partition(topics: object) -> tuple[ProduceTopic] | None:
    """``decode_topics`` of Produce for the commonest request, one topic of one partition,
    in one frame: the same checks, inline; None for anything else (``decode_topics`` then
    decides, and a test compares both). Pure; never raises."""
    if type(topics) is not tuple or len(topics) != 1:
        return None
    item = topics[0]
    if type(item) is not dict:
        return None
    name = item.get("name")
    partitions = item.get("partitions")
    if type(name) is not str or len(name) > _NAME_BYTES_MAX or not name.isascii() \
            or type(partitions) is not tuple or len(partitions) != 1:
        return None
    body = partitions[0]
    if type(body) is not dict:
        return None
    partition = body.get("partition")
    records = body.get("records")
    if type(partition) is not int or not _PARTITION_LO <= partition <= _PARTITION_HI \
            or type(records) is not bytes:
        return None
    part = _new(ProducePartition)
    set_partition, set_records = _set_partition
    set_partition(part, partition)
    set_records(part, records)
    topic = _new(ProduceTopic)
    set_name, set_partitions = _set_topic
    set_name(topic, name)
    set_partitions(topic, (part,))
    return (topic,)


assert _TOPICS_MAX >= 1 and _PARTITIONS_MAX >= 1


def decode_produce(body: object, version: int) -> Produce | None:
    """The ``Produce`` of a decoded body at a supported ``version``, or None when the body is
    anything but plainly valid (the caller then decodes it the generic way). Pure; never
    raises for any input.
    """
    del version  # every field of Produce is carried at every version it speaks
    if type(body) is not dict:
        return None
    acks = body.get("acks")
    timeout_ms = body.get("timeout_ms")
    topics = body.get("topics")
    transactional_id = body.get("transactional_id", 0)  # 0: missing (None is a value)
    if type(acks) is not int or acks not in _ACKS:
        return None
    if type(timeout_ms) is not int or not _TIMEOUT_LO <= timeout_ms <= _TIMEOUT_HI:
        return None
    if transactional_id is not None and not plain_name(transactional_id, _TXN_ID_BYTES_MAX):
        return None
    built = _one_partition(topics)
    if built is None:
        built = decode_topics(topics, _TOPICS_MAX, _NAME_BYTES_MAX, _PARTITIONS_MAX, _partition,
                              ProduceTopic)
        if built is None:
            return None
    result = _new(Produce)
    set_acks, set_timeout_ms, set_topics, set_transactional_id = _set_produce
    set_acks(result, acks)
    set_timeout_ms(result, timeout_ms)
    set_topics(result, built)
    set_transactional_id(result, transactional_id)
    return result


def error_code_of(value: object) -> ErrorCode | None:
    """The ``ErrorCode`` the generic converter makes of a wire int (unknown numbers are
    UNKNOWN_SERVER_ERROR), or None for anything that is not a plain 32-bit int."""
    if type(value) is not int or not -(2**31) <= value < 2**31:
        return None
    return _NO_ERROR if value == 0 else ErrorCode.from_wire(value)


def _answer(body: object, version: int) -> ProducePartitionResponse | None:
    if type(body) is not dict:
        return None
    result = _new(ProducePartitionResponse)
    for name, lo, hi in _ANSWER_INTS:
        value = body.get(name)
        if type(value) is not int or not lo <= value <= hi:
            return None
        _set(result, name, value)
    code = error_code_of(body.get("error_code"))
    message = body.get("error_message", 0)  # 0: missing (None is a value)
    if code is None or (message is not None and not plain_name(message, _MESSAGE_BYTES_MAX)):
        return None
    duplicate = body.get("duplicate") if version >= 1 else False
    if type(duplicate) is not bool:
        return None
    _set(result, "error_code", code)
    _set(result, "error_message", message)
    _set(result, "duplicate", duplicate)
    return result


def decode_produce_response(body: object, version: int) -> ProduceResponse | None:
    """The ``ProduceResponse`` of a decoded body at a supported ``version``, or None when the
    body is anything but plainly valid (the caller then decodes it the generic way). Pure;
    never raises for any input.
    """
    if type(body) is not dict:
        return None
    topics = body.get("topics")
    throttle_time_ms = body.get("throttle_time_ms")
    if type(throttle_time_ms) is not int or not _THROTTLE_LO <= throttle_time_ms <= _THROTTLE_HI:
        return None
    built = decode_topics(topics, _RESPONSE_TOPICS_MAX, _RESPONSE_NAME_BYTES_MAX,
                          _RESPONSE_PARTITIONS_MAX, lambda part: _answer(part, version),
                          ProduceTopicResponse)
    if built is None:
        return None
    result = _new(ProduceResponse)
    _set(result, "topics", built)
    _set(result, "throttle_time_ms", throttle_time_ms)
    return result


def produce_response_to_wire(response: ProduceResponse, version: int) -> dict[str, Any] | None:
    """The msgpack-ready map of ``response`` at ``version`` (the same map, in the same key
    order, as the generic ``struct_to_wire``), or None when the generic path must decide (a
    v1-only field set at v0: it raises). Pure; never raises.
    """
    topics = []
    carries_duplicate = version >= 1
    for topic in response.topics:
        partitions = []
        for partition in topic.partitions:
            wire = {
                "partition": partition.partition,
                "error_code": partition.error_code,
                "base_offset": partition.base_offset,
                "log_append_time_ms": partition.log_append_time_ms,
                "log_start_offset": partition.log_start_offset,
                "error_message": partition.error_message,
            }
            if carries_duplicate:
                wire["duplicate"] = partition.duplicate
            elif partition.duplicate:
                return None
            partitions.append(wire)
        topics.append({"name": topic.name, "partitions": partitions})
    return {"topics": topics, "throttle_time_ms": response.throttle_time_ms}


_TEMPLATES_MAX = 4096  # (topic, partition, version) templates kept; then the cache starts over
_templates: dict[tuple[str, int, int], tuple[bytes, bytes, bytes, bytes]] = {}
_packb = msgpack.packb
#: One packer for the answers' integers: ``packb`` builds a ``Packer`` per call (three per
#: answer). The broker packs on one thread; ``pack`` resets the packer after every call.
_pack = msgpack.Packer().pack


def _template(name: str, partition: int, version: int) -> tuple[bytes, bytes, bytes, bytes]:
    """The fixed bytes around the three integers of a one-partition success answer."""
    packer = msgpack.Packer()
    fields = 7 if version >= 1 else 6
    head = b"".join([
        packer.pack_array_header(3), _packb(int(ProduceResponse.API_KEY)), _packb(version),
        packer.pack_map_header(2), _packb("topics"), packer.pack_array_header(1),
        packer.pack_map_header(2), _packb("name"), _packb(name), _packb("partitions"),
        packer.pack_array_header(1), packer.pack_map_header(fields),
        _packb("partition"), _packb(partition), _packb("error_code"), _packb(0),
        _packb("base_offset"),
    ])
    tail = _packb("error_message") + _packb(None)
    if version >= 1:
        tail += _packb("duplicate") + _packb(False)
    tail += _packb("throttle_time_ms") + _packb(0)
    return head, _packb("log_append_time_ms"), _packb("log_start_offset"), tail


def produce_answer_payload(response: ProduceResponse, version: int) -> bytes | None:
    """The payload (envelope included) of a one-topic, one-partition answer without error,
    from its template; None for any other answer (the caller packs it). Pure."""
    topics = response.topics
    if len(topics) != 1 or response.throttle_time_ms:
        return None
    topic = topics[0]
    if len(topic.partitions) != 1:
        return None
    answer = topic.partitions[0]
    if answer.error_code or answer.error_message is not None or answer.duplicate:
        return None
    return produce_appended_payload(topic.name, answer.partition, version, answer.base_offset,
                                    answer.log_append_time_ms, answer.log_start_offset)


def produce_appended_payload(name: str, partition: int, version: int, base_offset: int,
                             log_append_time_ms: int, log_start_offset: int) -> bytes:
    """The payload (envelope included) of the answer ``produce_partition_appended(partition,
    base_offset, log_append_time_ms, log_start_offset)`` gives for topic ``name`` at
    ``version``, from its template, without building the answer. Pure."""
    key = (name, partition, version)
    template = _templates.get(key)
    if template is None:
        if len(_templates) >= _TEMPLATES_MAX:
            _templates.clear()
        template = _templates[key] = _template(*key)
    head, append_time, start_offset, tail = template
    return b"".join((head, _pack(base_offset), append_time, _pack(log_append_time_ms),
                     start_offset, _pack(log_start_offset), tail))


def produce_partition_appended(
    partition: int, base_offset: int, log_append_time_ms: int, log_start_offset: int
) -> ProducePartitionResponse:
    """``ProducePartitionResponse(partition, ErrorCode.NONE, base_offset, log_append_time_ms,
    log_start_offset)`` without the validators (see the module docstring). Pure."""
    assert type(base_offset) is int and 0 <= log_start_offset <= base_offset, (
        log_start_offset, base_offset
    )
    result = _new(ProducePartitionResponse)
    set_partition, set_error_code, set_base_offset, set_append_time, set_start_offset, \
        set_error_message, set_duplicate = _set_answer
    set_partition(result, partition)
    set_error_code(result, _NO_ERROR)
    set_base_offset(result, base_offset)
    set_append_time(result, log_append_time_ms)
    set_start_offset(result, log_start_offset)
    set_error_message(result, None)
    set_duplicate(result, False)
    return result


def produce_response_of_one(name: str, answer: ProducePartitionResponse) -> ProduceResponse:
    """``produce_response_of([(name, [answer])])``: the answer of a request of one topic and
    one partition (the commonest), with no lists to build. Pure."""
    set_name, set_partitions = _set_topic_response
    topic = _new(ProduceTopicResponse)
    set_name(topic, name)
    set_partitions(topic, (answer,))
    result = _new(ProduceResponse)
    set_topics, set_throttle_time_ms = _set_response
    set_topics(result, (topic,))
    set_throttle_time_ms(result, 0)
    return result


def produce_response_of(
    topics: list[tuple[str, list[ProducePartitionResponse]]],
) -> ProduceResponse:
    """``ProduceResponse`` of ``(topic name, partition answers)`` without the validators: the
    names come from a validated request, the answers from ``produce_partition_appended`` or
    the validating constructor. Pure."""
    set_name, set_partitions = _set_topic_response
    built = []
    for name, partitions in topics:
        topic = _new(ProduceTopicResponse)
        set_name(topic, name)
        set_partitions(topic, tuple(partitions))
        built.append(topic)
    result = _new(ProduceResponse)
    set_topics, set_throttle_time_ms = _set_response
    set_topics(result, tuple(built))
    set_throttle_time_ms(result, 0)
    return result
