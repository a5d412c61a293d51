"""docs/client.md's "One program, three forms" runs as written in each of its forms.

Method: the three code blocks of that section (blocking, trio, asyncio) are read from the doc,
the address is pointed at an in-process broker (``threaded_broker``, one per form: each form
creates its topic), each block is executed with its printout captured, and every form must
print the three records it wrote.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "client.md"


def _forms() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("## One program, three forms"):]
    section = section[:section.index("\n## ", 5)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_section_has_the_three_forms():
    blocking, with_trio, with_asyncio = _forms()
    assert "Producer(" in blocking and "trio.run(main)" in with_trio
    assert "asyncio.run(main())" in with_asyncio


@pytest.mark.parametrize("form", [0, 1, 2], ids=["blocking", "trio", "asyncio"])
def test_each_form_runs_as_written(form, threaded_broker):
    broker = threaded_broker()
    code = _forms()[form].replace("127.0.0.1:9092", broker.address)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"docs/client.md form {form}", "exec"), {"__name__": "__doc__"})
    assert printed.getvalue().strip() == "[b'hello', b'hej', b'hola']"
