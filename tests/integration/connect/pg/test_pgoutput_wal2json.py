"""Differential test: our pgoutput decoder, assembler and envelope against wal2json, over
Hypothesis-generated DML on a real Postgres 15.

Each example makes a fresh schema with two tables (an ``int`` key and a composite
``(text, int)`` key; replica identity DEFAULT or FULL, drawn), a publication and two slots
over the same WAL: ``pgoutput`` (read with ``pg_logical_slot_get_binary_changes``: the same
message bytes the replication stream carries, decoded by ``pg.pgoutput`` →
``pg.transactions`` → ``pg.envelope`` / ``pg.values``) and ``wal2json`` (format-version 2,
xids, LSNs, timestamps, types: the oracle). The program is drawn statement by statement
while it runs (the keys that exist decide what an update or delete can name): inserts (one
or several rows), upserts, updates of some columns (so large TOASTed text stays unchanged),
primary-key changes, whole-table updates, deletes, truncates, transactional logical
messages, savepoints rolled back or released, transactions committed or rolled back.

The oracle's changes are mapped to the envelope *independently* of our code (wal2json types
its values by type name; timestamps are rewritten to ISO-8601 by a regular expression) and
compared record by record with ours: op, schema, table, key, ``before``, ``after``, the
unavailable-columns and primary-key-change headers, ``source.lsn``/``txId``/``ts_ms``, and
per transaction the xid, commit LSN and end LSN. pgoutput is read in another session time
zone (``America/St_Johns``, half-hour and LMT offsets) than wal2json (UTC), so our UTC
conversion is checked too.

Not generated: numeric NaN and ±Infinity (wal2json 2.5 writes them as JSON ``null``, so it
cannot tell them from NULL; the unit tests of ``pg.values`` cover them).

wal2json is a test oracle only (``make postgres`` installs ``postgresql-15-wal2json``); a
missing plugin FAILS the test, never skips it.
"""

from __future__ import annotations

import base64
import collections
import datetime
import json
import os
import re

import psycopg2
import psycopg2.extensions
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from rivven_broker.bench.postgres import PG_BIN
from rivven_connect.pg.envelope import (
    HEADER_PK_CHANGE_NEW_KEY, HEADER_PK_CHANGE_OLD_KEY, HEADER_UNAVAILABLE_COLUMNS,
    UNAVAILABLE_VALUE, EnvelopeBuilder,
)
from rivven_connect.pg.pgoutput import decode_message, format_lsn, parse_lsn
from rivven_connect.pg.transactions import Transaction, TransactionAssembler

#: Bounded so the test takes ~20-30 s on the 2-core CI machine, derandomized (the same
#: examples every run), no example database. ``RIVVEN_DIFF_EXAMPLES=N`` runs more,
#: ``RIVVEN_DIFF_RANDOM=1`` draws new ones (exploration, not CI).
EXAMPLES = int(os.environ.get("RIVVEN_DIFF_EXAMPLES", "100"))
DERANDOMIZE = os.environ.get("RIVVEN_DIFF_RANDOM") != "1"
SCHEMA = "dx"
PUBLICATION = "dx_pub"
SLOT_OURS, SLOT_ORACLE = "dx_pgoutput", "dx_wal2json"
#: table -> primary key columns (in order)
KEYS = {"a": ("id",), "b": ("region", "n")}
#: the non-key columns of both tables: name -> SQL type
COLUMNS = {"num": "numeric", "amount": "numeric(12,3)", "body": "text",
           "ts": "timestamp", "tstz": "timestamptz", "flag": "bool"}
KEY_TYPES = {"id": "int", "region": "text", "n": "int"}
REGIONS = ("eu", "us", "ap ü")
#: Shrinking a failure takes minutes against a real server: only on request
#: (``RIVVEN_DIFF_SHRINK=1``); the failing program is printed either way.
PHASES = tuple(phase for phase in Phase if phase is not Phase.shrink
               or os.environ.get("RIVVEN_DIFF_SHRINK") == "1")
PGOUTPUT_TIME_ZONE = "America/St_Johns"
W2J_OPTIONS = ("'format-version', '2', 'include-xids', '1', 'include-lsn', '1', "
               "'include-timestamp', '1', 'include-types', '1'")


