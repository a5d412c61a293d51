"""``load_config``: the connector runtime's YAML file (CONTRACT "Connectors"), validated once.

Theory of operation
-------------------
The driver reads the file and passes its text (or tests pass a ``dict``) together with an
environment mapping; this module never touches ``os.environ`` or the disk. Steps:

1. the text is parsed with ``yaml.safe_load`` (no object tags);
2. every ``${NAME}`` inside a string *value* is replaced from the mapping (``$${`` stays a
   literal ``${``). Substitution happens after parsing, so a variable can never inject YAML
   structure; a missing variable is an error naming where it was used;
3. the tree is checked top-down into frozen ``ConnectConfig`` / ``SourceConfig`` /
   ``RoutingConfig`` / ``SinkConfig``. Unknown keys are refused (with "did you mean" when a
   known key is close), and so is every value of the wrong type or range.

Every problem raises ``ConnectConfigError`` whose message starts with the path of the
offending item, e.g. ``sources.orders_db.routing.admission.topics[0]: ...``; the first problem
found is reported. Two rules cross keys: a ``Route`` transform together with source routing
(``by_table`` / ``topic_column``) is refused (who would decide?), and ``topic_column`` needs a
``default_topic``. A connector's own ``config`` block is passed through unchecked (its
connector validates it); the transforms are checked whole by ``transforms.build_chain``
(every type, option and predicate), whose errors come out as ``ConnectConfigError`` too.
"""

from __future__ import annotations

import difflib
import enum
import functools
import re
import string
from typing import Any, Callable, Mapping, NoReturn

import attrs
import yaml

from rivven_broker.protocol import limits
from rivven_broker.protocol.names import group_id_error, topic_name_error
from rivven_connect.core.transforms import TransformConfigError, build_chain
from rivven_connect.core.admission import (
    AdmissionConfig,
    AdmissionMode,
    TopicPattern,
    max_destinations_default,
    max_destinations_limit,
)

__all__ = [
    "CONFIG_VERSION",
    "CDC_CONNECTORS",
    "OFFSETS_TOPIC",
    "ConnectConfig",
    "ConnectConfigError",
    "RoutingConfig",
    "SinkConfig",
    "SourceConfig",
    "SourceMode",
    "TopicDefaults",
    "TopicTemplate",
    "TransactionInterval",
    "load_config",
]

CONFIG_VERSION = "1.0"
#: Where every source's committed position is written, in the batch's own transaction.
OFFSETS_TOPIC = "__connect_offsets"
#: Connectors whose source is a change stream (consumed WAL cannot be re-read: never drop).
CDC_CONNECTORS = frozenset({"postgres-cdc"})
#: Polling-source options that make reading destructive (rows are deleted or marked).
DESTRUCTIVE_OPTIONS = ("delete_after_read", "processed_column")
#: Polling connectors that always delete or mark what they delivered (whatever the options).
DESTRUCTIVE_CONNECTORS = frozenset({"postgres-outbox-poll"})
#: ``sources.NAME.transaction`` (``boundary: interval``) bounds: how long one transaction may
#: gather polls, and the records it may hold (the batch cycle's ``batch_records_max``).
interval_ms_limit = 60_000
interval_records_limit = 100_000
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ENV = re.compile(r"\$(\$?)\{([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")
_PLACEHOLDERS = frozenset({"schema", "table"})


