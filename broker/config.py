"""Broker settings: defaults, a TOML file, and command-line overrides.

A config file is checked as a whole before the broker starts: an unknown key,
a wrong type or an out-of-range value stops start-up with one line naming the
key, never a traceback and never a silently ignored typo.

    [server]
    host = "127.0.0.1"
    port = 7474
    data_dir = "/var/lib/topiary"
    log_format = "json"            # console | json
    server_id = "broker-a"         # an [ha] pair: the same on both (unset: derived, ha/pairid.py)

    [limits]
    max_frame = 1048576            # bytes per frame, checked before buffering
    max_payload = 1000000          # bytes per PUB payload
    keepalive = 30.0               # seconds of silence before PING; 1.5x closes
    outbound_messages = 10000      # per connection: past this, messages are dropped
    outbound_bytes = 16777216      # per connection, payload bytes queued
    slow_consumer_drops = 10000    # drops in a row before the client is disconnected
    shutdown_timeout = 5.0         # seconds to flush clients on SIGTERM
    match_cache = 16384            # topics whose match results are cached (0: off)
    dedup_window = 100000          # recent publisher msg_ids remembered to drop repeats (0: off)
    turn_frames = 64               # a connection's frames handled before it checks its turn
    turn_time = 0.0005             # seconds of work after which a busy connection yields
    max_connections = 0            # client connections at once, all front ends (0: no limit)
    connection_rate = 0.0          # new connections per second, token bucket (0: no limit)
    connection_burst = 0           # connections past the rate at once (0: one second's worth)
    publish_rate = 0.0             # per connection: PUBs per second, token bucket (0: no limit)
    publish_burst = 0              # PUBs past the rate at once (0: one second's worth)
    max_subscriptions = 100000     # per client (0: no limit)

    [sessions]                     # durable sessions (need data_dir)
    max_messages = 1000000         # pending (unacked) messages per session
    max_bytes = 1073741824         # pending payload bytes per session
    overflow = "drop-oldest"       # or "reject-publish"
    group_prefetch = 64            # unacked messages a shared-group member may hold

    [auth]                         # docs/security.md
    token = "secret"               # HELLO credentials {"token": ...} must match; or instead:
    # users = "users.toml"         # users and password hashes, written by `topiary passwd`
    # anonymous = false            # clients without credentials (default: only without users)
    failure_delay = 1.0            # seconds a failed login waits for its refusal

    [acl]                          # topic ACLs (docs/security.md); off unless set
    file = "acl.toml"              # [[rule]] who/allow/deny/filter/dialect; SIGHUP reloads

    [http]                         # operators' port (docs/operations.md); off unless set
    listen = "127.0.0.1:7480"      # /metrics, /healthz, /readyz, /api/stats, the dashboard
    top_sessions = 20              # /metrics: sessions by lag with their own series; + "other"
    request_timeout = 10.0         # seconds a request (or an idle keep-alive) may take

    [mqtt]                         # MQTT 3.1.1 and 5.0 (docs/mqtt.md); off unless set
    listen = "127.0.0.1:1883"      # MQTT over TCP
    websocket = "127.0.0.1:8083"   # MQTT over WebSocket, path /mqtt, subprotocol mqtt

    [peering]                      # peer brokers (docs/peering.md); server_id is the broker id
    peers = ["10.0.0.2:7474"]      # brokers to dial ("A,B": a hot-spare pair, in turn); links
                                   #   are also accepted from any broker
    secret = "mesh-secret"         # PEER_HELLO must carry it (both ends set the same)
    hop_limit = 16                 # links a forwarded event may cross
    sync_timeout = 5.0             # seconds a `sync` SUB waits for every broker's ack
    keepalive = 2.0                # seconds of link silence before PING; 3x closes
    flush = 0.01                   # seconds local route changes are coalesced into one update
    backoff_max = 5.0              # longest wait between dial attempts
    queue_messages = 100000        # per link: events queued past this are dropped, counted
    queue_bytes = 67108864         # per link, payload bytes queued
    ca = "ca.crt"                  # tls:// peers: verify their certificate (else system CAs)
    cert = "peer.crt"              # tls:// peers: our client certificate (mutual TLS)
    key = "peer.key"

    # Trusted peers (docs/security.md) instead of peers + secret: once a peer is listed,
    # only listed brokers and observers may link, each with its own credentials.
    [[peering.peer]]
    id = "b"                       # its broker id
    address = "10.0.0.2:7474"      # optional: dial it
    secret = "pair-secret"         # it presents this, and so do we when dialling it
    cert = "CN=b"                  # optional: the subject its TLS client certificate must have
    [[peering.observer]]           # a trusted observer (the Kafka bridge's route watcher)
    id = "bridge-1"
    secret = "bridge-secret"

    [tls]                          # TLS listeners (docs/security.md); off unless a listen_* is set
    cert = "server.crt"            # PEM, with any intermediates after it
    key = "server.key"             # PEM, unencrypted
    client_ca = "ca.crt"           # verify client certificates against this CA
    require_client_cert = false    # true: no handshake without a verified client certificate
    listen_native = "127.0.0.1:7443"      # native protocol (and peer links) over TLS
    listen_mqtt = "127.0.0.1:8883"        # MQTT over TLS
    listen_websocket = "127.0.0.1:8443"   # MQTT over secure WebSocket (wss)
    listen_http = "127.0.0.1:7481"        # the operators' HTTP port over TLS (https)

    [ha]                           # hot spare (docs/ha.md)
    role = "primary"               # or "standby": the role at first start
    partner = "10.0.0.2:7474"      # the other broker of the pair
    witness = "10.0.0.3:7480"      # `topiary witness --port 7480`
    secret = "pair-secret"         # the pair and the witness share it
    sync = true                    # PUBACK only once the standby has the message on disk
    lease = 1.0                    # seconds the witness' lease lasts (renewed every lease/3)
    failure_timeout = 0.6          # seconds of silence before the standby asks for a vote
    link_port = 7475               # the replication link (default: server port + 1)
    partner_link_port = 7475       # the partner's link (default: link_port, else its port + 1)
    failover = "witness"           # (default) or "manual": SIGUSR1 promotes the standby
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.address import DEFAULT_PORT, parse_host_port, parse_listen, parse_peer_addresses
from broker.ha.pairid import pair_id
from broker.ha.timing import DEFAULT_FAILURE_TIMEOUT, DEFAULT_LEASE, Timing
from broker.trust import BROKER, OBSERVER, TrustedPeer, parse_entries
from broker.wire.buffer import DEFAULT_MAX_FRAME, MAX_LENGTH

#: The most durable sessions /metrics gives series of their own (label cardinality).
MAX_TOP_SESSIONS = 1000


class ConfigError(ValueError):
    """A bad setting; the message names the key and says what is wrong."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    data_dir: str | None = None
    log_format: str = "console"
    server_id: str = field(default="")
    max_frame: int = DEFAULT_MAX_FRAME
    max_payload: int = 1_000_000
    keepalive: float = 30.0
    outbound_messages: int = 10_000
    outbound_bytes: int = 16 * 1024 * 1024
    slow_consumer_drops: int = 10_000
    shutdown_timeout: float = 5.0
    hello_timeout: float = 10.0
    match_cache: int = 16_384
    dedup_window: int = 100_000
    # Fair service: a connection handles at most turn_frames frames between looks at the
    # clock, and yields to the others once its turn has lasted turn_time seconds.
    turn_frames: int = 64
    turn_time: float = 0.0005
    session_max_messages: int = 1_000_000
    session_max_bytes: int = 1 << 30
    overflow: str = "drop-oldest"
    group_prefetch: int = 64
    auth_token: str | None = None
    auth_users: str | None = None  # the users file (broker/security/users.py); None: none
    auth_anonymous: bool | None = None  # None: anonymous access only without a users file
    auth_failure_delay: float = 1.0  # seconds before a failed login is refused
    acl_file: str | None = None  # the topic ACL file (broker/security/acl_file.py); None: off
    http_listen: str | None = None  # HOST:PORT of the operators' HTTP port; None: off
    http_top_sessions: int = 20  # durable sessions with their own /metrics series, by lag
    http_request_timeout: float = 10.0  # seconds per request on it, and per idle keep-alive
    mqtt_listen: str | None = None  # HOST:PORT for MQTT over TCP; None: off
    mqtt_websocket: str | None = None  # HOST:PORT for MQTT over WebSocket; None: off
    peers: tuple[str, ...] = ()
    peer_secret: str | None = None
    hop_limit: int = 16
    sync_timeout: float = 5.0
    peer_keepalive: float = 2.0
    peer_flush: float = 0.01
    peer_backoff_max: float = 5.0
    peer_queue_messages: int = 100_000
    peer_queue_bytes: int = 64 * 1024 * 1024
    # Trusted peers (broker/trust.py): [[peering.peer]] and [[peering.observer]]
    trusted_peers: tuple[TrustedPeer, ...] = ()
    trusted_observers: tuple[TrustedPeer, ...] = ()
    # Limits against floods (broker/security/floods.py); 0: no limit
    max_connections: int = 0
    connection_rate: float = 0.0
    connection_burst: int = 0
    publish_rate: float = 0.0
    publish_burst: int = 0
    max_subscriptions: int = 100_000
    peer_ca: str | None = None  # CA that tls:// peers' certificates must chain to
    peer_cert: str | None = None  # our client certificate on tls:// peer links
    peer_key: str | None = None
    tls_cert: str | None = None  # PEM files for every TLS listener
    tls_key: str | None = None
    tls_client_ca: str | None = None  # verify client certificates against this CA
    tls_require_client_cert: bool = False
    tls_listen_native: str | None = None  # HOST:PORT for each protocol over TLS; None: off
    tls_listen_mqtt: str | None = None
    tls_listen_websocket: str | None = None
    tls_listen_http: str | None = None
    # Hot spare (broker/ha, docs/ha.md); any of them set means [ha] is configured
    ha_role: str | None = None
    ha_partner: str | None = None
    ha_witness: str | None = None
    ha_secret: str | None = None
    ha_sync: bool = True
    ha_lease: float = DEFAULT_LEASE
    ha_failure_timeout: float = DEFAULT_FAILURE_TIMEOUT
    ha_link_port: int | None = None  # the replication link's port; None: server port + 1
    ha_partner_link_port: int | None = None  # the partner's; None: as ha_partner_link says
    ha_failover: str = "witness"  # or "manual": promotion by the operator (docs/ha.md)
    # Mutual TLS on the replication link and to the witness (broker/ha/tls.py); all or none
    ha_ca: str | None = None
    ha_cert: str | None = None
    ha_key: str | None = None

    @property
    def ha_link(self) -> int:
        """The replication link's port: ``[ha] link_port``, else the server port + 1."""
        return self.ha_link_port if self.ha_link_port is not None else self.port + 1

    @property
    def ha_partner_link(self) -> int:
        """The port the standby dials on the partner: ``partner_link_port`` when set, else
        ``link_port`` when set (the pair shares it), else the partner's server port + 1 (as
        the partner's own default)."""
        if self.ha_partner_link_port is not None:
            return self.ha_partner_link_port
        if self.ha_link_port is not None:
            return self.ha_link_port
        partner = parse_host_port(self.ha_partner or "")
        return (partner[1] if partner is not None else self.port) + 1

    @property
    def ha_tls(self) -> bool:
        """Whether the replication link and the calls to the witness are over TLS."""
        return self.ha_cert is not None

    @property
    def broker_id(self) -> str | None:
        """The id this broker presents to clients, peers and observers: ``server_id``; with
        [ha] and no ``server_id``, the pair's id (``broker/ha/pairid.py``: both brokers of
        a pair present one id); None: none chosen (the broker takes ``topiary-PID``)."""
        if self.server_id:
            return self.server_id
        if self.ha_configured and self.ha_secret:
            return pair_id(self.ha_secret)
        return None

    @property
    def ha_configured(self) -> bool:
        """True when any [ha] key is set (then all of role, partner, witness, secret are)."""
        return any(getattr(self, name) != default for name, default in _HA_DEFAULTS.items())

    def __post_init__(self) -> None:
        _check(self)

    def replace(self, **changes: Any) -> BrokerConfig:
        return dataclasses.replace(self, **changes)


