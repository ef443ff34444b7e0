"""Atomic file writes: a reader sees the old file or the complete new one, never a partial one."""
from __future__ import annotations

import glob
import os
from collections.abc import Callable
from pathlib import Path


def with_filename(err: OSError, path) -> OSError:
    """``err`` naming ``path`` (a failed ``write()`` on a full disk carries no file name)."""
    if err.filename:
        return err
    return type(err)(err.errno, err.strerror or str(err), str(path))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temps(path) -> list[Path]:
    """Delete ``.<name>.tmp<PID>`` siblings of ``path`` left by writers killed mid-write (PID gone)."""
    path = Path(path)
    removed = []
    prefix = f".{path.name}.tmp"
    for tmp in path.parent.glob(f"{glob.escape(prefix)}*") if path.parent.is_dir() else ():
        pid = tmp.name[len(prefix):]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def atomic_write(path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary sibling of ``path``, fsync it, then rename it into place.

    The temporary file is removed whatever happens (a kill -9 cannot be caught: the next write of
    the same file removes what such a writer left); the parent folder is created if needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise with_filename(e, path) from e
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
