"""Tidy: the dependency direction of STYLE.md and the bans that keep cores simulatable.

Method: parse every module of the project with ``ast`` (nothing is imported) and check
1. imports point one way: each package may import only the packages listed for it below;
2. pure cores import no I/O or concurrency module at all (no trio, socket, threading, time);
3. nowhere outside the Env implementations and the commented exemptions does code read the
   wall clock, the module-level ``random`` functions, ``os.urandom`` or ``uuid.uuid4``, or use
   ``threading``/``socket`` directly — so the simulator can own time, randomness and I/O.
``random.Random`` (a seeded instance handed in) is always allowed.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("rivven_broker", "rivven_cluster", "rivven_connect", "rivven_spark", "sim")

# Which of our packages each package may import (besides itself). Most specific prefix wins.
# A leaf that imports nothing of ours: the FileRegion that storage makes, the codec packs and
# the server's writer sends (a bin whose bytes stay in a segment file).
_FILE_REGION = "rivven_broker.file_region"
ALLOWED_IMPORTS: dict[str, set[str]] = {
    "rivven_broker.protocol": {_FILE_REGION},
    "rivven_broker.records": {"rivven_broker.protocol"},
    "rivven_broker.storage": {"rivven_broker.protocol", "rivven_broker.records", _FILE_REGION},
    "rivven_broker.coordinator": {
        "rivven_broker.protocol",
        "rivven_broker.records",
        "rivven_broker.storage",
    },
    "rivven_broker.client": {"rivven_broker.protocol", "rivven_broker.records"},
    "rivven_broker.server": {
        _FILE_REGION,
        "rivven_broker.protocol",
        "rivven_broker.records",
        "rivven_broker.storage",
        "rivven_broker.coordinator",
        "rivven_cluster",
    },
    "rivven_broker.cli": {"rivven_broker"},
    "rivven_broker.bench": {"rivven_broker", "rivven_cluster"},  # it measures the controller
    "rivven_broker": {"rivven_broker"},  # the package root (__init__) only
    "rivven_cluster": set(),
    "rivven_spark": {
        "rivven_broker.client",
        "rivven_broker.protocol",
        "rivven_broker.records",
        "rivven_broker.process_memory",  # a leaf: the C allocator setting, imports nothing
    },
    "sim": {"rivven_broker", "rivven_cluster", "sim"},
    # The connector runtime talks to the broker only through the client; its core only needs
    # the broker's name rules.
    "rivven_connect": {
        "rivven_broker.client",
        "rivven_broker.protocol",
        "rivven_broker.records",
    },
    "rivven_connect.core": {"rivven_broker.protocol"},
}

# Pure cores: no I/O or concurrency imports at all. (Drivers inside these packages are listed
# in PURE_EXEMPT with the reason.)
PURE_PACKAGES = (
    "rivven_broker.protocol",
    "rivven_broker.records",
    "rivven_broker.storage",
    "rivven_broker.coordinator",
    "rivven_cluster",
    "rivven_connect.core",
    "rivven_connect.pg",  # the CDC decoding cores; the replication driver is exempt
    "rivven_broker.client",  # the client core; its drivers are exempt below
)
# The client's drivers: sockets, threads, trio tasks and clocks, and the front modules that
# gather their public classes. Everything else in rivven_broker.client is its pure core.
CLIENT_DRIVERS = {
    "rivven_broker.client": "the package's front: re-exports the blocking classes",
    "rivven_broker.client.blocking": "the blocking front module",
    "rivven_broker.client.trio": "the async driver's front module under its trio names",
    "rivven_broker.client._admin": "blocking Admin: the async one through a portal",
    "rivven_broker.client._collector": "pauses the process's garbage collector around decodes",
    "rivven_broker.client._consumer": "blocking Consumer over the async one: waits, a queue",
    "rivven_broker.client._producer": "blocking Producer over the async one: futures, a lock",
    "rivven_broker.client._sync": "blocking request/response on a loop the caller runs",
    "rivven_broker.client.aio": "the async driver's front module (trio and asyncio)",
    "rivven_broker.client._aio_admin": "async Admin (AnyIO)",
    "rivven_broker.client._aio_consumer": "async Consumer: fetch tasks (AnyIO)",
    "rivven_broker.client._aio_group": "async group member: a heartbeat task (AnyIO)",
    "rivven_broker.client._aio_net": "sockets and the event loop's clock (AnyIO)",
    "rivven_broker.client._aio_producer": "async Producer: a sender task (AnyIO)",
    "rivven_broker.client._loop_thread": "the blocking front's event loop thread and portal",
}
PURE_EXEMPT = {
    "rivven_broker.storage.file_store": "the real FileStore: the one storage module doing os I/O",
    "rivven_broker.storage.sync_worker": "the trio driver of group commit (fsync off-thread)",
    "rivven_broker.storage.partition": "its waits (wait_committed, wait_durable) are trio "
                                       "events; appends and reads never await",
    "rivven_connect.pg.slot": "the replication driver: psycopg2 connections, trio waits on "
                              "the replication socket",
    "rivven_connect.pg.snapshot_reader": "the snapshot's psycopg2 connections (the exporting "
                                         "slot creation, the keyset reads)",
    **CLIENT_DRIVERS,
    "rivven_connect.pg.outbox_table": "the polling outbox's psycopg2 connection (poll, "
                                      "delete or mark)",
}
IO_MODULES = {"trio", "socket", "threading", "time", "asyncio", "selectors", "select",
              "anyio"}
# Cores that are stricter still: the environment and randomness come in as arguments (the
# connector core takes an env mapping and a jitter callable from its driver).
PURE_EXTRA_BANNED = {"rivven_connect.core": {"os", "random"},
                     "rivven_connect.pg": {"os", "random"},
                     "rivven_broker.client": {"os", "gc", "logging", "concurrent", "multiprocessing"}}

# Modules allowed to touch real time, real randomness, threads and sockets: the Env
# implementations and the drivers that by nature live outside the simulator.
NONDETERMINISM_EXEMPT = {
    "rivven_broker.server.env": "RealEnv: the production clock, rng seeds, sockets and files",
    "rivven_broker.server.sync_thread": "RealEnv's dedicated fsync thread",
    # (and the client's drivers, CLIENT_DRIVERS: by exact name, its core is not exempt)
    "rivven_broker.cli": "command-line entry points print wall-clock times and use sockets",
    "rivven_broker.bench": "the benchmark measures real time on real processes",
    "rivven_spark": "runs inside Spark executors with the blocking client",
    "sim.program_thread": "the blocking client's caller on a thread that strictly alternates "
                          "with the simulator's loop (real time only as a hang detector)",
}
BANNED_MODULES = {"time", "threading", "socket", "uuid", "secrets"}
BANNED_ATTRIBUTES = {("os", "urandom"), ("uuid", "uuid4"), ("uuid", "uuid1")}
RANDOM_ALLOWED = {"Random"}


def _modules() -> list[tuple[str, pathlib.Path]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).with_suffix("")
            parts = list(relative.parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append((".".join(parts), path))
    return found


def _imports(module: str, path: pathlib.Path, tree: ast.AST) -> list[str]:
    is_package = path.name == "__init__.py"
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.append(target)
            names.extend(f"{target}.{alias.name}" for alias in node.names)
    return names


def _match(module: str, table: dict[str, object]) -> str | None:
    best = None
    for prefix in table:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best):
                best = prefix
    return best


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _is_type_checking_import(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in ast.walk(node):
                if hasattr(child, "lineno"):
                    lines.add(child.lineno)
    return lines


MODULES = _modules()


def test_the_project_has_modules():
    assert len(MODULES) > 5


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_dependency_direction(module: str, path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    owner = _match(module, ALLOWED_IMPORTS)
    assert owner is not None, f"{module} is in no layer of ALLOWED_IMPORTS"
    allowed = ALLOWED_IMPORTS[owner] | {owner}
    for name in _imports(module, path, tree):
        if not _ours(name):
            continue
        ok = any(name == a or name.startswith(a + ".") for a in allowed)
        # Importing a sibling package name (e.g. "rivven_broker" for "from rivven_broker
        # import protocol") is resolved by the more specific dotted name also listed.
        ok = ok or any(a.startswith(name + ".") or a == name for a in allowed)
        assert ok, f"{module} imports {name}; {owner} may import only {sorted(allowed)}"


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_pure_cores_do_no_io(module: str, path: pathlib.Path):
    if _match(module, {p: None for p in PURE_PACKAGES}) is None or module in PURE_EXEMPT:
        return
    tree = ast.parse(path.read_text(), str(path))
    type_only = _is_type_checking_import(tree)
    stricter = _match(module, PURE_EXTRA_BANNED)
    banned = IO_MODULES | (PURE_EXTRA_BANNED[stricter] if stricter else set())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in type_only:
            names = (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            )
            for name in names:
                root = (name or "").split(".")[0]
                assert root not in banned, f"pure core {module} imports {name}"


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_no_hidden_nondeterminism(module: str, path: pathlib.Path):
    if _match(module, NONDETERMINISM_EXEMPT) is not None or module in CLIENT_DRIVERS:
        return
    tree = ast.parse(path.read_text(), str(path))
    type_only = _is_type_checking_import(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and node.lineno not in type_only:
            for alias in node.names:
                assert alias.name.split(".")[0] not in BANNED_MODULES, (
                    f"{module}:{node.lineno} imports {alias.name}"
                )
        elif isinstance(node, ast.ImportFrom) and node.lineno not in type_only:
            root = (node.module or "").split(".")[0]
            assert root not in BANNED_MODULES, f"{module}:{node.lineno} imports {node.module}"
            if root == "random":
                for alias in node.names:
                    assert alias.name in RANDOM_ALLOWED, (
                        f"{module}:{node.lineno} imports random.{alias.name}"
                    )
            if root == "os":
                for alias in node.names:
                    assert alias.name != "urandom", f"{module}:{node.lineno} imports os.urandom"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            pair = (node.value.id, node.attr)
            assert pair not in BANNED_ATTRIBUTES, f"{module}:{node.lineno} uses {pair[0]}.{pair[1]}"
            if node.value.id == "random":
                assert node.attr in RANDOM_ALLOWED, (
                    f"{module}:{node.lineno} uses random.{node.attr}; inject a random.Random"
                )


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_the_client_core_imports_no_driver(module: str, path: pathlib.Path):
    """A client core module that imported a driver module would carry its threads, sockets
    or clock in with it: the core stays below the drivers."""
    if not module.startswith("rivven_broker.client") or module in CLIENT_DRIVERS:
        return
    tree = ast.parse(path.read_text(), str(path))
    for name in _imports(module, path, tree):
        assert name not in CLIENT_DRIVERS or name == "rivven_broker.client", (
            f"client core {module} imports the driver {name}")
        assert not any(name.startswith(d + ".") for d in CLIENT_DRIVERS
                       if d != "rivven_broker.client"), (
            f"client core {module} imports from the driver {name}")


def test_every_client_driver_exists_and_the_core_is_checked():
    modules = {m for m, _ in MODULES}
    assert set(CLIENT_DRIVERS) <= modules, set(CLIENT_DRIVERS) - modules
    core = {m for m in modules if m.startswith("rivven_broker.client.")} - set(CLIENT_DRIVERS)
    assert {"rivven_broker.client.producer_core", "rivven_broker.client.consumer_core",
            "rivven_broker.client.membership", "rivven_broker.client.call_retry",
            "rivven_broker.client.reconnect", "rivven_broker.client.metadata"} <= core
    assert all(_match(m, {p: None for p in PURE_PACKAGES}) == "rivven_broker.client"
               for m in core)
    assert all(_match(m, NONDETERMINISM_EXEMPT) is None for m in core)


# PySyncObj reads its clock, randomness, journal, snapshot files and poller through module
# globals of ``pysyncobj.syncobj`` and keeps leader, term and match indexes in name-mangled
# attributes. One adapter replaces the globals and reads those attributes, so an upgrade of
# PySyncObj (pinned to 0.3.17) has exactly one module to check. Everyone else uses its public
# API (SyncObjConf, Transport, Node, replicated).
PYSYNCOBJ_INTERNALS_OWNER = "rivven_broker.server.cluster.pysyncobj_host"


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_only_the_adapter_touches_pysyncobj_internals(module: str, path: pathlib.Path):
    if module == PYSYNCOBJ_INTERNALS_OWNER:
        return
    tree = ast.parse(path.read_text(), str(path))
    for name in _imports(module, path, tree):
        assert not name.startswith("pysyncobj.syncobj"), (
            f"{module} imports {name}; only {PYSYNCOBJ_INTERNALS_OWNER} may")
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        for name in names:
            assert not name.startswith("_SyncObj__"), (
                f"{module}:{node.lineno} uses PySyncObj's private {name}; only "
                f"{PYSYNCOBJ_INTERNALS_OWNER} may")


def test_the_pysyncobj_adapter_is_the_one_that_does():
    path = ROOT / "rivven_broker/server/cluster/pysyncobj_host.py"
    assert "_SyncObj__" in path.read_text() and "pysyncobj.syncobj" in path.read_text()


def test_the_connect_core_is_checked_as_a_strict_pure_core():
    core = [m for m, _ in MODULES if m.startswith("rivven_connect.core")]
    assert "rivven_connect.core.records" in core
    assert all(_match(m, PURE_EXTRA_BANNED) == "rivven_connect.core" for m in core)
    assert {"os", "random", "trio"} <= IO_MODULES | PURE_EXTRA_BANNED["rivven_connect.core"]
