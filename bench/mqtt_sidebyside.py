"""topiary's MQTT port beside Mosquitto, with the same MQTT client: fan-out and latency.

    python bench/mqtt_sidebyside.py [--quick] [--json PATH] [--brokers topiary-mqtt,mosquitto]
                                    [--sizes 1000,10000] [--messages N] [--seed N]
                                    [--log-dir DIR]

Issue 17: bench/sidebyside.py's workloads (read its docstring for the phases, the exactness
check and the columns), driven through an MQTT client (bench/harness/clients/mqtt.py: MQTT
3.1.1, QoS 0, clean sessions) against ``topiary serve --mqtt`` (``topiary-mqtt`` in
bench/harness/peers.py: topiary's config for the comparisons, the native port kept for its
counters) and Mosquitto (``apt-get install mosquitto``; when it is missing its rows say
"not installed" and topiary still runs), one after the other in one run, a fresh broker
per kind and size:

- S = 1,000 and 10,000 portable filters over 4 subscriber connections in 2 processes;
- throughput: 200,000 messages of 200-800 B as fast as one publisher writes; completion =
  first publish -> the last delivery;
- latency: 2,000 msg/s for 2.5 s, p50 / p99 / max of read time - publish stamp.

Both brokers owe each connection one copy per message however many of its filters match
(Mosquitto with ``allow_duplicate_messages false``), checked message by message.

Goals (issue 17, for topiary's MQTT port; for information, they do not set the exit
status): completion msg/s >= 1.5x Mosquitto's at S = 1,000 and 10,000 (200,000 messages,
none dropped); p99 at 2,000 msg/s <= Mosquitto's in the same run; every delivery exact.
``--brokers`` may add ``topiary`` (native client) or ``nats`` for context: the ratios are
always topiary-mqtt's. ``--quick``: 4,000 messages and a 0.5 s latency phase; every wait is
bounded (an error row, not a hang); the exit status is 0 unless a run failed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

from bench.harness.report import Goals  # noqa: E402
from bench.sidebyside import (  # noqa: E402
    GOAL_MESSAGES,
    GOAL_SIZES,
    Comparison,
    add_exact_goal,
    main,
)

OURS = "topiary-mqtt"
PEER = "mosquitto"
GOAL_VS_MOSQUITTO = 1.5


def check_goals(report: dict[str, Any]) -> Goals:
    """Issue 17's goals for topiary's MQTT port against Mosquitto in the same run."""
    params = report["parameters"]
    full = params["messages"] == GOAL_MESSAGES and not params["quick"]
    goals = Goals()
    for size in GOAL_SIZES:
        ratio = report["ratios"].get(str(size), {}).get(PEER, {})
        value = ratio.get("completion")
        ok = None
        if full and value is not None and ratio.get("completion_comparable"):
            ok = value >= GOAL_VS_MOSQUITTO
        goals.add(
            f"S = {size:,}: {OURS} completion >= {GOAL_VS_MOSQUITTO:g}x Mosquitto's rate "
            f"({GOAL_MESSAGES:,} messages, none dropped)",
            value,
            ok,
        )
    for size in params["sizes"]:
        value = report["ratios"].get(str(size), {}).get(PEER, {}).get("p99")
        goals.add(
            f"S = {size:,}: {OURS} p99 at {params['latency_rate']:,} msg/s <= Mosquitto's "
            "(ratio <= 1)",
            value,
            None if value is None or params["quick"] else value <= 1.0,
        )
    add_exact_goal(goals, report, OURS)
    return goals


ISSUE_17 = Comparison("mqtt_sidebyside", __doc__ or "", OURS, (OURS, PEER), check_goals)

if __name__ == "__main__":
    sys.exit(main(comparison=ISSUE_17))
