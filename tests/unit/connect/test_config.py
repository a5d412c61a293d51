"""load_config: the example of CONTRACT loads; every malformed file names its path."""

from __future__ import annotations

import copy

import pytest

from rivven_connect.core.admission import AdmissionMode, TopicPattern
from rivven_connect.core.config import (
    ConnectConfigError,
    SourceMode,
    TransactionInterval,
    load_config,
)

EXAMPLE = """
version: "1.0"
broker: { bootstrap: "127.0.0.1:9092" }
http: "127.0.0.1:9095"
sources:
  orders_db:
    connector: postgres-cdc
    topic: "cdc.{schema}.{table}"
    config: { host: 127.0.0.1, port: 5432, database: shop, user: rivven,
              password: "${POSTGRES_PASSWORD}", slot_name: rivven_slot,
              publication_name: rivven_pub, tables: [public.orders],
              snapshot: { mode: initial } }
    transforms:
      - { type: ExtractNewRecordState, predicate: { table: orders } }
    routing:
      admission: { mode: allowlist, topics: ["cdc.public.*"], max_destinations: 8 }
      dlq_topic: connect.dlq
      topic_defaults: { partitions: 3, replication_factor: 1, configs: { cleanup.policy: compact } }
sinks:
  archive: { connector: file, topics: [cdc.public.orders], consumer_group: archive,
             config: { path: /var/lib/archive } }
"""


def _base() -> dict:
    return {"version": "1.0", "sources": {"s": {"connector": "file-poll", "topic": "t"}}}


def test_the_contract_example_loads_with_env_substituted():
    config = load_config(EXAMPLE, {"POSTGRES_PASSWORD": "hunter2"})
    source = config.sources["orders_db"]
    assert source.config["password"] == "hunter2"
    assert "hunter2" not in repr(config)
    assert source.mode is SourceMode.CDC
    assert source.routing.on_admission_failure == "error"  # CDC's default
    assert source.routing.admission.mode is AdmissionMode.ALLOWLIST
    assert source.routing.admission.patterns == (TopicPattern(("cdc", "public", "*")),)
    assert source.routing.topic_defaults.configs == (("cleanup.policy", "compact"),)
    assert source.transforms[0]["type"] == "ExtractNewRecordState"
    assert source.topic.render("public", "orders") == "cdc.public.orders"
    assert config.bootstrap == ("127.0.0.1:9092",)
    assert config.sinks["archive"].topics == ("cdc.public.orders",)


def test_env_substitution_is_after_parsing_and_escapable():
    doc = _base()
    doc["sources"]["s"]["config"] = {"a": "${X}", "b": "$${X}", "c": ["x-${X}"]}
    config = load_config(doc, {"X": "{evil: [1]}"})
    assert config.sources["s"].config == {"a": "{evil: [1]}", "b": "${X}", "c": ["x-{evil: [1]}"]}


@pytest.mark.parametrize("connector,config,expected", [
    ("postgres-cdc", {}, "error"),
    ("postgres-outbox-poll", {}, "error"),  # deletes or marks what it delivered, always
    ("jdbc-poll", {"delete_after_read": True}, "error"),
    ("jdbc-poll", {"processed_column": "done"}, "error"),
    ("jdbc-poll", {}, "drop"),
    ("webhook", {}, "drop"),
])
def test_on_admission_failure_defaults_by_source_kind(connector, config, expected):
    doc = _base()
    doc["sources"]["s"].update(connector=connector, config=config)
    assert load_config(doc, {}).sources["s"].routing.on_admission_failure == expected


def test_the_transaction_boundary_is_one_poll_unless_interval_is_asked():
    assert load_config(_base(), {}).sources["s"].transaction is None
    assert load_config(_src(transaction={"boundary": "poll"}), {}).sources["s"].transaction is None
    assert load_config(_src(transaction={"boundary": "interval"}), {}
                       ).sources["s"].transaction == TransactionInterval(100, 10_000)
    assert load_config(_src(transaction={"boundary": "interval", "interval_ms": 20,
                                         "records_max": 500}), {}
                       ).sources["s"].transaction == TransactionInterval(20, 500)


def _src(**changes):
    doc = _base()
    doc["sources"]["s"].update(changes)
    return doc


def _routing(**routing):
    return _src(routing=routing)


