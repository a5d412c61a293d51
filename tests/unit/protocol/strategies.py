"""Hypothesis strategies for every wire message, derived from the declared field kinds.

Method: each field was declared with a ``FieldKind`` (message_base.py); this module maps each
kind to a strategy of valid values, so a new message or field is covered without touching the
tests. Sizes are kept small (short strings, at most three items per list) so that hundreds of
examples run in well under a second; the size limits themselves have their own tests.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st

from rivven_broker.protocol.codec import PARTITIONED_REQUESTS
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import FieldKind, field_kind
from rivven_broker.protocol.messages import API_PAIRS, ErrorResponse

LIST_SIZE_MAX = 3
TEXT_SIZE_MAX = 12

REQUEST_CLASSES = [request for request, _ in API_PAIRS]
RESPONSE_CLASSES = [response for _, response in API_PAIRS] + [ErrorResponse]


def _text(bytes_max: int) -> st.SearchStrategy[str]:
    # At most 4 UTF-8 bytes per character, so this never exceeds the bound.
    return st.text(max_size=min(TEXT_SIZE_MAX, bytes_max // 4))


def _big_bin(size: int) -> bytes:
    # Above the codec's by-reference threshold, so the zero-copy packing path is exercised.
    return bytes([size % 251]) * size


def _nullable(strategy: st.SearchStrategy[Any], nullable: bool) -> st.SearchStrategy[Any]:
    return st.none() | strategy if nullable else strategy


def _for_kind(kind: FieldKind) -> st.SearchStrategy[Any]:
    tag = kind.tag
    if tag == "int":
        if kind.choices:
            return st.sampled_from(kind.choices)
        return st.integers(kind.lo, kind.hi)
    if tag == "bool":
        return st.booleans()
    if tag == "str":
        return _nullable(_text(kind.bytes_max), kind.nullable)
    if tag == "bin":
        return st.binary(max_size=64) | st.integers(2048, 6000).map(_big_bin)
    if tag == "error_code":
        return st.sampled_from(list(ErrorCode))
    if tag == "structs":
        assert kind.cls is not None
        return st.lists(struct_strategy(kind.cls), max_size=LIST_SIZE_MAX).map(tuple)
    if tag == "ints":
        return st.lists(st.integers(kind.lo, kind.hi), max_size=LIST_SIZE_MAX).map(tuple)
    if tag == "strs":
        items = st.lists(_text(kind.bytes_max), max_size=LIST_SIZE_MAX).map(tuple)
        return _nullable(items, kind.nullable)
    if tag == "str_map":
        values = _nullable(_text(kind.value_bytes_max), kind.nullable)
        return st.dictionaries(_text(kind.bytes_max), values, max_size=LIST_SIZE_MAX)
    assert tag == "version_map", tag
    pairs = st.tuples(st.integers(0, 20), st.integers(0, 20)).map(lambda p: (min(p), max(p)))
    return st.dictionaries(st.integers(0, 32767), pairs, max_size=LIST_SIZE_MAX)


_CACHE: dict[type, st.SearchStrategy[Any]] = {}


def struct_strategy(cls: type) -> st.SearchStrategy[Any]:
    """Valid instances of the message or nested part ``cls``."""
    if cls not in _CACHE:
        fields = {a.name: _for_kind(field_kind(a)) for a in attrs.fields(cls)}
        strategy = st.builds(cls, **fields)
        if cls in PARTITIONED_REQUESTS:  # a request names each partition once
            strategy = strategy.map(_partitions_once)
        _CACHE[cls] = strategy
    return _CACHE[cls]


def _partitions_once(request: Any) -> Any:
    """``request`` without its repeated (topic, partition) entries (the first one kept)."""
    seen: set[tuple[str, int]] = set()
    topics = []
    for topic in request.topics:
        kept = []
        for item in topic.partitions:
            key = (topic.name, item if type(item) is int else item.partition)
            if key not in seen:
                seen.add(key)
                kept.append(item)
        topics.append(attrs.evolve(topic, partitions=tuple(kept)))
    return attrs.evolve(request, topics=tuple(topics))


def any_request() -> st.SearchStrategy[Any]:
    return st.one_of([struct_strategy(cls) for cls in REQUEST_CLASSES])


def any_response() -> st.SearchStrategy[Any]:
    return st.one_of([struct_strategy(cls) for cls in RESPONSE_CLASSES])