def _ddl(identities: dict[str, str]) -> list[str]:
    statements = [f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE", f"CREATE SCHEMA {SCHEMA}",
                  f"DROP PUBLICATION IF EXISTS {PUBLICATION}"]
    for table, key in KEYS.items():
        columns = [f"{name} {KEY_TYPES[name]} NOT NULL" for name in key]
        columns += [f"{name} {kind}" for name, kind in COLUMNS.items()]
        statements += [
            f"CREATE TABLE {SCHEMA}.{table} ({', '.join(columns)}, "
            f"PRIMARY KEY ({', '.join(key)}))",
            f"ALTER TABLE {SCHEMA}.{table} ALTER COLUMN body SET STORAGE EXTERNAL",
            f"ALTER TABLE {SCHEMA}.{table} REPLICA IDENTITY {identities[table]}"]
    statements.append(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE "
                      + ", ".join(f"{SCHEMA}.{table}" for table in KEYS))
    return statements


# --- values ---------------------------------------------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
#: Large values are stored out of line (STORAGE EXTERNAL, no compression): TOASTed.
_BIG_TEXT = st.builds(lambda piece, size: (piece * size)[:size],
                      st.text(st.characters(codec="utf-8", exclude_characters="\x00"),
                              min_size=1, max_size=6),
                      st.integers(2_500, 6_000))
_MOMENT = st.datetimes(min_value=datetime.datetime(1890, 1, 1),
                       max_value=datetime.datetime(2100, 12, 31))
_ODD_TIMESTAMPS = st.sampled_from(["infinity", "-infinity", "0044-03-15 12:00:00 BC",
                                   "10000-01-01 00:00:00"])
#: Instants that leave (or enter) years 1..9999 when moved to UTC.
_ODD_INSTANTS = _ODD_TIMESTAMPS | st.sampled_from([
    "9999-12-31 23:30:00.25-05", "0001-01-01 00:30:00+01", "10000-01-01 04:30:00+05"])
VALUES = {
    "num": st.none() | st.decimals(min_value=-10**18, max_value=10**18, allow_nan=False,
                                   allow_infinity=False).map(str),
    "amount": st.none() | st.decimals(min_value=-999_999_999, max_value=999_999_999,
                                      places=3, allow_nan=False).map(str),
    "body": st.one_of(st.none(), _TEXT, _BIG_TEXT, _BIG_TEXT),
    "ts": st.none() | _MOMENT.map(lambda m: m.isoformat(sep=" ")) | _ODD_TIMESTAMPS,
    "tstz": st.none() | st.builds(
        lambda m, minutes: f"{m.isoformat(sep=' ')}{'+' if minutes >= 0 else '-'}"
                           f"{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}",
        _MOMENT, st.integers(-14 * 60, 14 * 60)) | _ODD_INSTANTS,
    "flag": st.none() | st.booleans(),
}


# --- the program ----------------------------------------------------------------------------

