"""The bridges' operators' port: ``/metrics`` (Prometheus text) and ``/healthz``.

Both bridges (the Kafka one and the Spark driver) hand a :class:`BridgeFigures` snapshot to
:class:`BridgeCollector` at scrape time; ``prometheus_client`` writes the exposition and
``broker.http.HttpServer`` serves it from a trio loop. Counters a bridge does not know are
left out, not reported as 0. docs/bridge.md and docs/spark.md list the names.

The message economy. ``wanted`` = records in - dropped at the source - malformed: the
records some broker wanted. ``topiary_bridge_moved_per_wanted`` = (published + publish
retries) / wanted, the messages the bridge moved into the broker per wanted one (the goal
is 1.0); ``topiary_bridge_read_per_wanted`` = records in / wanted, what a consumer of the
flat topic would move per wanted message (it must read everything and filter). Both are
NaN until a record is wanted.

Lag per partition = the log end - the bridge's position, where the end is the true one
(bridges/lag.py: probed, never the watermark alone) and the position is the offset after
the last record done (confirmed by the broker, dropped, or dead-lettered).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from broker.address import parse_listen
from broker.http import HttpServer, Request, Response

#: Counter key -> (metric name without ``_total``, help). The Kafka bridge's keys are its
#: ``BridgeCounters`` fields; the Spark driver reports the ones it can know.
COUNTERS: dict[str, tuple[str, str]] = {
    "records_in": ("topiary_bridge_records_in", "Records read from the aggregate topic."),
    "bytes_in": ("topiary_bridge_bytes_in", "Payload bytes of the records read."),
    "unwanted_dropped": (
        "topiary_bridge_unwanted_dropped",
        "Records dropped at the source: no broker wants their topic.",
    ),
    "malformed": (
        "topiary_bridge_malformed",
        "Records that did not decode or map to a topic (sent to the dead letters).",
    ),
    "published": (
        "topiary_bridge_published",
        "Records forwarded to the broker and confirmed by it.",
    ),
    "refused": (
        "topiary_bridge_refused",
        "Records the broker refused for good (sent to the dead letters).",
    ),
    "publish_retries": (
        "topiary_bridge_publish_retries",
        "Records published again after a passing refusal.",
    ),
    "dead_lettered": (
        "topiary_bridge_dead_lettered",
        "Records delivered to the dead-letter topic.",
    ),
    "dead_letter_retries": (
        "topiary_bridge_dead_letter_retries",
        "Dead letters produced again after a failure.",
    ),
    "batches": ("topiary_bridge_batches", "Batches read from Kafka (micro-batches on Spark)."),
    "offsets_stored": (
        "topiary_bridge_offsets_stored",
        "Partition offsets stored for commit after confirmation.",
    ),
    "offsets_not_stored": (
        "topiary_bridge_offsets_not_stored",
        "Offsets not stored: the partition had moved to another group member.",
    ),
    "kafka_errors": ("topiary_bridge_kafka_errors", "Errors reported by the Kafka client."),
    "rebalances": ("topiary_bridge_rebalances", "Partition assignments received."),
}


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition's progress: ``end - position`` records are not done yet."""

    partition: int
    position: int  # the offset after the last record done
    end: int  # the true log end

    @property
    def lag(self) -> int:
        return max(0, self.end - self.position)


@dataclass(frozen=True, slots=True)
class BridgeFigures:
    """What a bridge knows at one instant."""

    topic: str
    counters: dict[str, int]
    partitions: list[PartitionLag] = field(default_factory=list)
    in_flight: int | None = None  # records read and not yet done; None: unknown


