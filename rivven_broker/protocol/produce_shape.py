"""Plain produce requests known by their bytes: a connection's repeated one-partition produce
decoded once, then matched.

Theory of operation
-------------------
A producer that sends one small batch per request to one partition sends the same payload
every time but for the records: the api version, acks, time-out, topic and partition repeat.
A ``ProduceShape`` is such a payload cut around its records value: the bytes before the
records' msgpack bin header (``head``) and after the records (``tail``), with what they
decode to. ``match(payload)`` gives the records of a payload of that shape, or None; the
connection core (``connection.py``, ``ServerConnection.next_plain_produce``) then hands the
produce lane (``server/produce_lane.py``) the shape and the records, and no request is
decoded or built for it.

Why a match decodes exactly as the full decoder would: msgpack is self-delimiting and never
looks inside a bin value (its header gives the length; the parser skips that many bytes), and
maps and arrays count elements, not bytes. So ``head + bin header(n) + X + tail`` decodes, for
every length n and content X, to the same request with records X, provided the cut is at the
records' bin value. ``learn`` proves the cut rather than trusting where ``find`` saw the
records: it decodes the payload with the records replaced by a filler of another length and
content, and keeps the shape only if that decodes, through ``codec``, to the same request
carrying the filler. The decoder's limits cannot tell the two apart either: the one limit on a
bin (``max_bin_len``) is the frame limit, which no payload passes.

A shape is learned only from a request the lane could take (one topic, one partition, acks
1 or all, no transactional id) whose payload is at most ``SHAPE_PAYLOAD_BYTES_MAX`` bytes
(the small requests the lane is for). Learning costs about one decode more; ``Learner``
bounds how often a connection whose requests keep changing shape pays it (once per
``LEARN_EVERY_MISSES`` requests that did not match). Pure: no I/O, no clock.
"""

from __future__ import annotations

from rivven_broker.protocol import codec
from rivven_broker.protocol.errors import RemoteProtocolError
from rivven_broker.protocol.messages import ACKS_NONE, Produce, ProducePartition, ProduceTopic

__all__ = ["ProduceShape", "Learner", "SHAPE_PAYLOAD_BYTES_MAX", "LEARN_EVERY_MISSES"]

#: Payloads longer than this are not learned from (the lane's requests are small).
SHAPE_PAYLOAD_BYTES_MAX = 4096
#: A connection whose produces stop matching its shape learns again once per this many.
LEARN_EVERY_MISSES = 8

_BIN8, _BIN16, _BIN32 = 0xC4, 0xC5, 0xC6


def _bin_header(length: int) -> bytes:
    if length < 0x100:
        return bytes((_BIN8, length))
    if length < 0x10000:
        return bytes((_BIN16,)) + length.to_bytes(2, "big")
    return bytes((_BIN32,)) + length.to_bytes(4, "big")


class ProduceShape:
    """A produce payload cut around its records (module docstring): ``match`` finds the
    records of a payload of this shape; the other attributes are what the rest decodes to."""

    __slots__ = ("head", "tail", "version", "acks", "timeout_ms", "topic", "partition")

    def __init__(self, head: bytes, tail: bytes, version: int, request: Produce) -> None:
        [topic] = request.topics
        [partition] = topic.partitions
        self.head = head
        self.tail = tail
        self.version = version
        self.acks = request.acks
        self.timeout_ms = request.timeout_ms
        self.topic = topic.name
        self.partition = partition.partition

    @classmethod
    def learn(cls, payload: bytes, request: Produce, version: int) -> ProduceShape | None:
        """The shape of ``payload``, which decoded to ``request`` at ``version``; None when
        it has none the lane could use (module docstring) or the cut cannot be proven."""
        if type(payload) is not bytes or len(payload) > SHAPE_PAYLOAD_BYTES_MAX \
                or request.acks == ACKS_NONE or request.transactional_id is not None \
                or len(request.topics) != 1 or len(request.topics[0].partitions) != 1:
            return None
        records = request.topics[0].partitions[0].records
        header = _bin_header(len(records))
        at = payload.rfind(header + records)
        if at < 0:
            return None
        shape = cls(payload[:at], payload[at + len(header) + len(records):], version, request)
        filler = bytes((len(records) + 1) % 251 for _ in range(len(records) + 1))
        try:
            decoded, decoded_version = codec.decode_request_and_version(
                shape.head + _bin_header(len(filler)) + filler + shape.tail)
        except RemoteProtocolError:
            return None
        if decoded_version != version or decoded != shape.request(filler):
            return None
        assert shape.match(payload) == records
        return shape

    def match(self, payload: bytes) -> bytes | None:
        """The records of ``payload`` if it has this shape (then it decodes to this shape's
        request carrying them), else None. Never raises."""
        head = self.head
        if type(payload) is not bytes or not payload.startswith(head):
            return None
        at = len(head)
        if len(payload) < at + 5:  # (room for any bin header: the indexing below never raises)
            return None
        kind = payload[at]
        if kind == _BIN8:
            start = at + 2
            size = payload[at + 1]
        elif kind == _BIN16:
            start = at + 3
            size = int.from_bytes(payload[at + 1:start], "big")
        elif kind == _BIN32:
            start = at + 5
            size = int.from_bytes(payload[at + 1:start], "big")
        else:
            return None
        end = start + size
        tail = self.tail
        if end + len(tail) != len(payload) or not payload.endswith(tail):
            return None
        return payload[start:end]

    def request(self, records: bytes) -> Produce:
        """The request a payload of this shape carrying ``records`` decodes to."""
        return Produce(acks=self.acks, timeout_ms=self.timeout_ms, topics=(
            ProduceTopic(self.topic, (ProducePartition(self.partition, records),)),),
            transactional_id=None)


class Learner:
    """When a connection learns its shape: only on behalf of a caller that asked for a match
    and found none (``wanted``: the produce lane; a connection its own task reads never pays
    for learning), from the first such produce, and then once per ``LEARN_EVERY_MISSES``
    (module docstring)."""

    __slots__ = ("shape", "wanted", "_misses")

    def __init__(self) -> None:
        self.shape: ProduceShape | None = None
        #: A match was asked for and failed since the last produce decoded.
        self.wanted = False
        self._misses = LEARN_EVERY_MISSES - 1  # (the first produce learns)

    def missed(self, payload: bytes, request: Produce, version: int) -> None:
        """A produce decoded the long way after a failed match: learn from it now and
        then."""
        self.wanted = False
        self._misses += 1
        if self._misses >= LEARN_EVERY_MISSES:
            self._misses = 0
            shape = ProduceShape.learn(payload, request, version)
            if shape is not None:
                self.shape = shape
