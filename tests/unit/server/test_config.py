"""BrokerConfig parsing: defaults, the TOML file, flags over the file, and clear errors.

Method: call ``load_config`` with argument lists and an injected file reader (no real files),
and check the resulting frozen config or the ``ConfigError`` message for each bad input.
"""

from __future__ import annotations

import pytest

from rivven_broker.protocol import limits
from rivven_broker.server.config import (
    BrokerConfig,
    ConfigError,
    HostPort,
    Peer,
    config_as_dict,
    environment_variable,
    load_config,
    parser,
)


def _reader(text: str):
    def read(path: str) -> bytes:
        assert path == "broker.toml"
        return text.encode()

    return read


def test_no_arguments_is_the_single_node_default():
    config = load_config([])
    assert config == BrokerConfig()
    assert config.node_id == 1
    assert config.data_dir == "./data"
    assert config.listen == HostPort("127.0.0.1", 9092)
    assert config.http == HostPort("127.0.0.1", 9094)
    assert config.sync_policy == "always"
    assert config.auto_create_topics is True
    assert config.default_partitions == 3
    assert config.peers == ()


def test_every_contract_flag_is_parsed():
    config = load_config([
        "--node-id", "7", "--data-dir", "/tmp/x", "--listen", "0.0.0.0:1234",
        "--http", "[::1]:0", "--peers", "2@10.0.0.2:9093,3@b.example:9093", "--rack", "r1",
        "--sync-policy", "interval_ms=50", "--log-level", "debug",
    ])
    assert config.node_id == 7
    assert config.data_dir == "/tmp/x"
    assert config.listen == HostPort("0.0.0.0", 1234)
    assert config.http == HostPort("::1", 0)
    assert config.peers == (
        Peer(2, HostPort("10.0.0.2", 9093)), Peer(3, HostPort("b.example", 9093)),
    )
    assert config.rack == "r1"
    assert config.sync_policy == "interval_ms=50"
    assert config.log_level == "DEBUG"


def test_the_file_sets_values_and_flags_win_over_it():
    text = """
    [broker]
    node-id = 4
    data_dir = "/srv/rivven"
    listen = "127.0.0.1:9500"
    sync-policy = "none"
    auto_create_topics = false
    default-partitions = 6
    idle_timeout_ms = 5000
    peers = ["2@h2:9093", "3@h3:9093"]
    """
    config = load_config(["--config", "broker.toml", "--node-id", "9", "--listen", "h:1"],
                         read_file=_reader(text))
    assert config.node_id == 9  # the flag wins
    assert config.listen == HostPort("h", 1)  # the flag wins
    assert config.data_dir == "/srv/rivven"  # from the file
    assert config.sync_policy == "none"
    assert config.auto_create_topics is False
    assert config.default_partitions == 6
    assert config.idle_timeout_ms == 5000
    assert [peer.node_id for peer in config.peers] == [2, 3]


def test_environment_variables_sit_between_the_file_and_the_flags():
    text = """
    [broker]
    node-id = 4
    data_dir = "/srv/rivven"
    sync-policy = "none"
    """
    environ = {"RIVVEN_NODE_ID": "7", "RIVVEN_SYNC_POLICY": "interval_ms=5",
               "RIVVEN_LOG_FORMAT": "JSON", "RIVVEN_BOOTSTRAP": "not a broker option"}
    config = load_config(["--config", "broker.toml", "--sync-policy", "always"],
                         read_file=_reader(text), environ=environ)
    assert config.node_id == 7  # the environment wins over the file
    assert config.sync_policy == "always"  # the flag wins over the environment
    assert config.data_dir == "/srv/rivven"  # from the file
    assert config.log_format == "json"
    from_env_file = load_config([], read_file=_reader(text),
                                environ={"RIVVEN_CONFIG": "broker.toml"})
    assert from_env_file.node_id == 4
    with pytest.raises(ConfigError, match=r"\$RIVVEN_NODE_ID: 'x' is not valid"):
        load_config([], environ={"RIVVEN_NODE_ID": "x"})
    assert environment_variable("replica_lag_time_max_ms") == "RIVVEN_REPLICA_LAG_TIME_MAX_MS"


def test_every_option_has_its_variable_in_the_operations_table():
    import pathlib
    table = (pathlib.Path(__file__).resolve().parents[3] / "docs" / "operations.md").read_text()
    for option in parser()._actions:
        if option.dest in ("help", "version", "config"):
            continue
        assert f"`{environment_variable(option.dest)}`" in table, option.dest


