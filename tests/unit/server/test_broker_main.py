"""``rivven-broker``'s entry point refuses what it must before starting anything.

Method: call ``main`` with bad settings and under a simulated ``python -O`` (a stand-in for
the module's ``sys``), and check the exit code and the one-line message; nothing is started.
The package's public surface is pinned here too.
"""

from __future__ import annotations

import sys
import types

import rivven_broker.server as server
from rivven_broker.cli import broker_main


def test_bad_settings_exit_1_with_one_clear_line(capsys):
    assert broker_main.main(["--node-id", "minus-one"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rivven-broker: --node-id: 'minus-one' is not valid")
    assert err.count("\n") == 1


def test_unknown_flags_exit_1(capsys):
    assert broker_main.main(["--shiny"]) == 1
    assert "unrecognized arguments: --shiny" in capsys.readouterr().err


def test_refuses_to_run_under_python_dash_o(monkeypatch, capsys):
    fake_sys = types.SimpleNamespace(flags=types.SimpleNamespace(optimize=1), argv=["x"],
                                     stderr=sys.stderr)
    monkeypatch.setattr(broker_main, "sys", fake_sys)
    assert broker_main.main([]) == 1
    assert "python -O" in capsys.readouterr().err


def test_server_exports_resolve():
    for name in server.__all__:
        assert getattr(server, name) is not None, name
    assert len(set(server.__all__)) == len(server.__all__)
