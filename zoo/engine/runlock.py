"""One run per run folder: an exclusive lock file holding the owner's PID.

Two runs in one folder (the same command twice within the time stamp's second, or the same
``hydra.run.dir``) would append to one metrics.jsonl and overwrite each other's checkpoints.
The lock is ``fcntl.flock`` on ``<run folder>/.run.lock``: the kernel drops it when its process
dies (kill -9 included), so a lock left behind by a dead run is stale by construction and is
simply taken over; the PID inside is only there to name the holder in the error.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

LOCK_NAME = ".run.lock"


class RunFolderBusy(RuntimeError):
    """Another live process holds the run folder's lock; the message names it."""


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "unknown process"
    except OSError:
        return "unknown process"


def holder_if_locked(run_dir) -> str | None:
    """Who holds ``run_dir``'s lock (``"pid N on HOST since ..."``), or None if no live run does."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(path)
    finally:
        os.close(fd)  # closing drops the probe's own lock
    return None


class RunLock:
    """Context manager holding the exclusive lock of ``run_dir`` (``enabled=False``: a no-op)."""

    def __init__(self, run_dir, enabled: bool = True):
        self.path = Path(run_dir) / LOCK_NAME
        self.enabled = enabled
        self._fd: int | None = None
        self._created = False

    def acquire(self) -> RunLock:
        if not self.enabled:
            return self
        self._created = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunFolderBusy(
                    f"{self.path.parent} is in use by another run ({_holder(self.path)}; lock file "
                    f"{self.path}); wait for it to finish, or choose another hydra.run.dir") from None
            # The holder we waited on may have removed the file after we opened it: lock the file
            # that is at the path now, or two runs could each hold a lock on a different inode.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._created and not any(self.path.parent.iterdir()):
            self.path.parent.rmdir()  # a run that failed before writing anything leaves no folder

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