class Program:
    """Draws statements and runs them at once (autocommit connection, explicit BEGIN)."""

    KINDS = ("insert", "insert", "insert_rows", "upsert", "update", "update", "update_flag",
             "update_flag", "update_key", "update_all", "delete", "delete_where", "truncate",
             "message", "savepoint")

    def __init__(self, data, cursor) -> None:
        self.data, self.cursor = data, cursor
        self.log: list[str] = []

    def run(self, sql: str, params: tuple = ()) -> None:
        self.log.append(self.cursor.mogrify(sql, params).decode()[:200])
        self.cursor.execute(sql, params)

    def draw(self, strategy):
        return self.data.draw(strategy)

    def keys(self, table: str) -> list[tuple]:
        names = ", ".join(KEYS[table])
        self.cursor.execute(f"SELECT {names} FROM {SCHEMA}.{table} ORDER BY {names}")
        return [tuple(row) for row in self.cursor.fetchall()]

    def new_key(self, table: str, taken: set) -> tuple | None:
        if table == "a":
            free = [(n,) for n in range(40) if (n,) not in taken]
        else:
            free = [(r, n) for r in REGIONS for n in range(8) if (r, n) not in taken]
        return self.draw(st.sampled_from(free)) if free else None

    def row(self, some: bool) -> dict:
        names = list(COLUMNS)
        if some:
            names = self.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
        return {name: self.draw(VALUES[name]) for name in names}

    def transactions(self) -> None:
        self.run("BEGIN")  # some rows first, so updates and deletes have something to name
        for _ in range(self.draw(st.integers(0, 3))):
            self.statement("insert_rows")
        self.run("COMMIT")
        for _ in range(self.draw(st.integers(1, 6))):
            self.run("BEGIN")
            for _ in range(self.draw(st.integers(1, 5))):
                self.statement(self.draw(st.sampled_from(self.KINDS)))
            self.run(self.draw(st.sampled_from(["COMMIT", "COMMIT", "COMMIT", "ROLLBACK"])))

    def statement(self, kind: str) -> None:
        table = self.draw(st.sampled_from(sorted(KEYS)))
        key_names = KEYS[table]
        name = f"{SCHEMA}.{table}"
        where = " AND ".join(f"{column} = %s" for column in key_names)
        if kind in ("insert", "insert_rows", "upsert"):
            taken = set(self.keys(table))
            rows = []
            for _ in range(self.draw(st.integers(2, 3)) if kind == "insert_rows" else 1):
                key = (self.draw(st.sampled_from(sorted(taken))) if kind == "upsert" and taken
                       and self.draw(st.booleans()) else self.new_key(table, taken))
                if key is None:
                    return
                taken.add(key)
                rows.append((key, self.row(some=True)))
            if kind == "upsert":
                [(key, values)] = rows
                columns = [*key_names, *values]
                updated = ", ".join(f"{c} = EXCLUDED.{c}" for c in values)
                self.run(f"INSERT INTO {name} ({', '.join(columns)}) VALUES "
                         f"({', '.join(['%s'] * len(columns))}) ON CONFLICT "
                         f"({', '.join(key_names)}) DO UPDATE SET {updated}",
                         (*key, *values.values()))
                return
            columns = [*key_names, *COLUMNS]
            tuples = ", ".join(f"({', '.join(['%s'] * len(columns))})" for _ in rows)
            params = [value for key, values in rows
                      for value in (*key, *(values.get(c) for c in COLUMNS))]
            self.run(f"INSERT INTO {name} ({', '.join(columns)}) VALUES {tuples}", tuple(params))
        elif kind in ("update", "update_flag", "update_key", "delete"):
            existing = self.keys(table)
            if not existing:
                return
            key = self.draw(st.sampled_from(existing))
            if kind == "delete":
                self.run(f"DELETE FROM {name} WHERE {where}", key)
                return
            values = self.row(some=True) if kind == "update" or self.draw(st.booleans()) else {}
            if kind == "update_flag":  # never the large text: it stays unchanged TOAST
                values = {"flag": self.draw(VALUES["flag"])}
            if kind == "update_key":
                new_key = self.new_key(table, set(existing))
                if new_key is None:
                    return
                values = {**dict(zip(key_names, new_key)), **values}
            sets = ", ".join(f"{column} = %s" for column in values)
            self.run(f"UPDATE {name} SET {sets} WHERE {where}", (*values.values(), *key))
        elif kind == "update_all":
            self.run(f"UPDATE {name} SET flag = NOT coalesce(flag, false), "
                     f"num = num + 1")
        elif kind == "delete_where":
            self.run(f"DELETE FROM {name} WHERE flag")
        elif kind == "truncate":
            both = self.draw(st.booleans())
            self.run(f"TRUNCATE {SCHEMA}.a, {SCHEMA}.b" if both else f"TRUNCATE {name}")
        elif kind == "message":
            self.run("SELECT pg_logical_emit_message(true, %s, %s)",
                     (self.draw(st.sampled_from(["app", "app.event"])), self.draw(_TEXT)))
        else:
            assert kind == "savepoint"
            self.run("SAVEPOINT sp")
            self.statement(self.draw(st.sampled_from(self.KINDS[:-1])))
            self.run(self.draw(st.sampled_from(["ROLLBACK TO SAVEPOINT sp",
                                                "RELEASE SAVEPOINT sp"])))


# --- ours -----------------------------------------------------------------------------------

