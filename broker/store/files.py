"""The data directory on disk: one broker's lock on it, and making a new file's entry durable."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from broker.store.records import StoreError

__all__ = ["LOCK_FILENAME", "fsync_directory", "lock_directory"]

LOCK_FILENAME = "topiary.lock"


def lock_directory(directory: Path) -> IO[str]:
    """Take the data directory for this process: two brokers on one store would each
    think they own its sessions. The lock is released when the file is closed, also when
    the process dies, so a kill -9 leaves nothing to clean up."""
    path = directory / LOCK_FILENAME
    try:
        handle = open(path, "a+")  # noqa: SIM115 - held open for the store's lifetime
    except OSError as exc:
        raise StoreError(f"cannot open lock file {path}: {exc.strerror}") from None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise StoreError(
            f"data directory {directory} is in use by {owner}: one broker per data directory"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def fsync_directory(directory: str) -> None:
    """Make the directory's entries durable (a new file is not, until its directory is
    fsynced); best effort, since not every file system lets a directory be opened or synced."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
