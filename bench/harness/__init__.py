"""What the benchmarks share: broker processes, raw wire clients, reports, meshes.

One module per job (``processes``, ``procfs``, ``workers``, ``wire``, ``logs``,
``report``, ``mesh``; ``peers``, ``clients`` and ``crossload`` for the comparisons with
Mosquitto and NATS), so that a benchmark script holds only its own workloads.
tests/mesh.py builds its meshes on ``mesh`` too, so the two never drift apart.
"""


class BenchError(Exception):
    """A scenario could not run (worker failure, timeout, broker not starting)."""