def test_http_off_disables_the_http_server():
    assert load_config(["--http", "off"]).http is None


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--node-id", "x"], "--node-id"),
        (["--node-id", "-1"], "--node-id"),
        (["--listen", "nohost"], "HOST:PORT"),
        (["--listen", "h:70000"], "0..65535"),
        (["--peers", "2@h:1,2@h:2"], "distinct"),
        (["--peers", "h:1"], "ID@HOST:PORT"),
        (["--rack", "bad rack"], "--rack"),
        (["--sync-policy", "sometimes"], "always, interval_ms=N or none"),
        (["--sync-policy", "interval_ms=0"], "N > 0"),
        (["--log-level", "LOUD"], "--log-level"),
        (["--default-partitions", "0"], "--default-partitions"),
        (["--default-partitions", str(limits.partitions_per_topic_max + 1)], "--default-partitions"),
        (["--idle-timeout-ms", str(limits.idle_timeout_ms + 1)], "--idle-timeout-ms"),
        (["--connections-max", str(limits.connections_max + 1)], "--connections-max"),
        (["--auto-create-topics", "maybe"], "true or false"),
        (["--no-such-flag"], "unrecognized"),
        (["--node"], "unrecognized"),  # no abbreviations
    ],
)
def test_bad_flags_raise_a_clear_error(argv, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(argv)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("[broker]\nnode_id = 'seven'\n", "--node-id"),
        ("[broker]\nnode_id = true\n", "--node-id"),
        ("[broker]\nlisten = 9092\n", "HOST:PORT"),
        ("[broker]\nsurprise = 1\n", "unknown key 'surprise'"),
        ("[broker]\nnode-id = 1\nnode_id = 2\n", "given twice"),
        ("[other]\nx = 1\n", "unknown table"),
        ("broker = 3\n", "must be a table"),
        ("[broker\n", "not valid TOML"),
        ("[controller]\nsurprise_ms = 1\n", "unknown key 'surprise_ms' in [controller]"),
        ("[controller]\ntick_ms = 0\n", "must be an integer in 1.."),
        ("[controller]\ntick_ms = true\n", "must be an integer"),
        ("[controller]\nelection_timeout_min_ms = 300\n", "> 3 x append_entries_period_ms"),
        ("[controller]\nelection_timeout_max_ms = 400\n", "max_ms > election_timeout_min_ms"),
        ("[controller]\nleader_fallback_timeout_ms = 1000\n", "> election_timeout_max_ms"),
        ("[controller]\ntick_ms = 200\n", "tick_ms <= append_entries_period_ms"),
        ("controller = 1\n", "[controller] must be a table"),
        ("[cluster]\nprobe_timeout_ms = 500\n", "probe_timeout_ms < probe_interval_ms"),
        ("[cluster]\nnope = 1\n", "unknown key 'nope' in [cluster]"),
    ],
)
def test_bad_files_raise_a_clear_error(text, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(["--config", "broker.toml"], read_file=_reader(text))
    assert fragment in str(info.value)


def test_an_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(["--config", str(tmp_path / "missing.toml")])


def test_config_as_dict_is_plain():
    shown = config_as_dict(load_config(["--peers", "2@h:1"]))
    assert shown["listen"] == "127.0.0.1:9092"
    assert shown["peers"] == "2@h:1"


def test_the_cluster_and_controller_tables_override_timings():
    text = """
    [cluster]
    probe-interval-ms = 400
    lifeguard = false
    [controller]
    election_timeout_min_ms = 800
    election-timeout-max-ms = 2000
    leader_fallback_timeout_ms = 3000
    """
    config = load_config(["--config", "broker.toml"], read_file=_reader(text))
    membership = config.membership_config()
    assert membership.probe_interval_ms == 400 and membership.lifeguard is False
    timings = config.controller_timings_ms()
    assert (timings["election_timeout_min_ms"], timings["election_timeout_max_ms"],
            timings["leader_fallback_timeout_ms"], timings["tick_ms"]) == (800, 2000, 3000, 50)



def test_the_broker_gives_its_controller_the_controller_table(tmp_path):
    from rivven_broker.server.broker import Broker
    from rivven_broker.server.env import RealEnv
    text = ("[controller]\nelection_timeout_min_ms = 800\nelection_timeout_max_ms = 2000\n"
            "leader_fallback_timeout_ms = 3000\n")
    config = load_config(["--config", "broker.toml", "--peers", "2@127.0.0.1:19093"],
                         read_file=_reader(text))
    control = Broker(RealEnv(str(tmp_path)), config)._cluster_control(None, None, None)
    raft = control._raft
    assert (raft.election_timeout_min_s, raft.election_timeout_max_s,
            raft.leader_fallback_timeout_s) == (0.8, 2.0, 3.0)
