"""Checkpoints: atomic writes, complete training state, and finding what to resume from.

A checkpoint holds model, optimizer (with its LR scheduler), AMP scaler, EMA, step, RNG states and
the resolved config, so a killed run continues exactly (detectron2 and mmengine keep the scaler;
PaddleClas does not). Writes go to a temporary file in the same folder and are renamed into place,
so a kill mid-write never leaves a truncated ``last.pdckpt``.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import paddle

from zoo.fileio import atomic_write

log = logging.getLogger(__name__)

LAST = "last.pdckpt"
BEST = "best.pdparams"
CKPT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit this run; the message names the file."""


def atomic_save(obj, path: str | Path) -> Path:
    """``paddle.save`` to ``path`` through a temp file + rename (never a partial file)."""
    return atomic_write(path, lambda tmp: paddle.save(obj, str(tmp)))


def read(path: str | Path):
    """Whatever ``paddle.save`` wrote at ``path``, with errors naming the file.

    Read by :func:`zoo.weights.safe_load` (plain data only: a pickle that would run code is refused),
    returning what ``paddle.load`` would.
    """
    from zoo.weights import safe_load

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        return safe_load(path)
    except Exception as e:  # refused globals, corrupt pickles, tensor conversion
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e


def load(path: str | Path) -> dict:
    """Load a checkpoint written by :func:`atomic_save`, with an error naming the file."""
    state = read(path)
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise CheckpointError(f"{path} is not an ampzoo training checkpoint (needs 'model' and 'step')")
    return state


def rng_state() -> dict:
    """Python, NumPy and Paddle generator states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "paddle": paddle.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    paddle.set_rng_state(state["paddle"])


def _unfinished_run(run_dir: Path) -> Path | None:
    ckpt = run_dir / CKPT_DIR / LAST
    return ckpt if ckpt.is_file() and not (run_dir / "summary.json").exists() else None


def find_resume(resume, out_dir: Path) -> Path | None:
    """Resolve ``trainer.resume`` (null | auto | path to a checkpoint or run folder) to a file.

    ``auto`` takes this run folder's checkpoint if it has one, else the newest unfinished sibling
    run (same parent folder, i.e. same run name: the run that was killed), else starts fresh.
    """
    if resume in (None, False, "", "null", "none"):
        return None
    if resume == "auto":
        own = out_dir / CKPT_DIR / LAST
        if own.is_file():
            return own
        siblings = sorted((p for p in out_dir.parent.iterdir() if p.is_dir() and p != out_dir),
                          key=lambda p: p.name, reverse=True) if out_dir.parent.is_dir() else []
        for sib in siblings:
            found = _unfinished_run(sib)
            if found is not None:
                return found
        log.info("trainer.resume=auto: no unfinished run of this name under %s; starting fresh",
                 out_dir.parent)
        return None
    path = Path(str(resume))
    if path.is_dir():
        path = path / CKPT_DIR / LAST
    if not path.is_file():
        raise CheckpointError(f"trainer.resume={resume}: no checkpoint at {path}")
    return path


# Paddle keys optimizer state by parameter *variable* names (``conv2d_60.w_0_velocity_0``), which
# depend on how many layers the process built before. A checkpoint keys it by the model's
# structured names instead, so it loads into a model built in any process.
_SEP = "::"


def _name_maps(model) -> tuple[dict[str, str], dict[str, str]]:
    to_struct = {p.name: n for n, p in model.named_parameters()}
    return to_struct, {v: k for k, v in to_struct.items()}


def _rename(key: str, table: dict[str, str], sep_in: str, sep_out: str) -> str:
    # Longest match first: "conv2d_6.w_0" must not claim "conv2d_60.w_0_velocity_0".
    for name in sorted(table, key=len, reverse=True):
        if key.startswith(name + sep_in):
            return table[name] + sep_out + key[len(name) + len(sep_in):]
    return key


def _remap(state: dict, table: dict[str, str], sep_in: str, sep_out: str) -> dict:
    out = {}
    for k, v in state.items():
        if k == "master_weights" and isinstance(v, dict):
            out[k] = {table.get(n, n): t for n, t in v.items()}
        else:
            out[k if k in table else _rename(k, table, sep_in, sep_out)] = v
    return out


def optimizer_state_portable(opt_state: dict, model) -> dict:
    """Optimizer state with variable names replaced by structured parameter names."""
    return _remap(opt_state, _name_maps(model)[0], "_", _SEP)


def optimizer_state_local(state: dict, model) -> dict:
    """Inverse of :func:`optimizer_state_portable` for the parameters of this process's model."""
    return _remap(state, _name_maps(model)[1], _SEP, "_")
