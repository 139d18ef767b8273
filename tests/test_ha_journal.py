"""The standby's journal: written over from its start, and on a disk that refuses a write."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from broker.ha.journal import JOURNAL_FILENAME, Journal, read_journal

ROOT = Path(__file__).resolve().parent.parent


def _frame(i: int, size: int = 3_000) -> tuple[bytes, bytes]:
    return bytes([i]) * size, bytes([i]) * 16


def test_records_written_after_the_store_caught_up_go_over_the_old_ones(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.append([_frame(1), _frame(2)], empty_first=False)
    journal.append([_frame(3, 100)], empty_first=True)
    journal.close()
    path = tmp_path / JOURNAL_FILENAME
    assert path.stat().st_size == 2 * 3_020  # written over, not grown nor cut
    frames = list(read_journal(path))
    assert frames[0] == _frame(3, 100)  # the newest first; what follows is the old bytes


# A process of its own, so that its file size limit (RLIMIT_FSIZE: the kernel refuses the
# write past it with EFBIG, as a full disk refuses with ENOSPC) binds nobody else.
_APPEND_UNTIL_REFUSED = textwrap.dedent(
    """
    import errno, resource, signal, sys
    from pathlib import Path
    from broker.ha.journal import Journal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a refused write, not a killed process
    journal = Journal(Path(sys.argv[1]))
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, hard))
    appended = 0
    for i in range(100):
        try:
            journal.append([(bytes([i]) * 3_000, bytes([i]) * 16)], empty_first=False)
        except OSError as exc:
            assert exc.errno == errno.EFBIG, exc
            break
        appended += 1
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space again
    journal.append([(bytes([appended]) * 3_000, bytes([appended]) * 16)], empty_first=False)
    print(appended)
    """
)


def test_a_write_the_disk_refused_leaves_nothing_the_next_does_not_write_over(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _APPEND_UNTIL_REFUSED, str(tmp_path)],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert int(out.stdout) == 3  # 3 frames of 3,020 bytes fit under 10,000; the 4th was cut
    frames = list(read_journal(tmp_path / JOURNAL_FILENAME))
    assert frames == [_frame(i) for i in range(4)]  # the 4th again, whole, over the cut one
