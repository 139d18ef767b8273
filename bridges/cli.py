"""``topiary bridge kafka|spark``: the bridges' commands, plugged into the ``topiary`` CLI.

broker/ never imports bridges/: pyproject.toml names ``register`` in the
``topiary.commands`` entry-point group, and ``broker.cli`` calls it while it
builds its parser. Heavy imports (confluent-kafka, PySpark) wait until a command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import trio

from broker.commands import UsageError, listen_address, tune_gc

HTTP_HELP = "serve /metrics, /healthz and /readyz there (overrides [http] listen)"


def register(commands: Any) -> None:
    """Add ``bridge kafka`` and ``bridge spark`` to the ``topiary`` subcommands."""
    bridge = commands.add_parser("bridge", help="run a bridge into the broker")
    kinds = bridge.add_subparsers(dest="kind", required=True, parser_class=type(bridge))
    kafka = kinds.add_parser(
        "kafka", help="consume an aggregate Kafka topic, publish the wanted events"
    )
    kafka.add_argument("--config", required=True, help="bridge TOML file (see docs/bridge.md)")
    kafka.add_argument("--log-format", choices=["console", "json"], default="console")
    kafka.add_argument("--http", type=listen_address, metavar="HOST:PORT", help=HTTP_HELP)
    kafka.set_defaults(run=bridge_kafka, prog="topiary bridge kafka")
    spark = kinds.add_parser(
        "spark", help="the same bridge as a Spark Structured Streaming job (docs/spark.md)"
    )
    spark.add_argument("--config", required=True, help="bridge TOML file with a [spark] table")
    spark.add_argument("--log-format", choices=["console", "json"], default="console")
    spark.add_argument("--http", type=listen_address, metavar="HOST:PORT", help=HTTP_HELP)
    spark.add_argument(
        "--available-now",
        action="store_true",
        help="bridge what the topic holds now, in micro-batches, then exit",
    )
    spark.set_defaults(run=bridge_spark, prog="topiary bridge spark")


def bridge_kafka(args: argparse.Namespace) -> int:
    from broker.config import ConfigError
    from broker.log import configure_logging

    try:
        from bridges.config import load_bridge_config
        from bridges.kafka import run_bridge
    except ImportError as exc:  # confluent-kafka is the optional extra "kafka"
        raise UsageError(f"{exc}; install topiary[kafka]") from None
    try:
        config = with_http(load_bridge_config(args.config), args)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    configure_logging(args.log_format)
    tune_gc()
    trio.run(run_bridge, config)
    return 0


def bridge_spark(args: argparse.Namespace) -> int:
    from broker.config import ConfigError
    from broker.log import configure_logging

    try:
        from bridges.config import load_bridge_config
        from bridges.spark.run import run_spark_bridge
        from bridges.spark.session import SparkUnavailable, check_spark
    except ImportError as exc:
        raise UsageError(f"{exc}; install topiary[spark]") from None
    try:
        config = with_http(load_bridge_config(args.config), args)
        if config.spark.checkpoint is None:
            raise ConfigError(f"{args.config}: [spark] checkpoint is required")
        check_spark()
    except (ConfigError, SparkUnavailable) as exc:
        raise UsageError(str(exc)) from None
    configure_logging(args.log_format)
    return run_spark_bridge(config, available_now=args.available_now)


def with_http(config: Any, args: argparse.Namespace) -> Any:
    """The config with ``--http``, when given, in place of ``[http] listen``."""
    if getattr(args, "http", None) is None:
        return config
    return dataclasses.replace(config, http_listen=args.http)