class BridgeCollector:
    """A ``prometheus_client`` collector over a bridge's figures, read at each scrape."""

    def __init__(self, figures: Callable[[], BridgeFigures]) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        figures = self.figures()
        counters = figures.counters
        for key, (name, help_text) in COUNTERS.items():
            if key in counters:
                yield CounterMetricFamily(name, help_text, value=counters[key])
        wanted = wanted_records(counters)
        if wanted is not None:
            yield CounterMetricFamily(
                "topiary_bridge_records_wanted",
                "Records some broker wanted: records in - dropped at the source - malformed.",
                value=wanted,
            )
            moved = counters.get("published", 0) + counters.get("publish_retries", 0)
            yield GaugeMetricFamily(
                "topiary_bridge_moved_per_wanted",
                "Messages moved into the broker per message wanted (goal 1.0).",
                value=moved / wanted if wanted else math.nan,
            )
            yield GaugeMetricFamily(
                "topiary_bridge_read_per_wanted",
                "Records in per record wanted: what a flat-topic consumer moves per wanted one.",
                value=counters["records_in"] / wanted if wanted else math.nan,
            )
        if figures.in_flight is not None:
            yield GaugeMetricFamily(
                "topiary_bridge_in_flight_records",
                "Records read and not yet confirmed or dead-lettered.",
                value=figures.in_flight,
            )
        labels = ["topic", "partition"]
        lag = GaugeMetricFamily(
            "topiary_bridge_consumer_lag",
            "Records between the bridge's position and the true log end.",
            labels=labels,
        )
        position = GaugeMetricFamily(
            "topiary_bridge_consumer_position",
            "The offset after the last record the bridge has done with.",
            labels=labels,
        )
        end = GaugeMetricFamily(
            "topiary_bridge_log_end_offset",
            "The true log end (probed, not the high watermark alone).",
            labels=labels,
        )
        for part in figures.partitions:
            values = [figures.topic, str(part.partition)]
            lag.add_metric(values, part.lag)
            position.add_metric(values, part.position)
            end.add_metric(values, part.end)
        yield from (lag, position, end)


def wanted_records(counters: dict[str, int]) -> int | None:
    """Records some broker wanted, when the counters tell."""
    if not {"records_in", "unwanted_dropped", "malformed"} <= counters.keys():
        return None
    return counters["records_in"] - counters["unwanted_dropped"] - counters["malformed"]


def report(figures: BridgeFigures, bridge_id: str, now: float) -> bytes:
    """The bridge's report to the broker, as JSON (its fields: docs/bridge.md).

    The economy as on /metrics, with null where /metrics has NaN (nothing wanted yet).
    """
    counters = figures.counters
    wanted = wanted_records(counters)
    moved = counters.get("published", 0) + counters.get("publish_retries", 0)
    document = {
        "bridge_id": bridge_id,
        "source_topic": figures.topic,
        "time": round(now, 3),
        "records_in": counters.get("records_in", 0),
        "unwanted_dropped": counters.get("unwanted_dropped", 0),
        "malformed": counters.get("malformed", 0),
        "dead_lettered": counters.get("dead_lettered", 0),
        "refused": counters.get("refused", 0),
        "wanted": wanted,
        "published": counters.get("published", 0),
        "publish_retries": counters.get("publish_retries", 0),
        "moved_per_wanted": moved / wanted if wanted else None,
        "read_per_wanted": counters["records_in"] / wanted if wanted else None,
        "in_flight": figures.in_flight,
        "lag": sum(p.lag for p in figures.partitions) if figures.partitions else None,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def exposition(figures: Callable[[], BridgeFigures]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BridgeCollector(figures))  # type: ignore[arg-type]
    return generate_latest(registry)


def bridge_routes(
    figures: Callable[[], BridgeFigures], ready: Callable[[], bool]
) -> dict[str, Callable[[Request], Response]]:
    """``/healthz`` (200 while the loop answers), ``/readyz`` (200 once consuming) and
    ``/metrics``."""

    def healthz(_request: Request) -> Response:
        return Response(200, b"ok\n")

    def readyz(_request: Request) -> Response:
        if ready():
            return Response(200, b"ready\n")
        return Response(503, b"not ready: waiting for the broker's route table\n")

    def metrics(_request: Request) -> Response:
        return Response(200, exposition(figures), CONTENT_TYPE_LATEST)

    return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}


async def serve_http(
    http: HttpServer,
    listen: str,
    *,
    task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``http`` on ``listen`` (HOST:PORT, port 0: any free one) until cancelled."""
    parsed = parse_listen(listen)
    if parsed is None:
        raise ValueError(f"http listen must be HOST:PORT, got {listen!r}")
    host, port = parsed
    listeners = await trio.open_tcp_listeners(port, host=host)
    await http.serve(listeners, task_status=task_status)
