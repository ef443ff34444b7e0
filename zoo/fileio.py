"""Atomic file writes: a reader sees the old file or the complete new one, never a partial one."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def with_filename(err: OSError, path) -> OSError:
    """``err`` naming ``path`` (a failed ``write()`` on a full disk carries no file name)."""
    if err.filename:
        return err
    return type(err)(err.errno, err.strerror or str(err), str(path))


def atomic_write(path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary sibling of ``path``, fsync it, then rename it into place.

    The temporary file is removed whatever happens; the parent folder is created if needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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
