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
from pathlib import Path

__all__ = ["ampzoo_home", "cache_dir"]


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
