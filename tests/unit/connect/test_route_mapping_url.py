"""A ``Route`` transform's ``mapping_url``: fetched once at load through the injected fetcher;
a failed fetch or an empty mapping refuses to start (never an empty fallback)."""

from __future__ import annotations

import pytest

from rivven_connect.core.config import ConnectConfigError, load_config
from rivven_connect.core.records import Record
from rivven_connect.core.transforms import build_chain

URL = "http://127.0.0.1:9/mapping.json"


def _config(**route: object) -> dict:
    spec = {"type": "Route", "field": "kind", **route}
    return {"sources": {"s": {"connector": "datagen", "topic": "t", "transforms": [spec]}}}


def test_the_mapping_is_fetched_once_and_routes():
    asked: list[str] = []

    def fetch(url: str) -> dict:
        asked.append(url)
        return {"order": "shop.orders", "refund": "shop.refunds"}

    config = load_config(_config(mapping_url=URL), {}, fetch)
    assert asked == [URL]
    chain = build_chain(list(config.sources["s"].transforms), path="t")
    routed = chain.apply(Record({"kind": "refund"}))
    assert routed is not None and routed.destination.topic == "shop.refunds"


def _refused(fetch: object, expected: str, **route: object) -> str:
    with pytest.raises(ConnectConfigError) as caught:
        load_config(_config(**route), {}, fetch)  # type: ignore[arg-type]
    assert caught.value.path == "sources.s.transforms[0].mapping_url", caught.value
    assert expected in caught.value.problem, caught.value.problem
    return caught.value.problem


def _down(url: str) -> dict:
    raise OSError("connection refused")


@pytest.mark.parametrize("fetch,expected,route", [
    (_down, "could not load the mapping", {"mapping_url": URL}),
    (lambda url: {}, "empty mapping", {"mapping_url": URL}),
    (lambda url: ["a"], "list", {"mapping_url": URL}),
    (None, "fetches no mapping", {"mapping_url": URL}),
    (lambda url: {"a": "b"}, "not both", {"mapping_url": URL, "mapping": {"a": "b"}}),
    (lambda url: {"a": "b"}, "not an http", {"mapping_url": "file:///etc/passwd"}),
])
def test_a_mapping_that_cannot_be_had_refuses_to_start(fetch, expected, route):
    _refused(fetch, expected, **route)


def test_a_fetched_mapping_with_a_bad_topic_is_refused_like_a_written_one():
    with pytest.raises(ConnectConfigError) as caught:
        load_config(_config(mapping_url=URL), {}, lambda url: {"a": "no/slash"})
    assert caught.value.path.startswith("sources.s.transforms[0].mapping"), caught.value
