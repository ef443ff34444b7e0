"""The run folder: no debris from killed writers, one run at a time, resume only with the same settings."""
from __future__ import annotations

import os
import subprocess

from zoo.fileio import atomic_write


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_temp_files_of_killed_writers_are_removed_at_the_next_write(tmp_path):
    target = tmp_path / "checkpoints" / "last.pdckpt"
    target.parent.mkdir()
    dead = target.with_name(f".last.pdckpt.tmp{_dead_pid()}")
    live = target.with_name(f".last.pdckpt.tmp{os.getppid()}")  # a writer still at work: left alone
    other = target.with_name(f".best.pdparams.tmp{_dead_pid()}")  # another file's: not ours to judge
    for p in (dead, live, other):
        p.write_bytes(b"half a checkpoint")
    atomic_write(target, lambda tmp: tmp.write_bytes(b"complete"))
    assert target.read_bytes() == b"complete"
    assert not dead.exists() and live.exists() and other.exists()