class ConnectConfigError(ValueError):
    """The configuration is malformed; ``path`` says where. The message is for the operator."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.problem = message


def _fail(path: str, message: str) -> NoReturn:
    raise ConnectConfigError(path, message)


class SourceMode(enum.Enum):
    """How a source's data behaves when not taken (decides ``on_admission_failure``'s default:
    CDC and destructive polling lose data on a drop, so they default to ``error``)."""

    CDC = "cdc"
    POLLING_DESTRUCTIVE = "polling_destructive"
    OTHER = "other"  # non-destructive polling and opaque sources: the rows stay upstream


@attrs.frozen
class TopicTemplate:
    """A topic name, or a template with ``{schema}`` and ``{table}``."""

    text: str

    @property
    def is_template(self) -> bool:
        return "{" in self.text

    def render(self, schema: str | None, table: str | None) -> str | None:
        """The topic for a record of ``schema.table``; None if a placeholder has no value."""
        if not self.is_template:
            return self.text
        fields = _template_fields(self.text)
        if ("schema" in fields and schema is None) or ("table" in fields and table is None):
            return None
        return self.text.format(schema=schema, table=table)


@functools.lru_cache(maxsize=1024)
def _template_fields(text: str) -> frozenset[str]:
    """The placeholders of a topic template (parsed once per text: ``render`` runs per
    record)."""
    return frozenset(name for _, name, _, _ in string.Formatter().parse(text) if name)


@attrs.frozen
class TopicDefaults:
    """``routing.topic_defaults``: what topics created on first admission get."""

    partitions: int | None = None
    replication_factor: int | None = None
    configs: tuple[tuple[str, str], ...] = ()


@attrs.frozen(kw_only=True)
class RoutingConfig:
    """A source's ``routing`` block (docs/connect.md "Routing")."""

    #: A template for every table, or per-table templates keyed ``schema.table`` or ``table``.
    by_table: TopicTemplate | tuple[tuple[str, TopicTemplate], ...] | None = None
    topic_column: str | None = None
    default_topic: TopicTemplate | None = None
    key_column: str | None = None
    #: Remove ``topic_column`` and ``key_column`` from the value once used.
    strip_columns: bool = False
    on_missing_destination: str = "default"  # default | drop | error
    admission: AdmissionConfig = AdmissionConfig()
    on_admission_failure: str = "error"  # error | drop | dlq
    dlq_topic: str | None = None
    topic_defaults: TopicDefaults = TopicDefaults()

    def __attrs_post_init__(self) -> None:
        assert self.on_missing_destination in ("default", "drop", "error")
        assert self.on_admission_failure in ("error", "drop", "dlq")
        assert self.on_admission_failure != "dlq" or self.dlq_topic is not None
        assert (self.topic_column is None) == (self.default_topic is None)

    @property
    def routes_at_source(self) -> bool:
        return self.by_table is not None or self.topic_column is not None


@attrs.frozen
class TransactionInterval:
    """``sources.NAME.transaction`` with ``boundary: interval``: one transaction takes the
    records of several polls — the first poll's, then what the source has ready without
    waiting — until it holds ``records_max`` records, has gathered for ``interval_ms``, or
    the source has nothing more ready (``batch_cycle`` ``GATHERING``)."""

    interval_ms: int = 100
    records_max: int = 10_000

    def __attrs_post_init__(self) -> None:
        assert 0 < self.interval_ms <= interval_ms_limit, self.interval_ms
        assert 0 < self.records_max <= interval_records_limit, self.records_max


@attrs.frozen(kw_only=True)
class SourceConfig:
    name: str
    connector: str
    topic: TopicTemplate
    #: The connector's own settings (credentials: kept out of ``repr``).
    config: Mapping[str, Any] = attrs.field(factory=dict, hash=False, repr=False)
    #: Raw transform specs, in order (``transforms.build_chain`` builds them).
    transforms: tuple[Mapping[str, Any], ...] = attrs.field(default=(), hash=False)
    routing: RoutingConfig = RoutingConfig()
    #: ``errors.tolerance``: ``none`` (a transform exception stops the source) or ``all``
    #: (the record goes to ``routing.dlq_topic``).
    errors_tolerance: str = "none"
    mode: SourceMode = SourceMode.OTHER
    #: ``transaction``: ``boundary: interval`` (several polls per transaction), or None:
    #: ``boundary: poll`` (one poll, one transaction; the default, as Kafka Connect's).
    transaction: TransactionInterval | None = None

    @property
    def transactional_id(self) -> str:
        return f"connect-{self.name}"


@attrs.frozen(kw_only=True)
class SinkConfig:
    name: str
    connector: str
    topics: tuple[str, ...]
    consumer_group: str
    config: Mapping[str, Any] = attrs.field(factory=dict, hash=False, repr=False)


@attrs.frozen(kw_only=True)
class ConnectConfig:
    version: str = CONFIG_VERSION
    bootstrap: tuple[str, ...] = ("127.0.0.1:9092",)
    #: ``None``: no HTTP server.
    http: str | None = "127.0.0.1:9095"
    sources: Mapping[str, SourceConfig] = attrs.field(factory=dict, hash=False)
    sinks: Mapping[str, SinkConfig] = attrs.field(factory=dict, hash=False)


