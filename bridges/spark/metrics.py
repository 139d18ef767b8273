"""The Spark bridge's operators' port, served by the driver: what the driver can know.

Sources, all on the driver:

* the query's progress (``query.recentProgress``, polled every ``POLL`` seconds): per
  micro-batch its id, its input rows (records in) and the source's end offset per
  partition (where the batch stopped);
* the sink's totals per micro-batch: the batch writer's commit (a Python worker on the
  driver's machine) writes the summed ``SinkCommit`` of all tasks to a file that
  ``BatchWriter`` reads once ``save()`` returned (bridges/spark/sink.py ``report``);
* the true log end of each partition, read by ``bridges.lag.LogEnds`` (watermark raised
  by a probe; never the watermark alone).

Counters are summed over *finished* micro-batches, those with both a progress entry and a
sink report, so records in and their fates always add up. Dropped at the source = the
batch's input rows - the rows that reached the sink + the rows the sink dropped (in
``regex`` mode the query drops them before the sink). Malformed = dead-lettered - refused.
Not known on the driver, so not reported: bytes in, publish retries, dead-letter retries,
Kafka client errors, records in flight (docs/spark.md).

Lag per partition = the true log end - the end offset of the last finished micro-batch
(Spark's checkpoint position): the records of a batch still running count as lag.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import trio

from bridges.config import BridgeConfig
from bridges.lag import LogEnds, PartitionEnds
from bridges.metrics import BridgeFigures, PartitionLag, bridge_routes, serve_http
from broker.http import HttpServer
from broker.log import get_logger

log = get_logger("topiary.bridge.spark")

POLL = 0.5  # seconds between looks at the query's progress and the log ends
SINK_KEYS = ("rows", "published", "unwanted", "dead_lettered", "refused")


class SparkFigures:
    """The driver's running totals; fed from the foreachBatch thread and the port's loop."""

    def __init__(self, config: BridgeConfig) -> None:
        self.topic = config.topic
        self.query: Any = None  # set once the query runs; /readyz says ready from then on
        self._reports = Path(tempfile.mkdtemp(prefix="topiary-spark-metrics-"))
        self._lock = threading.Lock()
        self._inputs: dict[int, int] = {}  # batch id -> input rows (from the progress)
        self._sinks: dict[int, dict[str, int]] = {}  # batch id -> the sink's totals
        self._positions: dict[int, int] = {}  # partition -> end offset of the last batch
        self._last_batch = -1
        self.log_ends: dict[int, PartitionEnds] = {}

    def report_path(self, batch_id: int) -> str:
        return str(self._reports / f"{batch_id}.json")

    def batch_written(self, batch_id: int) -> None:
        """Take the sink's totals of ``batch_id`` (no file: no task had a row)."""
        path = self.report_path(batch_id)
        try:
            with open(path) as report:
                totals = json.load(report)
            os.unlink(path)
        except FileNotFoundError:
            totals = {}
        with self._lock:
            self._sinks[batch_id] = {key: int(totals.get(key, 0)) for key in SINK_KEYS}

    def progress(self, entries: list[dict[str, Any]]) -> None:
        """Fold in the query's progress entries (``json.loads`` of each ``.json``)."""
        with self._lock:
            for entry in entries:
                batch = int(entry.get("batchId", -1))
                sources = entry.get("sources") or []
                if batch < 0 or not sources or batch in self._inputs:
                    continue
                self._inputs[batch] = int(entry.get("numInputRows") or 0)
                if batch > self._last_batch:
                    self._last_batch = batch
                    self._positions.update(
                        partition_offsets(sources[0].get("endOffset"), self.topic)
                    )

    def partitions(self) -> list[int]:
        with self._lock:
            return sorted(self._positions)

    def figures(self) -> BridgeFigures:
        with self._lock:
            done = sorted(self._inputs.keys() & self._sinks.keys())
            counters = {"records_in": 0, "batches": len(done), "unwanted_dropped": 0}
            counters |= {"published": 0, "dead_lettered": 0, "refused": 0, "malformed": 0}
            for batch in done:
                rows, sink = self._inputs[batch], self._sinks[batch]
                counters["records_in"] += rows
                counters["unwanted_dropped"] += rows - sink["rows"] + sink["unwanted"]
                counters["published"] += sink["published"]
                counters["dead_lettered"] += sink["dead_lettered"]
                counters["refused"] += sink["refused"]
                counters["malformed"] += sink["dead_lettered"] - sink["refused"]
            positions = dict(self._positions)
        partitions = [
            PartitionLag(p, position, max(ends.end, position))
            for p, position in sorted(positions.items())
            if (ends := self.log_ends.get(p)) is not None
        ]
        return BridgeFigures(self.topic, counters, partitions)

    def close(self) -> None:
        for leftover in self._reports.glob("*"):
            leftover.unlink(missing_ok=True)
        self._reports.rmdir()


def partition_offsets(offsets: Any, topic: str) -> dict[int, int]:
    """``{"0": 25}`` (topiary_kafka) or ``{"topic": {"0": 25}}`` (Spark's Kafka source), as
    JSON text or parsed, -> ``{0: 25}``."""
    if isinstance(offsets, str):
        offsets = json.loads(offsets)
    if not isinstance(offsets, dict):
        return {}
    if isinstance(offsets.get(topic), dict):
        offsets = offsets[topic]
    return {int(p): int(o) for p, o in offsets.items() if not isinstance(o, dict)}


class DriverPort:
    """The driver's ``--http`` port in a thread of its own (a trio loop), started and
    stopped by ``run_spark_bridge``."""

    def __init__(self, config: BridgeConfig, figures: SparkFigures, listen: str) -> None:
        self.config = config
        self.figures = figures
        self.listen = listen
        self.addresses: list[tuple[str, int]] = []
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="topiary-http", daemon=True)

    def start(self) -> list[tuple[str, int]]:
        """Serve; the addresses listened on. Raises what kept the port from opening."""
        self._thread.start()
        self._started.wait()
        if self._failure is not None:
            raise self._failure
        return self.addresses

    def stop(self) -> None:
        if self._token is not None and self._scope is not None:
            with contextlib.suppress(trio.RunFinishedError):  # it ended on its own
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # reported to start(); after that, logged
            if not self._started.is_set():
                self._failure = exc
            else:
                log.error("spark bridge http port failed", error=str(exc))
        finally:
            self._started.set()

    async def _serve(self) -> None:
        figures = self.figures
        http = HttpServer(bridge_routes(figures.figures, lambda: figures.query is not None))
        reader = LogEnds(self.config)
        self._token = trio.lowlevel.current_trio_token()
        try:
            with trio.CancelScope() as self._scope:
                async with trio.open_nursery() as nursery:
                    self.addresses = await nursery.start(serve_http, http, self.listen)
                    self._started.set()
                    while True:
                        await self._poll(reader)
                        await trio.sleep(POLL)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(reader.close)

    async def _poll(self, reader: LogEnds) -> None:
        from confluent_kafka import KafkaException

        query = self.figures.query
        if query is not None:
            try:
                entries = await trio.to_thread.run_sync(
                    lambda: [json.loads(p.json) for p in query.recentProgress]
                )
                self.figures.progress(entries)
            except Exception as exc:  # py4j: the JVM going away as we stop
                log.debug("reading the query's progress failed", error=str(exc))
        try:
            self.figures.log_ends = await trio.to_thread.run_sync(
                reader.read, self.figures.partitions()
            )
        except KafkaException as exc:
            log.warning("reading the log ends failed", error=str(exc))