def _ours(cursor) -> list[tuple]:
    """Our view: per transaction (xid, commit LSN, end LSN, commit ms, record summaries)."""
    cursor.execute(f"SET TimeZone = '{PGOUTPUT_TIME_ZONE}'")
    cursor.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s, 'messages', 'true')",
        (SLOT_OURS, PUBLICATION))
    rows = cursor.fetchall()
    cursor.execute("SET TimeZone = 'UTC'")
    assembler = TransactionAssembler()
    builder = EnvelopeBuilder(db="dx", key_columns={(SCHEMA, t): k for t, k in KEYS.items()})
    out = []
    for lsn, data in rows:
        result = assembler.feed(decode_message(bytes(data)), parse_lsn(lsn))
        if result is None:
            continue
        assert isinstance(result, Transaction), result
        records = builder.records(result, now_ms=0)
        summaries = [_summary(record) for record in records]
        for record in records:
            if record.value is not None:
                source = record.value["source"]
                assert source["txId"] == result.xid
                assert source["ts_ms"] == records[0].value["source"]["ts_ms"]
        ts_ms = records[0].value["source"]["ts_ms"]
        assert [r.position.seq for r in records] == list(range(len(records)))
        assert all(r.position.end_lsn == result.end_lsn for r in records)
        out.append((result.xid, format_lsn(result.commit_lsn), format_lsn(result.end_lsn),
                    ts_ms, summaries))
    assembler.check_invariants()
    assert not assembler.in_transaction
    return out


def _summary(record) -> tuple:
    headers = {name: json.loads(value) for name, value in record.headers
               if name in (HEADER_UNAVAILABLE_COLUMNS, HEADER_PK_CHANGE_NEW_KEY,
                           HEADER_PK_CHANGE_OLD_KEY)}
    if record.value is None:
        return ("tombstone", record.table, record.key, headers)
    value = record.value
    if value["op"] == "m":
        return ("m", value["message"]["prefix"],
                base64.b64decode(value["message"]["content"]).decode(), value["source"]["lsn"])
    return (value["op"], value["source"]["schema"], value["source"]["table"], record.key,
            value["before"], value["after"], headers, value["source"]["lsn"])


# --- the oracle -----------------------------------------------------------------------------

_PG_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?([+-]\d\d)?")


def _iso(text: str, *, zone: bool) -> str:
    """Postgres' ISO output of a timestamp(tz) in UTC -> the envelope's ISO-8601 (other
    texts: infinity, BC, years past 9999, stay as they are)."""
    match = _PG_TIMESTAMP.fullmatch(text)
    if match is None:
        return text
    day, clock, fraction, offset = match.groups()
    assert (offset is not None) == zone and offset in (None, "+00"), text
    micros = (fraction or "").ljust(6, "0")
    return f"{day}T{clock}{'.' + micros if int(micros) else ''}{'Z' if zone else ''}"


def _typed(column: dict):
    value, kind = column["value"], column["type"]
    if value is None:
        return None
    if kind == "integer":
        return int(value)
    if kind.startswith("numeric"):
        return str(value)  # parse_float=str kept the digits as Postgres wrote them
    if kind in ("text", "boolean"):
        return value
    if kind == "timestamp without time zone":
        return _iso(value, zone=False)
    if kind == "timestamp with time zone":
        return _iso(value, zone=True)
    raise AssertionError(f"the oracle has no mapping for type {kind!r}")


def _oracle(cursor, identities: dict[str, str], seen: collections.Counter) -> list[tuple]:
    cursor.execute(f"SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, "
                   f"{W2J_OPTIONS})", (SLOT_ORACLE,))
    out, current = [], None
    for (line,) in cursor.fetchall():
        change = json.loads(line, parse_float=str)
        action = change["action"]
        if action == "B":
            current = (change["xid"], change["lsn"], change["nextlsn"],
                       _unix_ms(change["timestamp"]), [])
        elif action == "C":
            assert current is not None and (change["xid"], change["lsn"], change["nextlsn"]) \
                == current[:3]
            if current[4]:  # wal2json keeps transactions with nothing published (DDL)
                out.append(current)
            current = None
        else:
            assert current is not None and change["xid"] == current[0]
            if action == "M" or change.get("schema") == SCHEMA:
                current[4].extend(_expected(change, identities, seen))
    assert current is None
    return out


def _unix_ms(text: str) -> int:
    moment = datetime.datetime.strptime(text.replace("+00", "+0000"), "%Y-%m-%d %H:%M:%S.%f%z"
                                        if "." in text else "%Y-%m-%d %H:%M:%S%z")
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
    return (moment - epoch) // datetime.timedelta(milliseconds=1)