# --- entry point ------------------------------------------------------------------------------


#: ``fetch_mapping(url) -> mapping``: a ``Route`` transform's ``mapping_url``, fetched once by
#: the runtime (``cli.fetch_mapping``); raises ``ValueError`` or ``OSError`` saying why not.
FetchMapping = Callable[[str], Any]


def load_config(document: str | Mapping[str, Any], env: Mapping[str, str],
                fetch_mapping: FetchMapping | None = None) -> ConnectConfig:
    """The validated configuration of YAML text (or an already parsed mapping).
    ``fetch_mapping`` loads a ``Route`` transform's ``mapping_url`` (the only I/O the
    configuration asks for, injected; without it a ``mapping_url`` is refused).

    Raises ``ConnectConfigError`` naming the first offending path.
    """
    if isinstance(document, str):
        try:
            tree = yaml.safe_load(document)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            _fail("", f"not valid YAML: {where}{getattr(error, 'problem', None) or error}")
    else:
        tree = document
    tree = _substitute(tree, env, "")
    top = _mapping(tree, "", "the file")
    _known(top, "", ("version", "broker", "http", "sources", "sinks"))
    version = top.get("version", CONFIG_VERSION)
    if isinstance(version, float):
        version = repr(version)
    if version != CONFIG_VERSION:
        _fail("version", f"{version!r} is not supported; expected {CONFIG_VERSION!r}")
    broker = _mapping(top.get("broker", {}), "broker", "a mapping")
    _known(broker, "broker", ("bootstrap",))
    bootstrap = _bootstrap(broker.get("bootstrap", "127.0.0.1:9092"), "broker.bootstrap")
    http = top.get("http", "127.0.0.1:9095")
    if http in (None, False, "off"):
        http = None
    else:
        http = _host_port(http, "http")
    sources = {
        name: _source(name, raw, f"sources.{name}", fetch_mapping)
        for name, raw in _named(top.get("sources", {}), "sources").items()
    }
    sinks = {
        name: _sink(name, raw, f"sinks.{name}")
        for name, raw in _named(top.get("sinks", {}), "sinks").items()
    }
    return ConnectConfig(bootstrap=bootstrap, http=http, sources=sources, sinks=sinks)


# --- environment ------------------------------------------------------------------------------


def _substitute(node: Any, env: Mapping[str, str], path: str) -> Any:
    if isinstance(node, str):
        def replace(match: re.Match[str]) -> str:
            if match.group(1):  # $${...}: a literal ${...}
                return "${" + match.group(2) + "}"
            name = match.group(2)
            if _ENV_NAME.fullmatch(name) is None:
                _fail(path, f"${{{name}}} is not a variable name")
            if name not in env:
                _fail(path, f"${{{name}}} is not set in the environment")
            return env[name]
        return _ENV.sub(replace, node)
    if isinstance(node, dict):
        return {key: _substitute(value, env, _join(path, key)) for key, value in node.items()}
    if isinstance(node, list):
        return [_substitute(value, env, f"{path}[{i}]") for i, value in enumerate(node)]
    return node


# --- shapes -----------------------------------------------------------------------------------


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _mapping(value: object, path: str, what: str = "a mapping") -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        _fail(path, f"must be {what} with string keys, not {type(value).__name__}")
    return value


def _known(table: Mapping[str, Any], path: str, keys: tuple[str, ...]) -> None:
    for key in table:
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(keys)})"
            _fail(_join(path, key), f"unknown key{hint}")


