"""Kafka bridge settings from a TOML file, checked as a whole before anything starts.

A typo, a missing field or a bad template stops start-up with one line that names the key;
nothing is silently ignored. ``[kafka]`` is handed to confluent-kafka as it is, except for
the few settings the bridge's delivery guarantee depends on (see ``_OWNED_KAFKA_KEYS``).

    [kafka]                        # passed through to confluent-kafka
    "bootstrap.servers" = "127.0.0.1:9092"
    "group.id" = "topiary-bridge"

    [source]
    topic = "beacons"              # the aggregate topic
    format = "json"                # json | msgpack
    dead_letter_topic = "beacons.dlq"

    [mapping]
    template = "beacon/{region}/{country}/{site}/{section}/{event}"

    [broker]
    server = "127.0.0.1:7474"      # a hot-spare pair: "10.0.0.1:7474,10.0.0.2:7474" (or a
                                   #   list): the bridge publishes to whichever is primary
    token = "secret"               # optional: the broker's [auth] token
    username = "bridge"            # optional: a user of the broker's users file, with
    password = "..."               #   its password (HELLO credentials of the publisher)
    observer_id = "bridge-1"       # optional: the bridge's id on the route exchange
    peer_secret = "bridge-secret"  # optional: its [[peering.observer]] secret at the broker
                                   #   (or the broker's shared [peering] secret)
    bridge_id = "beacons-eu"       # optional: its id in reports (default: "group.id")
    report_interval = 5.0          # seconds between reports to $SYS/bridges/<id> (0: never)
    tls = true                     # optional: speak TLS to server (the broker's native TLS
                                   #   port); implied by ca or cert
    ca = "ca.crt"                  # optional: the broker's certificate chains to it (else
                                   #   the system's CAs); it must name server's host
    cert = "bridge.crt"            # optional, with key: a client certificate (mutual TLS;
    key = "bridge.key"             #   an observer listed by cert at the broker)

    [bridge]                       # optional tuning
    batch_max = 5000               # records taken from Kafka per batch
    in_flight_max = 50000          # records published and not yet confirmed
    in_flight_bytes = 33554432     # their payload bytes
    backoff_max = 5.0              # longest wait between retries (broker, dead-letter topic)
    stats_interval = 10.0          # seconds between stats log lines (0: never)
    shutdown_timeout = 10.0        # seconds to wait for in-flight confirms on SIGTERM

    [http]                         # optional: the operators' port (docs/bridge.md)
    listen = "127.0.0.1:9474"      # /metrics, /healthz, /readyz; --http overrides it

    [spark]                        # `topiary bridge spark` only (docs/spark.md)
    master = "local[*]"
    checkpoint = "/var/lib/topiary/spark"   # required for the Spark bridge
    trigger = 1.0                  # seconds between micro-batches (0: back to back)
    max_offsets_per_trigger = 200000
    filter = "table"               # table | regex: how unwanted rows are dropped
    class_cache = "~/.cache/topiary/spark"  # the driver JVM's class archive ("": none)
    [spark.conf]                   # passed through to SparkSession.builder.config
    "spark.executor.memory" = "2g"
"""

from __future__ import annotations

import math
import os
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import routing
from bridges.mapping import TemplateError, TopicTemplate, encode_level
from broker.address import parse_host_port, parse_listen
from broker.config import ConfigError, read_toml
from broker.security.tls import client_context

FORMATS = ("json", "msgpack")
#: Where a bridge reports its figures: broker.core.reports.REPORTS_PREFIX, whose subscriber
#: keeps the last report of each bridge.
REPORTS_PREFIX = "$SYS/bridges/"

#: Settings the bridge sets itself because its guarantee rests on them: offsets are stored
#: only after the broker confirmed a record (or the dead-letter topic took it), and
#: librdkafka commits exactly those.
_OWNED_KAFKA_KEYS = {
    "enable.auto.offset.store": "the bridge stores offsets itself, after confirmation",
    "enable.auto.commit": "the bridge commits only confirmed offsets; it must stay on",
}

