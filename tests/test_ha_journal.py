"""The standby's journal on a disk that refuses a write: nothing torn is left behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from broker.ha.journal import JOURNAL_FILENAME, read_journal

ROOT = Path(__file__).resolve().parent.parent

# A process of its own, so that its file size limit (RLIMIT_FSIZE: the kernel refuses the
# write past it with EFBIG, as a full disk refuses with ENOSPC) binds nobody else.
_APPEND_UNTIL_REFUSED = textwrap.dedent(
    """
    import errno, resource, signal, sys
    from pathlib import Path
    from broker.ha.journal import Journal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write, not a killed process
    journal = Journal(Path(sys.argv[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000))
    appended = 0
    for i in range(100):
        try:
            journal.append([(bytes([i]) * 3_000, bytes([i]) * 16)], empty_first=False)
        except OSError as exc:
            assert exc.errno == errno.EFBIG, exc
            break
        appended += 1
    print(appended, journal.size)
    """
)


def test_an_append_the_disk_refuses_is_taken_back_whole(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _APPEND_UNTIL_REFUSED, str(tmp_path)],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    appended, size = (int(value) for value in out.stdout.split())
    assert appended == 3  # 3 frames of 3,020 bytes fit under 10,000; the 4th was cut short
    path = tmp_path / JOURNAL_FILENAME
    assert path.stat().st_size == size == 3 * 3_020  # what the refused write took, back
    frames = list(read_journal(path))
    assert frames == [(bytes([i]) * 3_000, bytes([i]) * 16) for i in range(3)]