# TOML table -> key -> config field
_FILE_KEYS: dict[str, dict[str, str]] = {
    "server": {
        "host": "host",
        "port": "port",
        "data_dir": "data_dir",
        "log_format": "log_format",
        "server_id": "server_id",
    },
    "limits": {
        "max_frame": "max_frame",
        "max_payload": "max_payload",
        "keepalive": "keepalive",
        "outbound_messages": "outbound_messages",
        "outbound_bytes": "outbound_bytes",
        "slow_consumer_drops": "slow_consumer_drops",
        "shutdown_timeout": "shutdown_timeout",
        "hello_timeout": "hello_timeout",
        "match_cache": "match_cache",
        "dedup_window": "dedup_window",
        "turn_frames": "turn_frames",
        "turn_time": "turn_time",
        "max_connections": "max_connections",
        "connection_rate": "connection_rate",
        "connection_burst": "connection_burst",
        "publish_rate": "publish_rate",
        "publish_burst": "publish_burst",
        "max_subscriptions": "max_subscriptions",
    },
    "sessions": {
        "max_messages": "session_max_messages",
        "max_bytes": "session_max_bytes",
        "overflow": "overflow",
        "group_prefetch": "group_prefetch",
    },
    "auth": {
        "token": "auth_token",
        "users": "auth_users",
        "anonymous": "auth_anonymous",
        "failure_delay": "auth_failure_delay",
    },
    "acl": {"file": "acl_file"},
    "http": {
        "listen": "http_listen",
        "top_sessions": "http_top_sessions",
        "request_timeout": "http_request_timeout",
    },
    "mqtt": {"listen": "mqtt_listen", "websocket": "mqtt_websocket"},
    "peering": {
        "peers": "peers",
        "secret": "peer_secret",
        "hop_limit": "hop_limit",
        "sync_timeout": "sync_timeout",
        "keepalive": "peer_keepalive",
        "flush": "peer_flush",
        "backoff_max": "peer_backoff_max",
        "queue_messages": "peer_queue_messages",
        "queue_bytes": "peer_queue_bytes",
        "peer": "trusted_peers",
        "observer": "trusted_observers",
        "ca": "peer_ca",
        "cert": "peer_cert",
        "key": "peer_key",
    },
    "tls": {
        "cert": "tls_cert",
        "key": "tls_key",
        "client_ca": "tls_client_ca",
        "require_client_cert": "tls_require_client_cert",
        "listen_native": "tls_listen_native",
        "listen_mqtt": "tls_listen_mqtt",
        "listen_websocket": "tls_listen_websocket",
        "listen_http": "tls_listen_http",
    },
    "ha": {
        "role": "ha_role",
        "partner": "ha_partner",
        "witness": "ha_witness",
        "secret": "ha_secret",
        "sync": "ha_sync",
        "lease": "ha_lease",
        "failure_timeout": "ha_failure_timeout",
        "link_port": "ha_link_port",
        "partner_link_port": "ha_partner_link_port",
        "failover": "ha_failover",
        "ca": "ha_ca",
        "cert": "ha_cert",
        "key": "ha_key",
    },
}