#: Defaults for [kafka] that the user may override.
KAFKA_DEFAULTS: dict[str, Any] = {
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 6000,
    "queued.max.messages.kbytes": 32768,  # bounds what librdkafka prefetches
    # ... and when that bound is hit, look again after 10 ms, not librdkafka's 1 s:
    # with the default the bridge stalled ~0.5 s each time (75k -> 106k+ events/s).
    "fetch.queue.backoff.ms": 10,
    "log.connection.close": False,  # idle connections closing is not news
}


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    batch_max: int = 5000
    in_flight_max: int = 50_000
    in_flight_bytes: int = 32 * 1024 * 1024
    backoff_max: float = 5.0
    stats_interval: float = 10.0
    shutdown_timeout: float = 10.0


SPARK_FILTERS = ("table", "regex")


@dataclass(frozen=True, slots=True)
class SparkSettings:
    master: str = "local[*]"
    checkpoint: str | None = None
    trigger: float = 1.0
    max_offsets_per_trigger: int = 200_000
    filter: str = "table"
    #: The driver JVM's class cache directory (bridges/spark/classcache.py); None: the
    #: default place, "": none.
    class_cache: str | None = None
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    kafka: dict[str, Any]
    topic: str
    dead_letter_topic: str
    template: TopicTemplate
    server: str
    format: str = "json"
    token: str | None = None
    #: HELLO credentials of the publishing connection (the broker's users file), both or none
    username: str | None = None
    password: str | None = None
    peer_secret: str | None = None
    observer_id: str = field(default_factory=lambda: default_observer_id())
    settings: BridgeSettings = field(default_factory=BridgeSettings)
    spark: SparkSettings = field(default_factory=SparkSettings)
    #: HOST:PORT of the operators' HTTP port (/metrics, /healthz); None: off.
    http_listen: str | None = None
    #: Seconds between reports to the broker (docs/bridge.md); 0: none.
    report_interval: float = 5.0
    #: The id the bridge reports under; None: its Kafka ``group.id``.
    bridge_id: str | None = None
    #: TLS to the broker, for the publisher and the route watcher alike: ``tls`` on (set,
    #: or implied by ``ca`` or ``cert``), the CA to verify the broker with (None: the
    #: system's), a client certificate and its key (None: none).
    tls: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def report_id(self) -> str:
        """The id the bridge reports under."""
        return self.bridge_id if self.bridge_id is not None else str(self.kafka["group.id"])

    @property
    def report_topic(self) -> str:
        """``$SYS/bridges/<id>``, the id escaped into one topic level."""
        return f"{REPORTS_PREFIX}{encode_level(self.report_id)}"

    def credentials(self) -> dict[str, Any] | None:
        """The HELLO credentials of the bridge's publishing connection (None: none)."""
        return hello_credentials(self.token, self.username, self.password)

    def tls_context(self) -> ssl.SSLContext | None:
        """A fresh client context from the ``[broker]`` TLS settings (None: plain TCP)."""
        return broker_tls_context(self.tls, self.ca, self.cert, self.key)

    def consumer_config(self) -> dict[str, Any]:
        return {
            **KAFKA_DEFAULTS,
            **self.kafka,
            "enable.auto.offset.store": False,
            "enable.auto.commit": True,
        }

    def producer_config(self) -> dict[str, Any]:
        """The dead-letter producer: [kafka] without the consumer-only settings."""
        config = {k: v for k, v in self.kafka.items() if not consumer_only(k)}
        return {"acks": "all", "log.connection.close": False, **config}


_CONSUMER_ONLY_PREFIXES = (
    "group.",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "auto.offset.reset",
    "auto.commit.",
    "enable.auto.",
    "max.poll.interval.ms",
    "partition.assignment.strategy",
    "fetch.",
    "queued.",
    "isolation.level",
    "enable.partition.eof",
    "check.crcs",
    "consume.",
    "coordinator.",
)


