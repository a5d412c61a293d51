"""House rules for the transforms package, checked with ``ast`` (nothing imported but it).

tests/test_tidy.py does not list ``rivven_connect`` yet, so this pins the same bans for the
transforms (no I/O, clock, threads or randomness; only ``records`` and siblings imported) and
the STYLE.md sizes: a docstring on every module and public name, modules under 600 lines,
functions under 70.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import rivven_connect.core.transforms as transforms
from tests.test_tidy import BANNED_MODULES, IO_MODULES

PACKAGE = pathlib.Path(transforms.__file__).parent
MODULES = sorted(PACKAGE.glob("*.py"))
FORBIDDEN = IO_MODULES | BANNED_MODULES | {"os", "random", "subprocess", "urllib", "http"}
OURS_ALLOWED = ("rivven_connect.core.records", "rivven_connect.core.transforms")


def test_there_are_modules():
    assert len(MODULES) >= 10


def _imported(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_pure_and_layered(path):
    for name in _imported(ast.parse(path.read_text())):
        root = name.split(".")[0]
        assert root not in FORBIDDEN, f"{path.name} imports {name}"
        if root in ("rivven_connect", "rivven_broker", "rivven_cluster", "sim"):
            assert name.startswith(OURS_ALLOWED), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_sizes_and_docstrings(path):
    source = path.read_text()
    tree = ast.parse(source)
    assert ast.get_docstring(tree), f"{path.name} has no module docstring"
    assert len(source.splitlines()) < 600, f"{path.name} is too long"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            length = node.end_lineno - node.lineno + 1
            if isinstance(node, ast.FunctionDef):
                assert length < 70, f"{path.name}:{node.name} has {length} lines"
            if not node.name.startswith("_") and node.col_offset == 0:
                assert ast.get_docstring(node), f"{path.name}:{node.name} has no docstring"
    assert max(map(len, source.splitlines())) <= 100, f"{path.name} has a line over 100"


def test_public_surface():
    assert sorted(transforms.__all__) == [
        "Chain", "Predicate", "TRANSFORM_TYPES", "TransformConfigError", "TransformError",
        "build_chain", "parse_predicate",
    ]
    assert sorted(transforms.TRANSFORM_TYPES) == sorted([
        "Filter", "MaskField", "ReplaceField", "InsertField", "Cast", "Flatten",
        "TimestampConverter", "ValueToKey", "ExtractNewRecordState", "RegexRouter",
        "ContentRouter", "Route", "EventRouter",
    ])