_HA_DEFAULTS: dict[str, Any] = {
    "ha_role": None,
    "ha_partner": None,
    "ha_witness": None,
    "ha_secret": None,
    "ha_sync": True,
    "ha_lease": DEFAULT_LEASE,
    "ha_failure_timeout": DEFAULT_FAILURE_TIMEOUT,
    "ha_link_port": None,
    "ha_partner_link_port": None,
    "ha_failover": "witness",
    "ha_ca": None,
    "ha_cert": None,
    "ha_key": None,
}
#: The roles a broker of a pair may have at its first start.
HA_ROLES = ("primary", "standby")
HA_FAILOVERS = ("witness", "manual")
#: [ha] keys that turn TLS on for the replication link and the witness (all three or none).
HA_TLS_KEYS = ("ca", "cert", "key")

_TYPES: dict[str, tuple[type, ...]] = {
    "host": (str,),
    "port": (int,),
    "data_dir": (str, type(None)),
    "log_format": (str,),
    "server_id": (str,),
    "max_frame": (int,),
    "max_payload": (int,),
    "keepalive": (int, float),
    "outbound_messages": (int,),
    "outbound_bytes": (int,),
    "slow_consumer_drops": (int,),
    "shutdown_timeout": (int, float),
    "hello_timeout": (int, float),
    "match_cache": (int,),
    "dedup_window": (int,),
    "turn_frames": (int,),
    "turn_time": (int, float),
    "session_max_messages": (int,),
    "session_max_bytes": (int,),
    "overflow": (str,),
    "group_prefetch": (int,),
    "auth_token": (str, type(None)),
    "auth_users": (str, type(None)),
    "auth_failure_delay": (int, float),
    "acl_file": (str, type(None)),
    "http_listen": (str, type(None)),
    "http_top_sessions": (int,),
    "http_request_timeout": (int, float),
    "mqtt_listen": (str, type(None)),
    "mqtt_websocket": (str, type(None)),
    "peers": (tuple,),
    "peer_secret": (str, type(None)),
    "hop_limit": (int,),
    "sync_timeout": (int, float),
    "peer_keepalive": (int, float),
    "peer_flush": (int, float),
    "peer_backoff_max": (int, float),
    "peer_queue_messages": (int,),
    "peer_queue_bytes": (int,),
    "trusted_peers": (tuple,),
    "trusted_observers": (tuple,),
    "max_connections": (int,),
    "connection_rate": (int, float),
    "connection_burst": (int,),
    "publish_rate": (int, float),
    "publish_burst": (int,),
    "max_subscriptions": (int,),
    "peer_ca": (str, type(None)),
    "peer_cert": (str, type(None)),
    "peer_key": (str, type(None)),
    "tls_cert": (str, type(None)),
    "tls_key": (str, type(None)),
    "tls_client_ca": (str, type(None)),
    "tls_require_client_cert": (bool,),
    "tls_listen_native": (str, type(None)),
    "tls_listen_mqtt": (str, type(None)),
    "tls_listen_websocket": (str, type(None)),
    "tls_listen_http": (str, type(None)),
    "ha_role": (str, type(None)),
    "ha_partner": (str, type(None)),
    "ha_witness": (str, type(None)),
    "ha_secret": (str, type(None)),
    "ha_sync": (bool,),
    "ha_lease": (int, float),
    "ha_failure_timeout": (int, float),
    "ha_link_port": (int, type(None)),
    "ha_partner_link_port": (int, type(None)),
    "ha_failover": (str,),
    "ha_ca": (str, type(None)),
    "ha_cert": (str, type(None)),
    "ha_key": (str, type(None)),
}