def _required(table: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in table or table[key] is None:
        _fail(_join(path, key), "is required")
    return table[key]


def _named(value: object, path: str) -> dict[str, Any]:
    table = _mapping(value if value is not None else {}, path)
    for name in table:
        if _NAME.fullmatch(name) is None:
            _fail(_join(path, name), "a name is 1 to 64 letters, digits, '.', '_' or '-'")
    return table


def _string(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        _fail(path, f"must be a non-empty string, not {value!r}")
    return value


def _int(value: object, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        _fail(path, f"must be an integer in {low}..{high}, not {value!r}")
    return value


def _bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        _fail(path, f"must be true or false, not {value!r}")
    return value


def _choice(value: object, path: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        _fail(path, f"{value!r} is not one of {', '.join(choices)}")
    return value  # type: ignore[return-value]


def _host_port(value: object, path: str) -> str:
    text = _string(value, path).strip()
    match = _HOST_PORT.fullmatch(text)
    if match is None or int(match.group(2)) > 65535:
        _fail(path, f"{value!r} is not HOST:PORT")
    return text


def _bootstrap(value: object, path: str) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        _fail(path, "must be HOST:PORT[,HOST:PORT...] or a list of HOST:PORT")
    return tuple(_host_port(item, f"{path}[{i}]") for i, item in enumerate(items))


def _topic(value: object, path: str) -> str:
    text = _string(value, path)
    if topic_name_error(text) is not None:
        _fail(path, f"{text!r} is not a legal topic name (1 to {limits.topic_name_bytes_max} "
                    "letters, digits, '.', '_' or '-')")
    return text


def _template(value: object, path: str) -> TopicTemplate:
    text = _string(value, path)
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(text)
                  if name is not None]
    except ValueError as error:
        _fail(path, f"{text!r} is not a topic template: {error}")
    for name, spec, conversion in fields:
        if name not in _PLACEHOLDERS or spec or conversion:
            _fail(path, f"{text!r}: the only placeholders are {{schema}} and {{table}}")
    sample = text.format(schema="s", table="t") if fields else text
    if topic_name_error(sample) is not None:
        _fail(path, f"{text!r} does not make a legal topic name (letters, digits, '.', '_', '-')")
    return TopicTemplate(text)


# --- sources ----------------------------------------------------------------------------------

_SOURCE_KEYS = ("connector", "topic", "config", "transforms", "routing", "errors",
                "transaction")
_ROUTING_KEYS = (
    "by_table", "topic_column", "default_topic", "key_column", "strip_columns",
    "on_missing_destination", "admission", "on_admission_failure", "dlq_topic",
    "topic_defaults",
)


def _source(name: str, raw: object, path: str,
            fetch_mapping: FetchMapping | None) -> SourceConfig:
    table = _mapping(raw, path)
    _known(table, path, _SOURCE_KEYS)
    connector = _string(_required(table, "connector", path), f"{path}.connector")
    topic = _template(_required(table, "topic", path), f"{path}.topic")
    config = _mapping(table.get("config") or {}, f"{path}.config")
    mode = _source_mode(connector, config)
    transforms = _transforms(table.get("transforms") or [], f"{path}.transforms",
                             fetch_mapping)
    routing = _routing(table.get("routing") or {}, f"{path}.routing", mode)
    errors = _mapping(table.get("errors") or {}, f"{path}.errors")
    _known(errors, f"{path}.errors", ("tolerance",))
    tolerance = _choice(errors.get("tolerance", "none"), f"{path}.errors.tolerance",
                        ("none", "all"))
    if tolerance == "all" and routing.dlq_topic is None:
        _fail(f"{path}.errors.tolerance", "'all' sends failed records to routing.dlq_topic, "
                                          "which is not set")
    routes = [i for i, spec in enumerate(transforms) if spec["type"] == "Route"]
    if routes and routing.routes_at_source:
        _fail(f"{path}.transforms[{routes[0]}]",
              "a Route transform and source routing (routing.by_table / routing.topic_column) "
              "both set destinations; configure one of them")
    try:  # every type, option and predicate of every transform, before anything runs
        build_chain(list(transforms), path=f"{path}.transforms")
    except TransformConfigError as exc:
        raise ConnectConfigError(exc.path, exc.reason) from exc
    return SourceConfig(name=name, connector=connector, topic=topic, config=config,
                        transforms=transforms, routing=routing, errors_tolerance=tolerance,
                        mode=mode, transaction=_transaction(table.get("transaction"),
                                                            f"{path}.transaction"))


def _transaction(raw: object, path: str) -> TransactionInterval | None:
    """``transaction: {boundary: poll | interval, interval_ms, records_max}`` (absent:
    ``poll``)."""
    table = _mapping(raw or {}, path)
    _known(table, path, ("boundary", "interval_ms", "records_max"))
    boundary = _choice(table.get("boundary", "poll"), f"{path}.boundary", ("poll", "interval"))
    if boundary == "poll":
        extra = sorted(set(table) - {"boundary"})
        if extra:
            _fail(f"{path}.{extra[0]}", "applies only with boundary: interval")
        return None
    default = TransactionInterval()
    return TransactionInterval(
        _int(table.get("interval_ms", default.interval_ms), f"{path}.interval_ms", 1,
             interval_ms_limit),
        _int(table.get("records_max", default.records_max), f"{path}.records_max", 1,
             interval_records_limit))


def _source_mode(connector: str, config: Mapping[str, Any]) -> SourceMode:
    if connector in CDC_CONNECTORS:
        return SourceMode.CDC
    if connector in DESTRUCTIVE_CONNECTORS or any(
            config.get(option) for option in DESTRUCTIVE_OPTIONS):
        return SourceMode.POLLING_DESTRUCTIVE
    return SourceMode.OTHER


def _transforms(value: object, path: str,
                fetch_mapping: FetchMapping | None) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(value, list):
        _fail(path, "must be a list of transforms ({type: Name, ...options})")
    specs = []
    for i, raw in enumerate(value):
        spec = _mapping(raw, f"{path}[{i}]")
        _string(_required(spec, "type", f"{path}[{i}]"), f"{path}[{i}].type")
        if "predicate" in spec:
            _mapping(spec["predicate"], f"{path}[{i}].predicate")
        if spec["type"] == "Route" and "mapping_url" in spec:
            spec = _fetched_route(spec, f"{path}[{i}]", fetch_mapping)
        specs.append(spec)
    return tuple(specs)


def _fetched_route(spec: Mapping[str, Any], path: str,
                   fetch_mapping: FetchMapping | None) -> dict[str, Any]:
    """A ``Route`` spec whose ``mapping_url`` is replaced by the mapping fetched from it, once,
    at load: a failed fetch refuses to start, and an empty mapping is never a fallback."""
    where = f"{path}.mapping_url"
    if "mapping" in spec:
        _fail(where, "give mapping or mapping_url, not both")
    url = _string(spec["mapping_url"], where)
    if not url.startswith(("http://", "https://")):
        _fail(where, f"{url!r} is not an http:// or https:// URL")
    if fetch_mapping is None:
        _fail(where, "this loader fetches no mapping (the runtime does, at start)")
    try:
        mapping = fetch_mapping(url)
    except (OSError, ValueError) as error:
        _fail(where, f"could not load the mapping from {url}: {error}")
    if not isinstance(mapping, dict) or not mapping:
        _fail(where, f"{url} answered {type(mapping).__name__ if mapping else 'an empty mapping'}"
                     f"; a Route needs a non-empty JSON object of value -> topic")
    resolved = {k: v for k, v in spec.items() if k != "mapping_url"}
    resolved["mapping"] = mapping  # (checked entry by entry by the Route transform)
    return resolved


def _routing(raw: object, path: str, mode: SourceMode) -> RoutingConfig:
    table = _mapping(raw, path)
    _known(table, path, _ROUTING_KEYS)
    by_table = None
    if table.get("by_table") is not None:
        by_table = _by_table(table["by_table"], f"{path}.by_table")
    topic_column = default_topic = None
    if table.get("topic_column") is not None:
        topic_column = _string(table["topic_column"], f"{path}.topic_column")
        default_topic = _template(_required(table, "default_topic", path),
                                  f"{path}.default_topic")
    elif table.get("default_topic") is not None:
        _fail(f"{path}.default_topic", "only applies with routing.topic_column")
    if by_table is not None and topic_column is not None:
        _fail(f"{path}.topic_column", "by_table and topic_column both set destinations; "
                                      "configure one of them")
    key_column = None
    if table.get("key_column") is not None:
        key_column = _string(table["key_column"], f"{path}.key_column")
    strip = _bool(table.get("strip_columns", False), f"{path}.strip_columns")
    on_missing = _choice(table.get("on_missing_destination", "default"),
                         f"{path}.on_missing_destination", ("default", "drop", "error"))
    default_failure = "drop" if mode is SourceMode.OTHER else "error"
    on_failure = _choice(table.get("on_admission_failure", default_failure),
                         f"{path}.on_admission_failure", ("error", "drop", "dlq"))
    dlq_topic = None
    if table.get("dlq_topic") is not None:
        dlq_topic = _topic(table["dlq_topic"], f"{path}.dlq_topic")
    if on_failure == "dlq" and dlq_topic is None:
        _fail(f"{path}.on_admission_failure", "'dlq' needs routing.dlq_topic")
    return RoutingConfig(
        by_table=by_table, topic_column=topic_column, default_topic=default_topic,
        key_column=key_column, strip_columns=strip, on_missing_destination=on_missing,
        admission=_admission(table.get("admission") or {}, f"{path}.admission"),
        on_admission_failure=on_failure, dlq_topic=dlq_topic,
        topic_defaults=_topic_defaults(table.get("topic_defaults") or {},
                                       f"{path}.topic_defaults"),
    )


def _by_table(value: object, path: str) -> TopicTemplate | tuple[tuple[str, TopicTemplate], ...]:
    if isinstance(value, str):
        return _template(value, path)
    table = _mapping(value, path, "a topic template or a mapping of table to topic template")
    if not table:
        _fail(path, "an empty mapping routes nothing")
    return tuple((name, _template(topic, _join(path, name))) for name, topic in table.items())


def _admission(raw: object, path: str) -> AdmissionConfig:
    table = _mapping(raw, path)
    _known(table, path, ("mode", "topics", "max_destinations"))
    mode = AdmissionMode(_choice(table.get("mode", "open"), f"{path}.mode",
                                 tuple(m.value for m in AdmissionMode)))
    topics = table.get("topics") or []
    if not isinstance(topics, list):
        _fail(f"{path}.topics", "must be a list of topic patterns")
    if mode is AdmissionMode.OPEN and topics:
        _fail(f"{path}.topics", "patterns apply to mode: allowlist or denylist, not open")
    if mode is not AdmissionMode.OPEN and not topics:
        _fail(f"{path}.topics", f"mode: {mode.value} needs at least one topic pattern")
    patterns = []
    for i, text in enumerate(topics):
        try:
            patterns.append(TopicPattern.parse(text))
        except ValueError as error:
            _fail(f"{path}.topics[{i}]", str(error))
    max_destinations = _int(table.get("max_destinations", max_destinations_default),
                            f"{path}.max_destinations", 1, max_destinations_limit)
    return AdmissionConfig(mode=mode, patterns=tuple(patterns), max_destinations=max_destinations)


def _topic_defaults(raw: object, path: str) -> TopicDefaults:
    table = _mapping(raw, path)
    _known(table, path, ("partitions", "replication_factor", "configs"))
    partitions = replication = None
    if table.get("partitions") is not None:
        partitions = _int(table["partitions"], f"{path}.partitions", 1,
                          limits.partitions_per_topic_max)
    if table.get("replication_factor") is not None:
        replication = _int(table["replication_factor"], f"{path}.replication_factor", 1,
                           limits.replication_factor_max)
    configs = _mapping(table.get("configs") or {}, f"{path}.configs")
    pairs = []
    for key, value in configs.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, (str, int)):
            _fail(_join(f"{path}.configs", key), "a topic config value is a string or number")
        pairs.append((key, str(value)))
    return TopicDefaults(partitions=partitions, replication_factor=replication,
                         configs=tuple(pairs))


# --- sinks ------------------------------------------------------------------------------------


def _sink(name: str, raw: object, path: str) -> SinkConfig:
    table = _mapping(raw, path)
    _known(table, path, ("connector", "topics", "consumer_group", "config"))
    connector = _string(_required(table, "connector", path), f"{path}.connector")
    topics = _required(table, "topics", path)
    if not isinstance(topics, list) or not topics:
        _fail(f"{path}.topics", "must be a non-empty list of topics")
    group = table.get("consumer_group", f"connect-{name}")
    if group_id_error(group) is not None:
        _fail(f"{path}.consumer_group", f"{group!r} is not a legal group id")
    return SinkConfig(
        name=name, connector=connector,
        topics=tuple(_topic(topic, f"{path}.topics[{i}]") for i, topic in enumerate(topics)),
        consumer_group=group, config=_mapping(table.get("config") or {}, f"{path}.config"))