# (document, env, the path the error names, a fragment of its message)
BAD = [
    ({"sourcs": {}}, {}, "sourcs", "did you mean 'sources'"),
    ({"version": "2.0"}, {}, "version", "not supported"),
    ({"broker": {"bootstrap": "nohost"}}, {}, "broker.bootstrap[0]", "HOST:PORT"),
    ({"http": "x:99999"}, {}, "http", "HOST:PORT"),
    (_src(password="x"), {}, "sources.s.password", "unknown key"),
    (_src(topik="x"), {}, "sources.s.topik", "did you mean 'topic'"),
    (_src(config={"p": "${NOPE}"}), {}, "sources.s.config.p", "${NOPE} is not set"),
    (_src(config={"p": "${1x}"}), {}, "sources.s.config.p", "not a variable name"),
    ({"sources": {"s": {"topic": "t"}}}, {}, "sources.s.connector", "is required"),
    ({"sources": {"bad name": {"connector": "c", "topic": "t"}}}, {}, "sources.bad name", "name"),
    (_src(topic="a/b"), {}, "sources.s.topic", "legal topic name"),
    (_src(topic="cdc.{db}"), {}, "sources.s.topic", "{schema} and {table}"),
    (_src(transforms=[{"predicate": {}}]), {}, "sources.s.transforms[0].type", "required"),
    (_src(transforms=[{"type": "MaskField", "feilds": ["a"]}]), {},
     "sources.s.transforms[0].fields", "misspelling"),  # checked whole by build_chain
    (_src(transforms=[{"type": "X", "predicate": "p"}]), {},
     "sources.s.transforms[0].predicate", "mapping"),
    (_src(transforms=[{"type": "Filter", "predicate": {"operation": ["d"]}},
                      {"type": "Route", "field": "k", "mapping": {"a": "t.a"}}],
          routing={"by_table": "t.{table}"}),
     {}, "sources.s.transforms[1]", "Route transform and source routing"),
    (_src(transforms=[{"type": "Route", "field": "k", "mapping": {"a": "t.a"}}],
          routing={"topic_column": "c", "default_topic": "d"}),
     {}, "sources.s.transforms[0]", "configure one"),
    (_routing(admission={"mode": "allowlist", "topics": ["ok.*", "*"]}), {},
     "sources.s.routing.admission.topics[1]", "use mode: open"),
    (_routing(admission={"mode": "denylist", "topics": ["*.*"]}), {},
     "sources.s.routing.admission.topics[0]", "use mode: open"),
    (_routing(admission={"mode": "allowlist", "topics": ["a.b*"]}), {},
     "sources.s.routing.admission.topics[0]", "segment"),
    (_routing(admission={"mode": "allowlist", "topics": ["a..b"]}), {},
     "sources.s.routing.admission.topics[0]", "segment"),
    (_routing(admission={"mode": "allowlist"}), {}, "sources.s.routing.admission.topics",
     "at least one"),
    (_routing(admission={"topics": ["a.*"]}), {}, "sources.s.routing.admission.topics",
     "not open"),
    (_routing(admission={"mode": "closed"}), {}, "sources.s.routing.admission.mode", "not one of"),
    (_routing(admission={"max_destinations": 0}), {},
     "sources.s.routing.admission.max_destinations", "integer"),
    (_routing(admission={"max_destination": 3}), {},
     "sources.s.routing.admission.max_destination", "did you mean 'max_destinations'"),
    (_routing(topic_column="c"), {}, "sources.s.routing.default_topic", "required"),
    (_routing(default_topic="d"), {}, "sources.s.routing.default_topic", "only applies"),
    (_routing(by_table="a.{table}", topic_column="c", default_topic="d"), {},
     "sources.s.routing.topic_column", "configure one"),
    (_routing(by_table={}), {}, "sources.s.routing.by_table", "routes nothing"),
    (_routing(by_table={"public.orders": "bad topic"}), {},
     "sources.s.routing.by_table.public.orders", "legal topic"),
    (_routing(on_missing_destination="ignore"), {}, "sources.s.routing.on_missing_destination",
     "not one of"),
    (_routing(on_admission_failure="dlq"), {}, "sources.s.routing.on_admission_failure",
     "dlq_topic"),
    (_routing(dlq_topic="bad/topic"), {}, "sources.s.routing.dlq_topic", "legal topic"),
    (_routing(strip_columns="yes"), {}, "sources.s.routing.strip_columns", "true or false"),
    (_routing(topic_defaults={"partitions": 0}), {}, "sources.s.routing.topic_defaults.partitions",
     "integer"),
    (_routing(topic_defaults={"partition": 3}), {}, "sources.s.routing.topic_defaults.partition",
     "did you mean 'partitions'"),
    (_routing(topic_defaults={"configs": {"x": [1]}}), {},
     "sources.s.routing.topic_defaults.configs.x", "string or number"),
    (_src(errors={"tolerance": "all"}), {}, "sources.s.errors.tolerance", "dlq_topic"),
    (_src(errors={"tolerance": "some"}), {}, "sources.s.errors.tolerance", "not one of"),
    (_src(transaction={"boundary": "connector"}), {}, "sources.s.transaction.boundary",
     "not one of"),
    (_src(transaction={"interval_ms": 50}), {}, "sources.s.transaction.interval_ms",
     "only with boundary: interval"),
    (_src(transaction={"boundary": "interval", "interval_ms": 0}), {},
     "sources.s.transaction.interval_ms", "integer in 1..60000"),
    (_src(transaction={"boundary": "interval", "records_max": 100_001}), {},
     "sources.s.transaction.records_max", "integer in 1..100000"),
    (_src(transaction={"boundary": "interval", "records": 5}), {},
     "sources.s.transaction.records", "did you mean 'records_max'"),
    ({"sinks": {"k": {"connector": "file", "topics": []}}}, {}, "sinks.k.topics", "non-empty"),
    ({"sinks": {"k": {"connector": "file", "topics": ["ok", "no way"]}}}, {}, "sinks.k.topics[1]",
     "legal topic"),
    ({"sinks": {"k": {"connector": "file", "topics": ["t"], "group": "g"}}}, {}, "sinks.k.group",
     "unknown key"),
]


@pytest.mark.parametrize("document,env,path,fragment", BAD, ids=[row[2] for row in BAD])
def test_a_bad_config_names_its_path(document, env, path, fragment):
    with pytest.raises(ConnectConfigError) as caught:
        load_config(copy.deepcopy(document), env)
    assert caught.value.path == path
    assert str(caught.value).startswith(f"{path}: ")
    assert fragment in str(caught.value)


def test_yaml_syntax_errors_say_where():
    with pytest.raises(ConnectConfigError, match="line 2, column 10"):
        load_config("version: '1.0'\nsources: : x\n", {})


def test_yaml_tags_are_not_objects():
    with pytest.raises(ConnectConfigError, match="not valid YAML"):
        load_config("!!python/object/apply:os.system ['true']", {})
