"""``rivven-connect`` as a real process against a real broker process: SIGTERM mid-run
exits 0 and a restart completes the data exactly once; a bad file exits 1 naming the path;
no broker exits 2."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import trio

from rivven_broker.client.trio import open_admin
from tests.integration.connect.helpers import read_committed, values

ROOT = pathlib.Path(__file__).resolve().parents[3]
COUNT = 3000


def _command(config: pathlib.Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "rivven_connect", "--config", str(config), *flags]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DATAGEN_SEED": "7"}


def _write_config(path: pathlib.Path, bootstrap: str) -> None:
    path.write_text(f"""
version: "1.0"
broker: {{ bootstrap: "{bootstrap}" }}
http: off
sources:
  gen:
    connector: datagen
    topic: gen.out
    config: {{ count: {COUNT}, rate: 1500, record_size_bytes: 32,
               seed: "${{DATAGEN_SEED}}", batch_size: 100 }}
""")


def _committed_seqs(bootstrap: str) -> list[int]:
    return [row["seq"] for row in trio.run(_read, bootstrap)]


async def _read(bootstrap: str) -> list:
    return values(await read_committed(bootstrap, "gen.out"))


async def _create(bootstrap: str) -> None:
    async with open_admin(bootstrap) as admin:
        await admin.create_topic("gen.out", partitions=2)


def test_sigterm_mid_run_exits_0_and_a_restart_completes_exactly_once(broker_process,
                                                                        tmp_path):
    broker = broker_process()
    trio.run(_create, broker.address)
    config = tmp_path / "connect.yaml"
    _write_config(config, "127.0.0.1:1")  # --bootstrap overrides the file
    run = subprocess.Popen(_command(config, "--bootstrap", broker.address), env=_env(),
                           stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not _committed_seqs(broker.address):  # wait for the first committed batch
            assert run.poll() is None, run.stderr.read().decode()
            assert time.monotonic() < deadline
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, stderr.decode()
    assert b"source gen: stopped" in stderr
    first = _committed_seqs(broker.address)
    assert 0 < len(first) < COUNT, len(first)  # really stopped mid-run
    assert sorted(first) == list(range(len(first)))  # a prefix, once each

    again = subprocess.run(_command(config, "--bootstrap", broker.address), env=_env(),
                           capture_output=True, timeout=60)
    assert again.returncode == 0, again.stderr.decode()
    seqs = _committed_seqs(broker.address)
    assert sorted(seqs) == list(range(COUNT))  # every record once, nothing twice


def test_a_config_error_exits_1_naming_the_path(tmp_path):
    config = tmp_path / "connect.yaml"
    config.write_text("""
sources:
  lines:
    connector: file
    topic: out
    routing: { topic_column: kind }
""")
    done = subprocess.run(_command(config), env=_env(), capture_output=True, timeout=60)
    assert done.returncode == 1
    message = done.stderr.decode()
    assert str(config) in message and "sources.lines.routing" in message, message


def test_an_unknown_source_option_exits_1(tmp_path):
    config = tmp_path / "connect.yaml"
    config.write_text("sources: { g: { connector: datagen, topic: t, config: { cuont: 3 } } }")
    done = subprocess.run(_command(config), env=_env(), capture_output=True, timeout=60)
    assert done.returncode == 1
    assert "sources.g.config.cuont: unknown option" in done.stderr.decode()


def test_no_broker_exits_2(tmp_path):
    config = tmp_path / "connect.yaml"
    _write_config(config, "127.0.0.1:1")
    done = subprocess.run(_command(config), env=_env(), capture_output=True, timeout=120)
    assert done.returncode == 2, done.stderr.decode()
    assert "no broker reachable" in done.stderr.decode()


class _MappingServer:
    """A real HTTP server on loopback answering ``/mapping.json`` (and 404 otherwise)."""

    def __init__(self, mapping: dict) -> None:
        import http.server
        import json
        import threading

        body = json.dumps(mapping).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                if self.path != "/mapping.json":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _route_config(path: pathlib.Path, bootstrap: str, url: str, lines: pathlib.Path) -> None:
    path.write_text(f"""
version: "1.0"
broker: {{ bootstrap: "{bootstrap}" }}
http: off
sources:
  lines:
    connector: file
    topic: routed.other
    config: {{ path: "{lines}" }}
    transforms:
      - {{ type: Route, field: kind, mapping_url: "{url}" }}
""")


def test_a_route_mapping_fetched_from_a_url_routes_and_a_failed_fetch_refuses_to_start(
        broker_process, tmp_path):
    import json

    broker = broker_process()
    lines = tmp_path / "lines.jsonl"
    kinds = ["order", "refund", "order", "other"] * 5
    lines.write_text("".join(json.dumps({"kind": k, "n": i}) + "\n" for i, k in enumerate(kinds)))
    server = _MappingServer({"order": "routed.orders", "refund": "routed.refunds"})
    config = tmp_path / "connect.yaml"
    try:
        _route_config(config, broker.address, server.url + "/mapping.json", lines)
        done = subprocess.run(_command(config), env=_env(), capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr.decode()

        async def read(topic: str) -> list:
            return sorted(row["n"] for row in values(await read_committed(broker.address, topic)))

        assert trio.run(read, "routed.orders") == [i for i, k in enumerate(kinds) if k == "order"]
        assert trio.run(read, "routed.refunds") == [
            i for i, k in enumerate(kinds) if k == "refund"]
        assert trio.run(read, "routed.other") == [i for i, k in enumerate(kinds) if k == "other"]

        _route_config(config, broker.address, server.url + "/missing.json", lines)
        refused = subprocess.run(_command(config), env=_env(), capture_output=True, timeout=60)
        assert refused.returncode == 1
        message = refused.stderr.decode()
        assert "sources.lines.transforms[0].mapping_url: could not load the mapping" in message
        assert "404" in message, message
    finally:
        server.close()