def _check(cfg: BrokerConfig) -> None:
    for name, types in _TYPES.items():
        value = getattr(cfg, name)
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            wanted = " or ".join("none" if t is type(None) else t.__name__ for t in types)
            raise ConfigError(f"{name} must be {wanted}, got {type(value).__name__} {value!r}")
    if not 0 <= cfg.port <= 65535:
        raise ConfigError(f"port must be in 0..65535, got {cfg.port}")
    if cfg.log_format not in ("console", "json"):
        raise ConfigError(f"log_format must be 'console' or 'json', got {cfg.log_format!r}")
    if not 64 <= cfg.max_frame <= MAX_LENGTH:
        raise ConfigError(f"max_frame must be in 64..{MAX_LENGTH}, got {cfg.max_frame}")
    if not 0 < cfg.max_payload <= cfg.max_frame - 512:
        raise ConfigError(
            f"max_payload must be in 1..max_frame-512 ({cfg.max_frame - 512}) so that a MSG "
            f"carrying it fits in a frame, got {cfg.max_payload}"
        )
    for name in ("keepalive", "shutdown_timeout", "hello_timeout", "http_request_timeout"):
        if not 0 < getattr(cfg, name) <= 86400:
            raise ConfigError(f"{name} must be in (0, 86400] seconds, got {getattr(cfg, name)}")
    if cfg.overflow not in ("drop-oldest", "reject-publish"):
        raise ConfigError(
            f"overflow must be 'drop-oldest' or 'reject-publish', got {cfg.overflow!r}"
        )
    for name in ("session_max_messages", "session_max_bytes", "group_prefetch"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.dedup_window < 0:
        raise ConfigError(f"dedup_window must be >= 0 (0 turns it off), got {cfg.dedup_window}")
    if cfg.match_cache < 0:
        raise ConfigError(f"match_cache must be >= 0 (0 turns it off), got {cfg.match_cache}")
    if not 1 <= cfg.turn_frames <= 100_000:
        raise ConfigError(f"turn_frames must be in 1..100000, got {cfg.turn_frames}")
    if not 0 < cfg.turn_time <= 1:
        raise ConfigError(f"turn_time must be in (0, 1] seconds, got {cfg.turn_time}")
    for name in ("outbound_messages", "outbound_bytes", "slow_consumer_drops"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    _check_peering(cfg)
    _check_auth(cfg)
    _check_trusted(cfg)
    _check_flood_limits(cfg)
    _check_tls(cfg)
    _check_ha(cfg)
    if cfg.http_listen is not None and parse_listen(cfg.http_listen) is None:
        raise ConfigError(f"http listen must be HOST:PORT, got {cfg.http_listen!r}")
    for name, what in (("mqtt_listen", "mqtt listen"), ("mqtt_websocket", "mqtt websocket")):
        value = getattr(cfg, name)
        if value is not None and parse_listen(value) is None:
            raise ConfigError(f"{what} must be HOST:PORT, got {value!r}")
    if not 0 <= cfg.http_top_sessions <= MAX_TOP_SESSIONS:
        raise ConfigError(
            f"http top_sessions must be in 0..{MAX_TOP_SESSIONS}, got {cfg.http_top_sessions}"
        )


def _check_peering(cfg: BrokerConfig) -> None:
    for peer in cfg.peers:
        if not isinstance(peer, str):
            raise ConfigError(f"peers must be HOST:PORT or tls://HOST:PORT strings, got {peer!r}")
        try:
            parse_peer_addresses(peer)  # a pair's two brokers: "A,B"
        except ValueError as exc:
            raise ConfigError(
                f'peers must be HOST:PORT or tls://HOST:PORT strings (a pair: "A,B"), '
                f"got {peer!r}: {exc}"
            ) from None
    if (cfg.peer_cert is None) != (cfg.peer_key is None):
        raise ConfigError("peering cert and key go together: set both or neither")
    if not 1 <= cfg.hop_limit <= 255:
        raise ConfigError(f"hop_limit must be in 1..255, got {cfg.hop_limit}")
    for name in ("sync_timeout", "peer_keepalive", "peer_backoff_max"):
        if not 0 < getattr(cfg, name) <= 86400:
            raise ConfigError(f"{name} must be in (0, 86400] seconds, got {getattr(cfg, name)}")
    if not 0 <= cfg.peer_flush <= 10:
        raise ConfigError(f"peer_flush must be in [0, 10] seconds, got {cfg.peer_flush}")
    for name in ("peer_queue_messages", "peer_queue_bytes"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}")
    if cfg.server_id and not _valid_broker_id(cfg.server_id):
        raise ConfigError(
            f"server_id must be 1..256 bytes without spaces or control characters, "
            f"got {cfg.server_id!r}"
        )


def _check_auth(cfg: BrokerConfig) -> None:
    if cfg.auth_anonymous is not None and not isinstance(cfg.auth_anonymous, bool):
        raise ConfigError(f"auth anonymous must be true or false, got {cfg.auth_anonymous!r}")
    if not 0 <= cfg.auth_failure_delay <= 60:
        raise ConfigError(
            f"auth failure_delay must be in [0, 60] seconds, got {cfg.auth_failure_delay}"
        )
    if cfg.auth_token is not None and cfg.auth_users is not None:
        raise ConfigError(
            "auth token and auth users cannot both be set: the token is one shared secret "
            "for everyone, the users file gives each client its own"
        )
    if cfg.auth_users is not None and not cfg.auth_users:
        raise ConfigError("auth users must name a file, got an empty string")


def _check_trusted(cfg: BrokerConfig) -> None:
    """[[peering.peer]] and [[peering.observer]]: valid ids, each once, and not mixed with
    the open mesh's shared settings (broker/trust.py says why)."""
    seen: set[str] = set()
    for table, entries, role in (
        ("peer", cfg.trusted_peers, BROKER),
        ("observer", cfg.trusted_observers, OBSERVER),
    ):
        for entry in entries:
            if not isinstance(entry, TrustedPeer) or entry.role != role:
                raise ConfigError(f"[[peering.{table}]] entries must be {role} entries")
            if not _valid_broker_id(entry.id):
                raise ConfigError(
                    f"[[peering.{table}]] id must be 1..256 bytes without spaces or control "
                    f"characters, got {entry.id!r}"
                )
            if entry.id in seen:
                raise ConfigError(f"[[peering.{table}]] id {entry.id!r} is listed twice")
            seen.add(entry.id)
            if entry.id == cfg.broker_id:
                raise ConfigError(
                    f"[[peering.{table}]] id {entry.id!r} is this broker's own server_id"
                )
            if entry.address is not None:
                try:
                    parse_peer_addresses(entry.address)  # a pair's two brokers: "A,B"
                except ValueError as exc:
                    raise ConfigError(f"[[peering.{table}]] {entry.id}: address {exc}") from None
    if cfg.trusted_peers and cfg.peers:
        raise ConfigError(
            "[peering] peers cannot be combined with [[peering.peer]]: give each peer to dial "
            "an address in its [[peering.peer]] entry"
        )
    if cfg.trusted_peers and cfg.peer_secret is not None:
        raise ConfigError(
            "[peering] secret (one secret for the whole mesh) cannot be combined with "
            "[[peering.peer]]: each listed peer has its own secret"
        )


def _check_flood_limits(cfg: BrokerConfig) -> None:
    for name in ("max_connections", "connection_burst", "publish_burst", "max_subscriptions"):
        if not 0 <= getattr(cfg, name) <= 1_000_000_000:
            raise ConfigError(
                f"{name} must be in 0..1000000000 (0: no limit), got {getattr(cfg, name)}"
            )
    for name in ("connection_rate", "publish_rate"):
        value = getattr(cfg, name)
        if not 0 <= value <= 1e9:  # (also refuses nan and inf)
            raise ConfigError(f"{name} must be in [0, 1e9] per second (0: no limit), got {value}")


_TLS_LISTENERS = ("listen_native", "listen_mqtt", "listen_websocket", "listen_http")


def _check_tls(cfg: BrokerConfig) -> None:
    """The [tls] table as a whole; the files themselves are read when the broker starts."""
    listening = [name for name in _TLS_LISTENERS if getattr(cfg, f"tls_{name}") is not None]
    for name in listening:
        value = getattr(cfg, f"tls_{name}")
        if parse_listen(value) is None:
            raise ConfigError(f"tls {name} must be HOST:PORT, got {value!r}")
    if (cfg.tls_cert is None) != (cfg.tls_key is None):
        raise ConfigError("tls cert and key go together: set both or neither")
    if listening and cfg.tls_cert is None:
        raise ConfigError(f"tls {listening[0]} needs tls cert and key")
    if cfg.tls_require_client_cert and cfg.tls_client_ca is None:
        raise ConfigError("tls require_client_cert needs tls client_ca to verify them with")


def _check_ha(cfg: BrokerConfig) -> None:
    """The [ha] table as a whole: once any key is set, the pair's four keys are needed."""
    check_ha_timing(cfg.ha_lease, cfg.ha_failure_timeout)
    if not cfg.ha_configured:
        return
    if cfg.ha_role not in HA_ROLES:
        raise ConfigError(f'ha role must be "primary" or "standby", got {cfg.ha_role!r}')
    for key in ("partner", "witness"):
        value = getattr(cfg, f"ha_{key}")
        if value is None:
            raise ConfigError(f"ha {key} is required with [ha] (HOST:PORT)")
        if parse_host_port(value) is None:
            raise ConfigError(f"ha {key} must be HOST:PORT, got {value!r}")
    if not cfg.ha_secret:
        raise ConfigError("ha secret is required with [ha]: the pair and the witness share it")
    if cfg.data_dir is None:
        raise ConfigError("[ha] needs server data_dir: the pair replicates durable state")
    for key in ("link_port", "partner_link_port"):
        port = getattr(cfg, f"ha_{key}")
        if port is not None and (isinstance(port, bool) or not 0 < port < 65536):
            raise ConfigError(f"ha {key} must be a port (1-65535), got {port!r}")
    if cfg.ha_failover not in HA_FAILOVERS:
        raise ConfigError(f'ha failover must be "witness" or "manual", got {cfg.ha_failover!r}')
    tls_files = [name for name in HA_TLS_KEYS if getattr(cfg, f"ha_{name}") is not None]
    if tls_files and len(tls_files) != len(HA_TLS_KEYS):
        raise ConfigError(
            "ha ca, cert and key go together (mutual TLS: each side checks the other's "
            f"certificate against ca), got only {', '.join(tls_files)}"
        )
    if not cfg.server_id:  # the pair's id: derived now (scrypt, ~50 ms, cached), not later
        pair_id(cfg.ha_secret)  # on the promotion path, where a standby starts to serve


def check_ha_timing(lease: float, failure_timeout: float) -> None:
    """[ha] lease and failure_timeout, as one-line ConfigErrors (the witness checks its too)."""
    for name, value in (("lease", lease), ("failure_timeout", failure_timeout)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
            raise ConfigError(f"ha {name} must be in (0, 3600] seconds, got {value!r}")
    try:
        Timing(float(lease), float(failure_timeout))
    except ValueError as exc:
        raise ConfigError(f"ha {exc}") from None


def _valid_broker_id(text: str) -> bool:
    return 0 < len(text.encode()) <= 256 and all(c.isprintable() and not c.isspace() for c in text)


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file as a dict; an unreadable or invalid file is a one-line ConfigError."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into config-field overrides; raises ConfigError."""
    document = read_toml(path)
    overrides: dict[str, Any] = {}
    for table, body in document.items():
        keys = _FILE_KEYS.get(table)
        if keys is None:
            known = ", ".join(f"[{t}]" for t in _FILE_KEYS)
            raise ConfigError(f"{path}: unknown table [{table}] (known: {known})")
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: {table} must be a table, like [{table}]")
        for key, value in body.items():
            if key not in keys:
                raise ConfigError(
                    f"{path}: unknown key {key!r} in [{table}] (known: {', '.join(keys)})"
                )
            if keys[key] == "peers" and isinstance(value, list):
                value = tuple(value)  # TOML arrays are lists; the config holds a tuple
            elif keys[key] in ("trusted_peers", "trusted_observers"):
                role = BROKER if key == "peer" else OBSERVER
                try:
                    value = parse_entries(value, role)
                except ValueError as exc:
                    raise ConfigError(f"{path}: {exc}") from None
            overrides[keys[key]] = value
    return overrides


def build_config(file: str | Path | None = None, **overrides: Any) -> BrokerConfig:
    """Defaults, then the file, then explicit overrides (None means 'not given')."""
    settings: dict[str, Any] = {}
    if file is not None:
        settings.update(load_config_file(file))
    settings.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return BrokerConfig(**settings)
    except TypeError as exc:  # only reachable through a programming error in a caller
        raise ConfigError(str(exc)) from None
