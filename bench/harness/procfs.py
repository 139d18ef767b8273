"""What /proc says about a process or the machine: memory and CPU time.

Read from /proc rather than asked of the broker, so that measuring costs the broker
nothing and works on a broker that no longer answers.
"""

from __future__ import annotations

import os


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of ``pid`` in MB."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def cpu_times(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    return sum(cpu_times(pid))


def scheduling(pid: int) -> dict[str, float]:
    """How the kernel scheduled ``pid`` so far, summed over its threads (nats-server's work
    is not on its main thread): ms on a CPU and ms runnable but waiting for one
    (/proc/PID/task/*/schedstat, nanoseconds), and how often a thread was switched out while
    it still wanted to run (``nonvoluntary_ctxt_switches``: preempted). Threads that ended
    between two readings are missing from the later one. Empty if not readable."""
    run_ns = wait_ns = preempted = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                run, wait = (int(x) for x in f.read().split()[:2])
            run_ns += run
            wait_ns += wait
            with open(f"/proc/{pid}/task/{task}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key == "nonvoluntary_ctxt_switches":
                        preempted += int(value)
    except (OSError, ValueError):
        return {}
    return {"run_ms": run_ns / 1e6, "wait_ms": wait_ns / 1e6, "preempted": preempted}


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent busy since boot (user, nice, system, irq,
    softirq: not idle, iowait or steal, the time the hypervisor gave to other guests)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    busy = sum(fields[:7]) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")
