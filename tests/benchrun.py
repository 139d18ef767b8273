"""Running a benchmark script the way an operator would, for the smoke tests."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 120.0


class QuickRun:
    """``python SCRIPT --quick --json PATH [EXTRA...]`` in its own process: started once,
    read by whoever asks for the result, interrupted if nobody does."""

    def __init__(self, script: Path, json_path: Path, *extra: str) -> None:
        self.json_path = json_path
        self.command = [sys.executable, str(script), "--quick", "--json", str(json_path), *extra]
        # Files beside the JSON, not pipes: nobody reads while the run goes.
        self._stdout = json_path.with_name(json_path.name + ".stdout")
        self._stderr = json_path.with_name(json_path.name + ".stderr")
        self._popen: subprocess.Popen | None = None
        self._result: tuple[subprocess.CompletedProcess, dict] | None = None

    def start(self) -> QuickRun:
        if self._popen is None:
            with open(self._stdout, "wb") as out, open(self._stderr, "wb") as err:
                self._popen = subprocess.Popen(self.command, cwd=ROOT, stdout=out, stderr=err)
        return self

    def result(self, timeout: float = TIMEOUT) -> tuple[subprocess.CompletedProcess, dict]:
        """Wait for the run (starting it if nobody has); the process and the JSON it wrote."""
        if self._result is None:
            popen = self.start()._popen
            assert popen is not None
            try:
                status = popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.abort()
                raise
            stdout, stderr = self._stdout.read_text(), self._stderr.read_text()
            assert status == 0, stdout + stderr
            done = subprocess.CompletedProcess(self.command, status, stdout, stderr)
            self._result = (done, json.loads(self.json_path.read_text()))
        return self._result

    def abort(self) -> None:
        """Stop a run nobody waited for. SIGINT, as from a terminal: the script's own
        clean-up stops what it started (in process groups of their own)."""
        popen = self._popen
        if popen is not None and popen.poll() is None:
            popen.send_signal(signal.SIGINT)
            try:
                popen.wait(30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()


def run_quick(
    script: Path, json_path: Path, *extra: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """``python SCRIPT --quick --json PATH [EXTRA...]``: the process and the JSON it wrote."""
    run = QuickRun(script, json_path, *extra)
    try:
        return run.result()
    finally:
        run.abort()


def still_running(pid: int, *programs: bytes) -> bool:
    """Whether ``pid`` is a live process whose command line names one of ``programs`` (a
    zombie, or a pid the kernel reused for another program, is not): what a benchmark must
    not leave behind."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z" and any(program in cmdline for program in programs)