def consumer_only(key: str) -> bool:
    return key.startswith(_CONSUMER_ONLY_PREFIXES)


def hello_credentials(
    token: str | None, username: str | None, password: str | None
) -> dict[str, Any] | None:
    """HELLO ``credentials`` from the ``[broker]`` settings: the token and/or the user name
    and password (the Spark sink, which gets its options as strings, uses it too)."""
    credentials: dict[str, Any] = {}
    if token:
        credentials["token"] = token
    if username is not None and password is not None:
        credentials["username"] = username
        credentials["password"] = password
    return credentials or None


def broker_tls_context(
    tls: bool, ca: str | None, cert: str | None, key: str | None
) -> ssl.SSLContext | None:
    """The one place a bridge's context for the broker is made (the Kafka bridge, the Spark
    driver's route feed, and each Spark task from the sink's options, since executors are
    other processes): TLS 1.2 or later, the broker's certificate verified against ``ca``
    (else the system's CAs) and checked for the host dialled, ``cert``/``key`` presented.
    None when ``tls`` is off. A file that cannot be used raises ``ConfigError`` naming it
    (``[broker] ca FILE: ...``)."""
    if not tls:
        return None
    return client_context(ca, cert, key, what="[broker]")


def default_observer_id() -> str:
    return f"bridge-{socket.gethostname()}-{os.getpid()}"


_TABLES: dict[str, dict[str, tuple[type, ...]]] = {
    "source": {"topic": (str,), "format": (str,), "dead_letter_topic": (str,)},
    "mapping": {"template": (str,)},
    "broker": {
        "server": (str, list),  # a list: a hot-spare pair, as "A,B"
        "token": (str,),
        "username": (str,),
        "password": (str,),
        "peer_secret": (str,),
        "observer_id": (str,),
        "bridge_id": (str,),
        "report_interval": (int, float),
        "tls": (bool,),
        "ca": (str,),
        "cert": (str,),
        "key": (str,),
    },
    "bridge": {
        "batch_max": (int,),
        "in_flight_max": (int,),
        "in_flight_bytes": (int,),
        "backoff_max": (int, float),
        "stats_interval": (int, float),
        "shutdown_timeout": (int, float),
    },
    "spark": {
        "master": (str,),
        "checkpoint": (str,),
        "trigger": (int, float),
        "max_offsets_per_trigger": (int,),
        "filter": (str,),
        "class_cache": (str,),
        "conf": (dict,),
    },
    "http": {"listen": (str,)},
}
_REQUIRED = {
    "kafka": ("bootstrap.servers", "group.id"),
    "source": ("topic", "dead_letter_topic"),
    "mapping": ("template",),
    "broker": ("server",),
}


