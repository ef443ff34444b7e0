"""Names inside a run folder, and the atomic ``paddle.save`` every writer of it uses.

The engine writes these files; weights loading, sweeps and the report read them. Keeping the
names here lets the readers below the engine find a run's weights without importing it.
"""
from __future__ import annotations

from pathlib import Path

import paddle

from zoo.utils.fileio import atomic_write

__all__ = ["BEST", "CKPT_DIR", "LAST", "atomic_save", "best_weights", "last_checkpoint"]

LAST = "last.pdckpt"
BEST = "best.pdparams"
CKPT_DIR = "checkpoints"


def last_checkpoint(run_dir: str | Path) -> Path:
    """``<run_dir>/checkpoints/last.pdckpt``: the latest complete training checkpoint of a run."""
    return Path(run_dir) / CKPT_DIR / LAST


def best_weights(run_dir: str | Path) -> Path:
    """``<run_dir>/checkpoints/best.pdparams``: the weights of a run's best evaluation."""
    return Path(run_dir) / CKPT_DIR / BEST


def atomic_save(obj, path: str | Path) -> Path:
    """``paddle.save`` to ``path`` through a temp file + rename (never a partial file)."""
    return atomic_write(path, lambda tmp: paddle.save(obj, str(tmp)))
