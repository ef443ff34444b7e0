"""Where ampzoo keeps generated or downloaded artefacts on local disk.

Resolution order for the cache root:

1. ``$AMPZOO_HOME`` (everything lives directly below it),
2. ``$XDG_CACHE_HOME/ampzoo``,
3. ``~/.cache/ampzoo``.

Tests set ``AMPZOO_HOME`` to a temporary directory so that nothing is written
to the real home directory.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

__all__ = ["ampzoo_home", "cache_dir", "publish_atomically"]


def ampzoo_home() -> Path:
    """Return the root of the ampzoo cache (not created)."""
    home = os.environ.get("AMPZOO_HOME")
    if home:
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "ampzoo"
    return Path.home() / ".cache" / "ampzoo"


def cache_dir(*parts: str) -> Path:
    """Return ``ampzoo_home() / parts...``.

    The directory is *not* created: callers that publish a directory
    atomically (write to a temporary sibling, then ``os.rename``) must only
    create the parent, never the final path itself.
    """
    for part in parts:
        # A part like "../x" or "/abs" would silently escape the cache root.
        if not part or Path(part).is_absolute() or ".." in Path(part).parts:
            raise ValueError(f"cache_dir: invalid path component {part!r}")
    return ampzoo_home().joinpath(*parts)


def _remove_stale_temps(parent: Path, name: str) -> None:
    """Delete temp folders of ``name`` left on this host by processes that died.

    Temps of live processes (concurrent ranks) and of other hosts (shared filesystems) are left
    alone; they are never read either way.
    """
    prefix = f"{name}.tmp-{socket.gethostname()}-"
    for entry in parent.glob(f"{name}.tmp-*"):
        pid = entry.name[len(prefix):] if entry.name.startswith(prefix) else ""
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            if int(pid) != os.getpid():
                continue  # still running
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(entry, ignore_errors=True)


def publish_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Create folder ``target`` with ``build(tmp)`` in a temp sibling, then rename it into place.

    A killed build never leaves a half-written ``target``; if another process publishes the same
    folder first, its copy is kept (builders are deterministic, so the two are identical).
    """
    target = Path(target)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(target.parent, target.name)
    tmp = target.parent / f"{target.name}.tmp-{socket.gethostname()}-{os.getpid()}"
    try:
        build(tmp)
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