def load_bridge_config(path: str | Path) -> BridgeConfig:
    """Read and check a bridge config file; raises ConfigError naming the key at fault."""
    document = read_toml(path)
    try:
        return bridge_config_from_dict(document)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def bridge_config_from_dict(document: dict[str, Any]) -> BridgeConfig:
    known = ("kafka", *_TABLES)
    for table, body in document.items():
        if table not in known:
            names = ", ".join(f"[{t}]" for t in known)
            raise ConfigError(f"unknown table [{table}] (known: {names})")
        if not isinstance(body, dict):
            raise ConfigError(f"[{table}] must be a table, got {type(body).__name__}")
    for table, keys in _REQUIRED.items():
        body = document.get(table)
        if body is None:
            raise ConfigError(f"missing table [{table}]")
        for key in keys:
            if key not in body:
                raise ConfigError(f"[{table}] is missing {key!r}")
    for table, types in _TABLES.items():
        for key, value in document.get(table, {}).items():
            wanted = types.get(key)
            if wanted is None:
                raise ConfigError(f"[{table}] has unknown key {key!r} (known: {', '.join(types)})")
            if (isinstance(value, bool) and bool not in wanted) or not isinstance(value, wanted):
                names = " or ".join(t.__name__ for t in wanted)
                raise ConfigError(
                    f"[{table}] {key} must be {names}, got {type(value).__name__} {value!r}"
                )
    kafka = _check_kafka(document["kafka"])
    source, broker = document["source"], {**document["broker"]}
    if isinstance(broker["server"], list):  # held as the client's "A,B"
        if not all(isinstance(entry, str) and entry for entry in broker["server"]):
            raise ConfigError(
                f"[broker] server must list HOST:PORT strings, got {broker['server']!r}"
            )
        broker["server"] = ",".join(broker["server"])
    _check_nonempty("source", source, ("topic", "dead_letter_topic", "format"))
    _check_nonempty(
        "broker", broker, ("server", "observer_id", "bridge_id", "username", "ca", "cert", "key")
    )
    if ("username" in broker) != ("password" in broker):
        raise ConfigError("[broker] username and password go together: give both or neither")
    tls = _check_tls(broker)
    fmt = source.get("format", "json")
    if fmt not in FORMATS:
        raise ConfigError(f"[source] format must be 'json' or 'msgpack', got {fmt!r}")
    if source["dead_letter_topic"] == source["topic"]:
        raise ConfigError("[source] dead_letter_topic must differ from topic")
    try:  # a hot-spare pair: "A,B" (or a list), tried in turn for the primary
        parse_broker_servers(broker["server"])
    except ValueError as exc:
        raise ConfigError(f'[broker] server must be HOST:PORT, or a pair\'s "A,B": {exc}') from None
    try:
        template = TopicTemplate.compile(document["mapping"]["template"])
    except TemplateError as exc:
        raise ConfigError(f"[mapping] template: {exc}") from None
    settings = _check_settings(document.get("bridge", {}))
    spark = _check_spark(document.get("spark", {}))
    listen = document.get("http", {}).get("listen")
    if listen is not None and parse_listen(listen) is None:
        raise ConfigError(f"[http] listen must be HOST:PORT, got {listen!r}")
    interval = broker.get("report_interval", 5.0)
    if not (math.isfinite(interval) and 0 <= interval <= 86400):
        raise ConfigError(f"[broker] report_interval must be in [0, 86400] seconds, got {interval}")
    extra: dict[str, Any] = {}
    if "observer_id" in broker:
        extra["observer_id"] = broker["observer_id"]
    config = BridgeConfig(
        kafka=kafka,
        topic=source["topic"],
        dead_letter_topic=source["dead_letter_topic"],
        format=fmt,
        template=template,
        server=broker["server"],
        token=broker.get("token"),
        username=broker.get("username"),
        password=broker.get("password"),
        peer_secret=broker.get("peer_secret"),
        settings=settings,
        spark=spark,
        http_listen=listen,
        report_interval=float(interval),
        bridge_id=broker.get("bridge_id"),
        tls=tls,
        ca=broker.get("ca"),
        cert=broker.get("cert"),
        key=broker.get("key"),
        **extra,
    )
    config.tls_context()  # the files are read now: a bad one stops start-up, named
    try:
        routing.validate_topic(config.report_topic)
    except ValueError as exc:  # routing.TopicError included
        raise ConfigError(f"[broker] bridge_id (or [kafka] 'group.id'): {exc}") from None
    return config


def _check_tls(broker: dict[str, Any]) -> bool:
    """Whether the bridge speaks TLS to the broker: ``tls``, or implied by ``ca`` or
    ``cert`` (as ``--ca`` implies ``--tls`` for the client commands)."""
    if ("cert" in broker) != ("key" in broker):
        raise ConfigError("[broker] cert and key go together: give both or neither")
    files = [name for name in ("ca", "cert") if name in broker]
    if broker.get("tls") is False and files:
        raise ConfigError(f"[broker] {files[0]} is for TLS, but tls = false")
    return bool(broker.get("tls", bool(files)))


