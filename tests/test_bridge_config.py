"""The bridge's TOML config: checked as a whole, one clear line for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridges.config import bridge_config_from_dict, load_bridge_config
from broker.config import ConfigError

EXAMPLE = """
[kafka]                       # passed through to confluent-kafka
"bootstrap.servers" = "127.0.0.1:9092"
"group.id" = "topiary-bridge"
[source]
topic = "beacons"             # the aggregate topic
format = "json"               # json | msgpack
dead_letter_topic = "beacons.dlq"
[mapping]
template = "beacon/{region}/{country}/{site}/{section}/{event}"
[broker]
server = "127.0.0.1:7474"
"""


def minimal() -> dict:
    return {
        "kafka": {"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"},
        "source": {"topic": "beacons", "dead_letter_topic": "beacons.dlq"},
        "mapping": {"template": "beacon/{region}/{event}"},
        "broker": {"server": "127.0.0.1:7474"},
    }


def test_the_documented_example_config_loads(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(EXAMPLE)
    config = load_bridge_config(path)
    assert config.topic == "beacons"
    assert config.format == "json"
    assert config.dead_letter_topic == "beacons.dlq"
    assert config.server == "127.0.0.1:7474"
    assert config.template.fields == ("region", "country", "site", "section", "event")
    assert config.kafka == {"bootstrap.servers": "127.0.0.1:9092", "group.id": "topiary-bridge"}


def test_every_optional_key_is_accepted(tmp_path: Path) -> None:
    document = minimal()
    document["broker"] |= {"token": "t", "peer_secret": "s", "observer_id": "bridge-1"}
    document["bridge"] = {
        "batch_max": 100,
        "in_flight_max": 1000,
        "in_flight_bytes": 1 << 20,
        "backoff_max": 2,
        "stats_interval": 0,
        "shutdown_timeout": 3.5,
    }
    config = bridge_config_from_dict(document)
    assert config.observer_id == "bridge-1"
    assert config.settings.batch_max == 100
    assert config.settings.stats_interval == 0


def test_kafka_settings_pass_through_and_the_bridge_owns_offset_storage() -> None:
    document = minimal()
    document["kafka"]["fetch.min.bytes"] = 1
    consumer = bridge_config_from_dict(document).consumer_config()
    assert consumer["fetch.min.bytes"] == 1
    assert consumer["enable.auto.offset.store"] is False
    assert consumer["enable.auto.commit"] is True


def test_the_dead_letter_producer_gets_no_consumer_only_settings() -> None:
    document = minimal()
    document["kafka"] |= {"session.timeout.ms": 6000, "client.id": "x"}
    producer = bridge_config_from_dict(document).producer_config()
    assert "group.id" not in producer and "session.timeout.ms" not in producer
    assert producer["client.id"] == "x"
    assert producer["bootstrap.servers"] == "127.0.0.1:9092"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(extra={}), r"unknown table \[extra\]"),
        (lambda d: d.pop("mapping"), r"missing table \[mapping\]"),
        (lambda d: d["source"].pop("topic"), r"\[source\] is missing 'topic'"),
        (lambda d: d["source"].pop("dead_letter_topic"), "missing 'dead_letter_topic'"),
        (lambda d: d["kafka"].pop("group.id"), r"\[kafka\] is missing 'group.id'"),
        (lambda d: d["source"].update(topc="x"), "unknown key 'topc'"),
        (lambda d: d["source"].update(format="avro"), "format must be 'json' or 'msgpack'"),
        (lambda d: d["source"].update(topic=""), "topic must not be empty"),
        (lambda d: d["source"].update(dead_letter_topic="beacons"), "must differ from topic"),
        (lambda d: d["broker"].update(server="nowhere"), "server must be HOST:PORT"),
        (lambda d: d["broker"].update(server=7474), "server must be str"),
        (lambda d: d["mapping"].update(template="beacon/{region"), r"\[mapping\] template"),
        (lambda d: d["mapping"].update(template="a//{b}"), r"\[mapping\] template"),
        (lambda d: d["kafka"].update({"enable.auto.offset.store": True}), "cannot be set"),
        (lambda d: d["kafka"].update({"enable.auto.commit": False}), "cannot be set"),
        (lambda d: d["kafka"].update({"x": [1]}), "string, number or boolean"),
        (lambda d: d.update(bridge={"batch_max": 0}), "batch_max must be at least 1"),
        (lambda d: d.update(bridge={"batch_max": True}), "batch_max must be int"),
        (lambda d: d.update(bridge={"batch_max": 10, "in_flight_max": 5}), "at least batch_max"),
        (lambda d: d.update(bridge={"backoff_max": 0}), "backoff_max must be in"),
        (lambda d: d.update(bridge={"stats_interval": -1}), "stats_interval must be in"),
        (lambda d: d.update(bridge={"shutdown_timeout": float("inf")}), "shutdown_timeout"),
        (lambda d: d.update(source=[1]), r"\[source\] must be a table"),
        (lambda d: d.update(spark={"filter": "bloom"}), "filter must be 'table' or 'regex'"),
        (lambda d: d.update(spark={"trigger": -1}), "trigger must be in"),
        (lambda d: d.update(spark={"max_offsets_per_trigger": 0}), "at least 1"),
        (lambda d: d.update(spark={"master": " "}), "master must not be empty"),
        (lambda d: d.update(spark={"conf": {"a": {"b": 1}}}), r"\[spark.conf\] 'a'"),
        (lambda d: d.update(spark={"checkpont": "x"}), "unknown key 'checkpont'"),
    ],
)
def test_a_bad_config_is_refused_with_a_message_naming_the_key(change, message) -> None:
    document = minimal()
    change(document)
    with pytest.raises(ConfigError, match=message):
        bridge_config_from_dict(document)


def test_a_file_that_is_not_toml_is_refused_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text("[kafka\n")
    with pytest.raises(ConfigError, match=r"bridge\.toml is not valid TOML"):
        load_bridge_config(path)


def test_a_missing_file_is_refused_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_bridge_config(tmp_path / "absent.toml")


def test_errors_from_a_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(EXAMPLE.replace('format = "json"', 'format = "xml"'))
    with pytest.raises(ConfigError, match=r"bridge.toml: \[source\] format"):
        load_bridge_config(path)


def test_the_spark_table_is_read_with_its_defaults_and_passthrough_conf() -> None:
    document = minimal()
    document["spark"] = {"checkpoint": "/tmp/ck", "conf": {"spark.executor.cores": 4}}
    spark = bridge_config_from_dict(document).spark
    assert (spark.master, spark.checkpoint, spark.filter) == ("local[*]", "/tmp/ck", "table")
    assert spark.conf == {"spark.executor.cores": "4"}