def _expected(change: dict, identities: dict[str, str], seen: collections.Counter
              ) -> list[tuple]:
    """One wal2json change -> the records the envelope must make of it (CONTRACT's
    envelope, docs/connect-postgres.md), built from the oracle's data alone."""
    action, lsn = change["action"], change["lsn"]
    if action == "M":
        return [("m", change["prefix"], change["content"], lsn)]
    table = change["table"]
    if action == "T":
        return [("t", SCHEMA, table, None, None, None, {}, lsn)]
    full = identities[table] == "FULL"
    key_names = KEYS[table]
    new = {c["name"]: _typed(c) for c in change.get("columns", ())}
    old = {c["name"]: _typed(c) for c in change.get("identity", ())}
    old_key = {name: old[name] for name in key_names} if old else None
    if action == "I":
        return [("c", SCHEMA, table, {n: new[n] for n in key_names}, None, new, {}, lsn)]
    if action == "D":
        before = old if full else old_key
        return [("d", SCHEMA, table, old_key, before, None, {}, lsn),
                ("tombstone", table, old_key, {})]
    assert action == "U", change
    after, unavailable = {}, []
    for name in (*key_names, *COLUMNS):
        if name in new:
            after[name] = new[name]
        elif full:  # an unchanged TOAST value wal2json leaves out: the old row has it
            after[name] = old[name]
            seen["toast_copied"] += 1
        else:
            after[name] = UNAVAILABLE_VALUE
            unavailable.append(name)
            seen["toast_unavailable"] += 1
    headers = {HEADER_UNAVAILABLE_COLUMNS: unavailable} if unavailable else {}
    new_key = {name: after[name] for name in key_names}
    if old_key is None or old_key == new_key:
        return [("u", SCHEMA, table, new_key, old if full else None, after, headers, lsn)]
    before = old if full else old_key
    seen["pk_change"] += 1
    return [("d", SCHEMA, table, old_key, before, None,
             {HEADER_PK_CHANGE_NEW_KEY: new_key}, lsn),
            ("tombstone", table, old_key, {HEADER_PK_CHANGE_NEW_KEY: new_key}),
            ("c", SCHEMA, table, new_key, None, after,
             {**headers, HEADER_PK_CHANGE_OLD_KEY: old_key}, lsn)]


# --- the test -------------------------------------------------------------------------------

def _reset(cursor, identities: dict[str, str]) -> None:
    for slot in (SLOT_OURS, SLOT_ORACLE):
        cursor.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                       "WHERE slot_name = %s", (slot,))
    for statement in _ddl(identities):
        cursor.execute(statement)
    cursor.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT_OURS,))
    cursor.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (SLOT_ORACLE,))


def test_pgoutput_through_our_envelope_agrees_with_wal2json(postgres_server, pg_database):
    if not (PG_BIN.parent / "lib" / "wal2json.so").exists():
        pytest.fail("wal2json is missing: install postgresql-15-wal2json (`make postgres`; "
                    "the differential test needs it as its oracle)")
    conn = psycopg2.connect(postgres_server.dsn(pg_database))
    conn.autocommit = True
    cursor = conn.cursor()
    # The fixture's server commits asynchronously; the slots are read up to the flushed WAL.
    cursor.execute("SET synchronous_commit = on")
    seen: collections.Counter = collections.Counter()  # what the oracle saw, over all examples
    ops: set[str] = set()

    @settings(max_examples=EXAMPLES, derandomize=DERANDOMIZE, database=None, deadline=None,
              phases=PHASES, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.data())
    def check(data):
        identities = {table: data.draw(st.sampled_from(["DEFAULT", "FULL"]), label=table)
                      for table in KEYS}
        _reset(cursor, identities)
        program = Program(data, cursor)
        try:
            program.transactions()
        finally:
            if conn.get_transaction_status() != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
                cursor.execute("ROLLBACK")
        ours, oracle = _ours(cursor), _oracle(cursor, identities, seen)
        note("\n".join(program.log))  # shown with a failing example
        assert len(ours) == len(oracle), (ours, oracle)
        for mine, theirs in zip(ours, oracle):
            assert mine[:4] == theirs[:4]  # xid, commit LSN, end LSN, commit time
            assert mine[4] == theirs[4]
            seen["changes"] += len(mine[4])
            ops.update(summary[0] for summary in mine[4])

    try:
        check()
    finally:
        conn.close()
    # The examples did reach every kind of record (else the comparison proves little).
    assert ops >= {"c", "u", "d", "tombstone", "t", "m"}, ops
    assert seen["changes"] >= 400, seen
    assert min(seen[k] for k in ("toast_copied", "toast_unavailable", "pk_change")) >= 2, seen
