"""Broker settings: defaults, a TOML file, and command-line overrides.

A config file is checked as a whole before the broker starts: an unknown key,
a wrong type or an out-of-range value stops start-up with one line naming the
key, never a traceback and never a silently ignored typo.

    [server]
    host = "127.0.0.1"
    port = 7474
    data_dir = "/var/lib/topiary"
    log_format = "json"            # console | json
    server_id = "broker-a"

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

    [sessions]                     # durable sessions (need data_dir)
    max_messages = 1000000         # pending (unacked) messages per session
    max_bytes = 1073741824         # pending payload bytes per session
    overflow = "drop-oldest"       # or "reject-publish"
    group_prefetch = 64            # unacked messages a shared-group member may hold

    [auth]
    token = "secret"               # HELLO credentials {"token": ...} must match
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.framebuffer import DEFAULT_MAX_FRAME, MAX_LENGTH


class ConfigError(ValueError):
    """A bad setting; the message names the key and says what is wrong."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 7474
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
    session_max_messages: int = 1_000_000
    session_max_bytes: int = 1 << 30
    overflow: str = "drop-oldest"
    group_prefetch: int = 64
    auth_token: str | None = None

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
    },
    "sessions": {
        "max_messages": "session_max_messages",
        "max_bytes": "session_max_bytes",
        "overflow": "overflow",
        "group_prefetch": "group_prefetch",
    },
    "auth": {"token": "auth_token"},
}

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
    "session_max_messages": (int,),
    "session_max_bytes": (int,),
    "overflow": (str,),
    "group_prefetch": (int,),
    "auth_token": (str, type(None)),
}


def _check(cfg: BrokerConfig) -> None:
    for name, types in _TYPES.items():
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, types):
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
    for name in ("keepalive", "shutdown_timeout", "hello_timeout"):
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
    for name in ("outbound_messages", "outbound_bytes", "slow_consumer_drops"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(cfg, name)}")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into config-field overrides; raises ConfigError."""
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
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
