"""The ``rivven`` command line without a broker: parsing, usage exit codes, output encoding.

Method: call ``build_parser``/``main`` in-process; usage errors must exit with code 1 (not
argparse's 2, which CONTRACT reserves for "cannot connect"); bytes are encoded for JSON as
documented in docs/client.md.
"""

from __future__ import annotations

import io

import pytest

from rivven_broker.cli.rivven_main import _table, build_parser, encode_bytes, main


def test_defaults_and_environment(monkeypatch):
    monkeypatch.setenv("RIVVEN_BOOTSTRAP", "h:1,h:2")
    args = build_parser().parse_args(["topic", "create", "t", "--config", "a=b", "--config", "c="])
    assert args.bootstrap == "h:1,h:2" and args.partitions == 3 and args.replication_factor == 1
    assert args.config == [("a", "b"), ("c", "")]
    argv = ["--json", "consume", "t", "--partition", "1", "--offset", "5"]
    args = build_parser().parse_args(argv)
    assert args.json and args.partition == 1 and args.offset == "5" and not args.follow


@pytest.mark.parametrize(
    "argv",
    [[], ["topic"], ["topic", "create"], ["topic", "alter", "t"], ["nope"],
     ["topic", "alter", "t", "--partitions", "many"],
     ["topic", "create", "t", "--config", "novalue"], ["produce", "t", "--acks", "2"]],
)
def test_usage_errors_exit_1(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    assert "usage" in capsys.readouterr().err


def test_offset_without_partition_is_a_usage_error(capsys):
    assert main(["--bootstrap", "127.0.0.1:1", "consume", "t", "--offset", "1"]) == 1
    assert "--offset needs --partition" in capsys.readouterr().err


def test_group_commands_parse(capsys):
    args = build_parser().parse_args(
        ["group", "reset-offsets", "g", "--topic", "t", "--to", "timestamp=5"]
    )
    assert (args.action, args.group, args.topic, args.to) == ("reset-offsets", "g", "t",
                                                              "timestamp=5")
    assert args.execute is False  # a dry run unless --execute
    with pytest.raises(SystemExit) as exit_info:
        main(["group", "reset-offsets", "g"])  # --topic and --to are required
    assert exit_info.value.code == 1
    with pytest.raises(SystemExit):  # one of --to, --shift-by, --to-datetime
        main(["group", "reset-offsets", "g", "--topic", "t", "--to", "1", "--shift-by", "2"])


def test_a_reset_plan_is_decided_in_the_core():
    from rivven_broker.client import TopicPartition
    from rivven_broker.client.group_admin import parse_reset_target, plan_reset

    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    earliest, latest = {a: 5, b: 0}, {a: 50, b: 8}
    committed = {a: 20, b: None}

    def plan(to, at=None):
        return plan_reset(parse_reset_target(to), [a, b], committed, earliest, latest, at or {})

    assert plan("shift=-100") == {a: 5, b: 0}  # kept within the log
    assert plan("shift=3") == {a: 23, b: 3}  # b has no commit: from the earliest
    assert plan("shift=1000") == {a: 50, b: 8}
    assert plan("timestamp=7", {a: 30, b: -1}) == {a: 30, b: 8}  # none later: the end
    assert plan("earliest") == earliest and plan("latest") == latest
    assert plan(4) == {a: 4, b: 4}
    with pytest.raises(ValueError, match="shift=N"):
        parse_reset_target("shift=x")


def test_encode_bytes():
    assert encode_bytes(None) is None
    assert encode_bytes(b"caf\xc3\xa9") == "café"
    assert encode_bytes(b"\x00\xff") == {"base64": "AP8="}


def test_table_aligns_columns():
    out = io.StringIO()
    _table(out, ["A", "LONGER"], [("xxxx", 1), (None, 22)])
    assert out.getvalue().splitlines() == ["A     LONGER", "xxxx  1", "-     22"]
