"""Drop one known line that Paddle's C++ code (glog) writes to file descriptor 2.

glog writes from C++ straight to fd 2, past ``sys.stderr`` and the ``warnings`` module, so no Python
filter reaches it. :func:`dropping_stderr_lines` points fd 2 at a temporary file for the duration
of a short call, then writes everything captured back to the real fd 2, in order, except the lines
that match one of the given patterns exactly. Nothing else is lost or reordered; it is only
delayed until the call returns (use it around calls of seconds, never around a training loop).

The one use: ``paddle.jit.save`` (zoo/export/inference.py). In Paddle 3.x PIR mode, ``x + y`` on
two graph values goes through ``paddle.add``, which calls ``_C_ops.add(x, y, out=None)``, and the
C++ argument parser warns (once per process) ``Paddle static graph(PIR) not support input out
tensor for now!!!!!`` because an ``out`` argument was passed at all, though it is None. The zoo's
code passes no ``out=``; every residual connection of every model triggers it inside Paddle.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence

__all__ = ["PIR_OUT_TENSOR_WARNING", "dropping_stderr_lines"]

# W1204 04:15:11.275440 28360 eager_utils.cc:3584] Paddle static graph(PIR) not support input out tensor for now!!!!!
PIR_OUT_TENSOR_WARNING = re.compile(
    r"W\d{4} [\d:.]+ +\d+ eager_utils\.cc:\d+\] Paddle static graph\(PIR\) not support input out tensor for now!*")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


@contextlib.contextmanager
def dropping_stderr_lines(patterns: Sequence[re.Pattern]) -> Iterator[None]:
    """Within the block, lines written to fd 2 that fully match one of ``patterns`` are dropped; the
    rest reach fd 2 when the block ends (also when it raises). Without a usable fd 2, a no-op."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as capture:
        _flush()
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            _flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().splitlines(keepends=True)
                    if not any(p.fullmatch(line.decode("utf-8", "replace").rstrip("\r\n")) for p in patterns)]
            if kept:
                os.write(2, b"".join(kept))
