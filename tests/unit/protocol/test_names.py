"""Legal topic names and group ids.

Method: examples at each boundary (length 1, 249/256 and one more; "." and ".."; each legal
punctuation character; illegal characters including non-ASCII), plus a Hypothesis property
comparing the functions with a direct statement of the rule.
"""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.names import group_id_error, topic_name_error

LEGAL = set(string.ascii_letters + string.digits + "._-")


def test_topic_names():
    for name in ("a", "orders", "Orders.v2_eu-west", "x" * 249, "...", "-", "_"):
        assert topic_name_error(name) is None, name
    for name in ("", ".", "..", "x" * 250, "a b", "a/b", "ü", "a\n", "a\x00", None, 5, b"a"):
        assert topic_name_error(name) is ErrorCode.INVALID_TOPIC_NAME, name


def test_group_ids():
    assert group_id_error("g" * 256) is None
    assert group_id_error("billing.v1") is None
    for group_id in ("", ".", "..", "g" * 257, "a:b"):
        assert group_id_error(group_id) is ErrorCode.INVALID_GROUP_ID, group_id


@given(st.text(alphabet=st.sampled_from(sorted(LEGAL) + [" ", "/", "é", ":"]), max_size=260))
def test_the_rule(name):
    legal = 1 <= len(name) <= 249 and set(name) <= LEGAL and name not in (".", "..")
    assert (topic_name_error(name) is None) == legal
