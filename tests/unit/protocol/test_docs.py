"""docs/protocol.md stays true: error codes, api keys and every message field.

Method: parse the markdown. The error-code table must list exactly the members of
``ErrorCode`` (number, name, retriable, meaning). Every message class and nested part must
have a heading naming it, under which a table lists exactly its fields, in order, with the
type and default derived from the declared field kinds. Every api key must appear in the api
key table. A change to a message or a code without the matching doc change fails here.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import attrs

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import ApiKey, Message, field_kind, field_since
from rivven_broker.protocol.messages import API_PAIRS, ErrorResponse

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "protocol.md"

_ERROR_ROW = re.compile(r"^\|\s*(-?\d+)\s*\|\s*`?([A-Z_]+)`?\s*\|\s*(yes|no)\s*\|\s*(.*?)\s*\|\s*$")
_HEADING = re.compile(r"^#{3,4} `(\w+)`")
_API_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`(\w+)`\s*\|\s*[^|]+\|\s*(\d+)-(\d+)\s*\|\s*$")


def _describe_default(attribute: attrs.Attribute[Any]) -> str:
    default = attribute.default
    if default is attrs.NOTHING:
        text = "required"
    elif isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        text = "{}"
    elif default is None:
        text = "nil"
    elif isinstance(default, ErrorCode):
        text = f"{int(default)} ({default.name})"
    elif isinstance(default, bool):
        text = "true" if default else "false"
    elif default == ():
        text = "[]"
    elif isinstance(default, bytes):
        text = "empty"
    elif isinstance(default, str):
        text = f'"{default}"'
    else:
        text = str(default)
    since = field_since(attribute)
    return text if since == 0 else f"{text} (since v{since})"


def field_rows(cls: type) -> list[str]:
    """The table rows docs/protocol.md must hold for ``cls``."""
    return [
        f"| `{a.name}` | {field_kind(a).describe()} | {_describe_default(a)} |"
        for a in attrs.fields(cls)
    ]


def all_structs() -> list[type]:
    """Every message class and nested part, parents before children."""
    seen: list[type] = []

    def visit(cls: type) -> None:
        if cls in seen:
            return
        seen.append(cls)
        for attribute in attrs.fields(cls):
            nested = field_kind(attribute).cls
            if nested is not None:
                visit(nested)

    for request, response in API_PAIRS:
        visit(request)
        visit(response)
    visit(ErrorResponse)
    return seen


def _sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            match = _HEADING.match(line)
            current = sections.setdefault(match.group(1), []) if match else None
        elif current is not None and line.startswith("| `"):
            current.append(line.strip())
    return sections


def test_error_table_equals_the_enum():
    rows = [_ERROR_ROW.match(line) for line in DOC.read_text().splitlines()]
    documented = [(int(m[1]), m[2], m[3] == "yes", m[4]) for m in rows if m]
    expected = [(int(c), c.name, c.retriable, c.description) for c in ErrorCode]
    assert sorted(documented) == sorted(expected)
    assert len(documented) == len(set(documented))


def test_every_message_field_is_documented():
    sections = _sections(DOC.read_text())
    for cls in all_structs():
        assert cls.__name__ in sections, f"docs/protocol.md has no heading for {cls.__name__}"
        assert sections[cls.__name__] == field_rows(cls), cls.__name__


def test_every_api_key_is_documented():
    documented = {}
    for line in DOC.read_text().splitlines():
        match = _API_ROW.match(line)
        if match:
            documented[int(match[1])] = (match[2], (int(match[3]), int(match[4])))
    names = {int(r.API_KEY): (r.__name__, r.VERSIONS) for r, _ in API_PAIRS}
    names[int(ApiKey.ERROR)] = (ErrorResponse.__name__, ErrorResponse.VERSIONS)
    assert documented == names


def test_every_message_states_its_versions():
    text = DOC.read_text()
    for cls in all_structs():
        if issubclass(cls, Message):
            low, high = cls.VERSIONS
            heading = f"### `{cls.__name__}`"
            assert heading in text
            line = text[text.index(heading) :].splitlines()[0]
            assert f"v{low}-v{high}" in line, line
