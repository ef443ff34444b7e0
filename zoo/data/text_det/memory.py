"""Keep freed heap memory in the loading process (glibc ``mallopt``), so full-size maps reuse pages.

A DB train item allocates and frees some ten full-size float32 arrays (640x640: 1.6 MB each; the
image, the border/shrink maps and masks, the border map's temporaries). With glibc's defaults each
such block is either mmapped and unmapped (below the dynamic mmap threshold's reach) or freed at
the top of the heap and trimmed back to the kernel, so the next item faults in fresh zeroed pages:
on this machine that was most of the label maps' cost (``python -m zoo.bench.labels``,
5 quads: border 4.6 -> 1.6 ms, shrink 1.7 -> 0.2 ms with the thresholds below, MODEL_CARDS.md).

:func:`keep_freed_memory` sets ``M_TRIM_THRESHOLD`` (free memory at the heap's top is given back
only beyond this much) and ``M_MMAP_THRESHOLD`` (blocks of at least this size get their own
mapping, unmapped when freed) to the same byte count, as ``MALLOC_TRIM_THRESHOLD_`` /
``MALLOC_MMAP_THRESHOLD_`` would; ``data.builder.keep_freed_memory`` (:func:`check_keep_freed_memory`)
chooses it, and the dataset applies it in each process that loads items (zoo/data/loader.py). The
cost: a process keeps up to that much freed memory resident instead of returning it, so its RSS
stays near its peak. Where glibc is absent (macOS, musl, Windows) it does nothing, with a debug log.
"""
from __future__ import annotations

import ctypes
import logging
import os

__all__ = ["DEFAULT_KEEP_BYTES", "check_keep_freed_memory", "keep_freed_memory"]
log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
DEFAULT_KEEP_BYTES = 256 << 20  # `true`: 256 MiB, the figure measured in MODEL_CARDS.md
MIN_KEEP_BYTES = 1 << 20  # below a 640 map (1.6 MB) the setting would not keep what it is for
MAX_KEEP_BYTES = 2**31 - 1  # mallopt takes an int
KEY = "data.builder.keep_freed_memory"

_applied: dict[int, int] = {}  # pid -> byte count already set in that process


def check_keep_freed_memory(value) -> int:
    """The byte count ``value`` of ``data.builder.keep_freed_memory`` stands for; 0 = off.

    ``true`` = :data:`DEFAULT_KEEP_BYTES`, ``false`` (or null) = off, an integer = that many bytes
    (1 MiB .. 2 GiB - 1). Anything else raises ``ValueError`` naming the key.
    """
    if value is None or value is False:
        return 0
    if value is True:
        return DEFAULT_KEEP_BYTES
    if isinstance(value, int) and MIN_KEEP_BYTES <= value <= MAX_KEEP_BYTES:
        return int(value)
    raise ValueError(f"{KEY}: expected true (keep up to {DEFAULT_KEEP_BYTES >> 20} MiB of freed memory per "
                     f"loading process), false (glibc's defaults) or a byte count from {MIN_KEEP_BYTES} to "
                     f"{MAX_KEEP_BYTES}, got {value!r}")


def _libc():
    """glibc through ctypes, or None where this is not glibc (no ``mallopt`` / ``gnu_get_libc_version``)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (musl has mallopt as a stub; only glibc has this)
        return libc if hasattr(libc, "mallopt") else None
    except (OSError, AttributeError):
        return None


def keep_freed_memory(nbytes: int) -> bool:
    """In this process, let glibc keep up to ``nbytes`` of freed memory (see the module docstring).

    Once per process and byte count (a forked worker applies it again: it is a new pid). ``0``
    does nothing. Returns True when both thresholds were set; False (debug log) without glibc or
    when glibc refused a value (then a warning names it).
    """
    nbytes = int(nbytes)
    pid = os.getpid()
    if nbytes <= 0 or _applied.get(pid) == nbytes:
        return nbytes > 0
    libc = _libc()
    if libc is None:
        log.debug("%s: not glibc, malloc thresholds left as they are", KEY)
        _applied[pid] = nbytes
        return False
    ok = True
    for name, param in (("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD), ("M_MMAP_THRESHOLD", M_MMAP_THRESHOLD)):
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(nbytes)) != 1:
            log.warning("%s: glibc refused mallopt(%s, %d); that threshold keeps its default", KEY, name, nbytes)
            ok = False
    _applied[pid] = nbytes
    log.debug("%s: pid %d keeps up to %d bytes of freed memory", KEY, pid, nbytes)
    return ok
