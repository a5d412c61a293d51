"""Cluster membership with real ``rivven-broker`` processes on loopback (issue 17).

Method: three brokers started with ``--peers`` (free UDP ports picked first) and a key file
form one view; one is killed with SIGKILL and the other two mark it dead; it restarts (a new
boot id) and is alive again in every view; a fourth broker with a different key is never
admitted (and the others count its datagrams as ``unknown_key``); SIGHUP re-reads a key file
during a rotation; keys the broker must refuse are refused with exit 2. Views are read with
the public ``Admin.cluster_status()`` (``DescribeCluster``) and ``rivven cluster status
--json``; waits poll with a bound and never assert on elapsed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest

from rivven_broker.cli.rivven_main import main as rivven
from rivven_broker.client import Admin
from tests.integration.cluster_ports import free_cluster_ports

_BOUND_S = 30


def _key_file(path, *keys: str):
    path.write_text("".join(key + "\n" for key in keys))
    os.chmod(path, 0o600)
    return path


def _states(process) -> dict[int, str]:
    with Admin(process.address) as admin:
        return {member.node_id: member.state for member in admin.cluster_status().members}


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + _BOUND_S
    while not predicate():
        assert time.monotonic() < deadline, f"not within {_BOUND_S} s: {what}"
        time.sleep(0.1)


def _metric(process, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{process.http_port}/metrics") as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(f"{name}{{{labels}}}"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _start(broker_process, node: int, ports: list[int], key, *, data_dir=None, rack="a"):
    peers = ",".join(f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(ports)
                     if i + 1 != node and i < 3)
    return broker_process(
        "--node-id", str(node), "--peers", peers, "--rack", rack,
        "--cluster-listen", f"127.0.0.1:{ports[node - 1]}", "--cluster-key-file", str(key),
        "--sync-policy", "none", data_dir=data_dir,
    )


@pytest.mark.slow
def test_three_brokers_form_one_view_detect_a_kill_and_readmit_the_restart(
    broker_process, tmp_path, capsys
):
    ports = free_cluster_ports(4)
    key = _key_file(tmp_path / "cluster.key", "a-shared-cluster-secret-0123456789")
    brokers = [_start(broker_process, node, ports, key) for node in (1, 2, 3)]
    everyone_alive = {1: "alive", 2: "alive", 3: "alive"}
    _wait(lambda: all(_states(b) == everyone_alive for b in brokers), "one view of three")

    assert rivven(["--bootstrap", brokers[0].address, "--json", "cluster", "status"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [(m["node_id"], m["state"], m["rack"]) for m in document["members"]] == [
        (1, "alive", "a"), (2, "alive", "a"), (3, "alive", "a")]
    assert {m["cluster_port"] for m in document["members"]} == set(ports[:3])

    data_dir = brokers[2].data_dir
    brokers[2].kill()  # SIGKILL: no leave, the others must detect it
    _wait(lambda: all(_states(b).get(3) == "dead" for b in brokers[:2]), "3 declared dead")

    brokers[2] = _start(broker_process, 3, ports, key, data_dir=data_dir)  # a new boot id
    _wait(lambda: all(_states(b) == everyone_alive for b in brokers), "3 alive again")

    stranger_key = _key_file(tmp_path / "other.key", "somebody-elses-secret-0123456789")
    stranger = _start(broker_process, 4, ports, stranger_key)
    _wait(lambda: _metric(brokers[0], "rivven_cluster_datagrams_rejected_total",
                          'reason="unknown_key"') > 0, "the stranger's datagrams refused")
    time.sleep(2)  # long enough to join, were it admitted
    for broker in brokers:
        assert 4 not in _states(broker)
    assert set(_states(stranger)) == {4}

    assert brokers[0].terminate() == 0  # graceful: announces its leave
    _wait(lambda: all(_states(b).get(1) == "left" for b in brokers[1:]), "1 left")


@pytest.mark.slow
def test_a_key_rotation_with_sighup_keeps_the_cluster_together(broker_process, tmp_path):
    """Add the new key everywhere, make it first everywhere, remove the old one: each step a
    file edit and SIGHUP, and the two brokers keep seeing each other alive throughout."""
    ports = free_cluster_ports(3)
    old, new = "the-old-cluster-secret-0123456", "the-new-cluster-secret-0123456"
    keys = [_key_file(tmp_path / f"key-{node}", old) for node in (1, 2)]
    brokers = [_start(broker_process, node, ports[:2] + [ports[2]], keys[node - 1])
               for node in (1, 2)]
    both = {1: "alive", 2: "alive"}
    _wait(lambda: all(_states(b) == both for b in brokers), "two alive")
    for step in ((old, new), (new, old), (new,)):
        for key, broker in zip(keys, brokers):
            _key_file(key, *step)
            broker.popen.send_signal(signal.SIGHUP)
            time.sleep(0.5)  # one broker switched, the other not yet
            assert all(_states(b) == both for b in brokers), step
    time.sleep(1.5)
    assert all(_states(b) == both for b in brokers)
    assert _metric(brokers[0], "rivven_cluster_datagrams_rejected_total",
                   'reason="unknown_key"') == 0


def test_keys_that_must_not_be_used_are_refused_with_exit_2(tmp_path):
    from tests.integration.conftest import _broker_command

    open_key = tmp_path / "open.key"
    open_key.write_text("a-shared-cluster-secret-0123456789\n")
    os.chmod(open_key, 0o644)
    base = [*_broker_command(), "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0",
            "--http", "off"]
    cases = [
        (["--peers", "2@127.0.0.1:19093", "--cluster-key-file", str(open_key)], "too open"),
        (["--peers", "2@10.1.2.3:9093"], "needs --cluster-key-file"),
    ]
    for flags, complaint in cases:
        done = subprocess.run(base + flags, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert complaint in done.stderr and "chmod 600" in done.stderr, done.stderr