def _check_kafka(body: dict[str, Any]) -> dict[str, Any]:
    for key, value in body.items():
        if key in _OWNED_KAFKA_KEYS:
            raise ConfigError(f"[kafka] {key!r} cannot be set: {_OWNED_KAFKA_KEYS[key]}")
        if isinstance(value, dict | list):
            raise ConfigError(
                f"[kafka] {key!r} must be a string, number or boolean, got {type(value).__name__}"
            )
    for key in ("bootstrap.servers", "group.id"):
        if not isinstance(body[key], str) or not body[key]:
            raise ConfigError(f"[kafka] {key!r} must be a non-empty string")
    return dict(body)


def _check_nonempty(table: str, body: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in body and not body[key].strip():
            raise ConfigError(f"[{table}] {key} must not be empty")


def _check_settings(body: dict[str, Any]) -> BridgeSettings:
    settings = BridgeSettings(**body)
    for name in ("batch_max", "in_flight_max", "in_flight_bytes"):
        if getattr(settings, name) < 1:
            raise ConfigError(f"[bridge] {name} must be at least 1, got {getattr(settings, name)}")
    if settings.in_flight_max < settings.batch_max:
        raise ConfigError(
            f"[bridge] in_flight_max ({settings.in_flight_max}) must be at least batch_max "
            f"({settings.batch_max})"
        )
    for name in ("backoff_max", "shutdown_timeout"):
        value = getattr(settings, name)
        if not (math.isfinite(value) and 0 < value <= 86400):
            raise ConfigError(f"[bridge] {name} must be in (0, 86400] seconds, got {value}")
    if not (math.isfinite(settings.stats_interval) and 0 <= settings.stats_interval <= 86400):
        raise ConfigError(
            f"[bridge] stats_interval must be in [0, 86400] seconds, got {settings.stats_interval}"
        )
    return settings


def _check_spark(body: dict[str, Any]) -> SparkSettings:
    conf = body.get("conf", {})
    for key, value in conf.items():
        if isinstance(value, dict | list):
            raise ConfigError(f"[spark.conf] {key!r} must be a string, number or boolean")
    settings = SparkSettings(**{**body, "conf": {k: str(v) for k, v in conf.items()}})
    if not settings.master.strip():
        raise ConfigError("[spark] master must not be empty")
    if settings.checkpoint is not None and not settings.checkpoint.strip():
        raise ConfigError("[spark] checkpoint must not be empty")
    if not (math.isfinite(settings.trigger) and 0 <= settings.trigger <= 86400):
        raise ConfigError(f"[spark] trigger must be in [0, 86400] seconds, got {settings.trigger}")
    if settings.max_offsets_per_trigger < 1:
        raise ConfigError(
            f"[spark] max_offsets_per_trigger must be at least 1, "
            f"got {settings.max_offsets_per_trigger}"
        )
    if settings.filter not in SPARK_FILTERS:
        raise ConfigError(f"[spark] filter must be 'table' or 'regex', got {settings.filter!r}")
    return settings


def parse_broker_servers(server: str) -> list[tuple[str, int]]:
    """The bridge's ``[broker] server``: one ``HOST:PORT`` or several separated by commas
    (the two brokers of a hot-spare pair), each with its port. Raises ValueError naming
    the entry at fault."""
    entries = server.split(",")
    addresses: list[tuple[str, int]] = []
    for number, entry in enumerate(entries, 1):
        where = f"server {number} of {server!r}" if len(entries) > 1 else f"server {server!r}"
        address = parse_host_port(entry)
        if address is None:
            raise ValueError(f"{where} must be HOST:PORT")
        if address in addresses:
            raise ValueError(f"{where} is listed twice")
        addresses.append(address)
    return addresses
