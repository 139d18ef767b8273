"""``topiary bridge spark``: run the Spark pipeline until SIGTERM, SIGINT or, with
``--available-now``, until everything in the topic at start has been bridged."""

from __future__ import annotations

import signal
import threading
from typing import Any

from bridges.config import BridgeConfig
from broker.config import ConfigError
from broker.log import get_logger

log = get_logger("topiary.bridge.spark")
ROUTE_WAIT_WARNING = 10.0


def run_spark_bridge(config: BridgeConfig, *, available_now: bool = False) -> int:
    """Returns the exit status: 0 after a clean stop, 1 when the query failed."""
    if config.spark.checkpoint is None:
        raise ConfigError("[spark] checkpoint is required for the Spark bridge")
    from bridges.spark.classcache import class_cache
    from bridges.spark.metrics import DriverPort, SparkFigures
    from bridges.spark.pipeline import start_query
    from bridges.spark.routes import RouteFeed
    from bridges.spark.session import build_session, stop_session

    master = config.spark.master
    # The route feed connects while the JVM starts.
    feed = RouteFeed.of(config)
    feed.start()
    figures = port = None
    if config.http_listen is not None:  # the driver serves /metrics (bridges/spark/metrics.py)
        figures = SparkFigures(config)
        port = DriverPort(config, figures, config.http_listen)
        try:
            log.info("spark bridge http listening", addresses=port.start())
        except BaseException:
            feed.stop()
            raise
    cache = None
    try:
        cache = class_cache(
            config.spark.class_cache, config.spark.conf.get("spark.driver.extraClassPath", "")
        )
        spark = build_session(
            master, conf=config.spark.conf, local=master.startswith("local"), class_cache=cache
        )
    except BaseException:
        feed.stop()
        if port is not None and figures is not None:
            port.stop()
            figures.close()
        if cache is not None:
            cache.finish(None)  # no JVM ran: let go of the lock
        raise
    stopping = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in signals}
    query: Any = None
    try:
        while not feed.wait_ready(ROUTE_WAIT_WARNING):
            if stopping.is_set():
                return 0
            log.warning("waiting for the broker's route table", server=config.server)
        query = start_query(
            spark, config, feed, checkpoint=config.spark.checkpoint,
            available_now=available_now, figures=figures,
        )  # fmt: skip
        if figures is not None:
            figures.query = query
        log.info("spark bridge running", query=query.id, master=master, topic=config.topic)
        return wait_for_query(query, stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        feed.stop()
        if port is not None and figures is not None:
            port.stop()
            figures.close()
        stop_session(spark, cache)


def wait_for_query(query: Any, stopping: threading.Event, poll: float = 0.5) -> int:
    """Run until the query ends or ``stopping`` is set; the exit status.

    A query that ends with an error on its own is a failure (1). One we stop may report an
    error too: Spark's stop cuts off the Python source's runner mid-call, and the query
    then ends "with exception" although nothing went wrong, since every committed batch is
    in the checkpoint and a replayed one is dropped by the broker's duplicate filter. That
    is a warning, not a failure.
    """
    while query.isActive and not stopping.is_set():
        query.awaitTermination(poll)
    stopped_by_us = query.isActive
    if stopped_by_us:
        query.stop()
    failure = query.exception()
    if failure is not None and not stopped_by_us:
        log.error("spark bridge failed", error=str(failure)[:2000])
        return 1
    if failure is not None:
        log.warning("spark query reported an error as it stopped", error=str(failure)[:500])
    log.info("spark bridge stopped", batches=len(query.recentProgress))
    return 0
