"""Checkpoints: atomic writes, complete training state, and whether a resume may use one.

A checkpoint holds model, optimizer (with its LR scheduler), AMP scaler, EMA, step, RNG states and
the resolved config, so a killed run continues exactly (detectron2 and mmengine keep the scaler;
PaddleClas does not). Writes go to a temporary file in the same folder and are renamed into place,
so a kill mid-write never leaves a truncated ``last.pdckpt``. Which checkpoint a run continues, and
the mark on the run it continued, are zoo/engine/resume.py's.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import paddle

from zoo.utils.runfolder import BEST, CKPT_DIR, LAST, atomic_save, best_weights, last_checkpoint  # noqa: F401  (re-exported: the engine's names)
from zoo.weights import safe_load
from zoo.weights.loading import compare_state_dict

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit this run; the message names the file."""


def read(path: str | Path):
    """Whatever ``paddle.save`` wrote at ``path``, with errors naming the file.

    Read by :func:`zoo.weights.safe_load` (plain data only: a pickle that would run code is refused),
    returning what ``paddle.load`` would.
    """
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


# Settings a resumed run may change without breaking what it continues (logged, not refused):
# how often it logs/evaluates/saves, how it loads data, how long it runs, how it is resumed, what
# it predicts beside (trainer.predict_memory).
SAFE_TO_CHANGE_ON_RESUME = (
    "trainer.resume", "trainer.resume_allow_changes", "trainer.log_every", "trainer.eval_every",
    "trainer.ckpt_every", "trainer.progress", "trainer.num_workers", "trainer.draw_samples",
    "trainer.max_steps", "trainer.epochs", "trainer.final_eval", "model.eval_batch_size",
    "trainer.compile", "trainer.predict_memory",
)
# Records, not settings: what an experiment reproduces (its published figure) may change on resume.
SAFE_PREFIXES_ON_RESUME = ("published.",)
# Keys added after checkpoints were written, with the value that does what the code did before them:
# absent from a saved config and set to it now, they are no change.
ADDED_KEYS = {"trainer.drop_last": True,
              # the classification data configs list these since issue 37 (the crop and no Mixup of before)
              "data.builder.crop_sampler": "torchvision", "data.builder.mixup_alpha": None,
              "amp.fp32_layers": []}  # no layer kept fp32: what every run did before the key (issue 36)


def checkpoint_config(cfg) -> str:
    """The resolved config a checkpoint keeps (and a resume compares) without ``logger``: where a run
    is tracked is not what it trains, so a resume may add, drop or repoint a logger."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True)
    return OmegaConf.to_yaml(OmegaConf.create({k: v for k, v in plain.items() if k != "logger"}))


def _safe(key: str) -> bool:
    return key in SAFE_TO_CHANGE_ON_RESUME or key.startswith(SAFE_PREFIXES_ON_RESUME)


def _flatten(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def config_changes(saved_yaml: str, new_yaml: str) -> dict[str, tuple]:
    """``{key: (saved value, new value)}`` for every leaf that differs between two resolved configs."""
    import yaml

    old, new = _flatten(yaml.safe_load(saved_yaml) or {}), _flatten(yaml.safe_load(new_yaml) or {})
    missing = object()
    for key, before in ADDED_KEYS.items():  # written before the key existed: it did what ``before`` does
        if key not in old and key in new:
            old[key] = before
    return {k: (old.get(k, "<absent>"), new.get(k, "<absent>")) for k in sorted(set(old) | set(new))
            if old.get(k, missing) != new.get(k, missing)}


def unsafe_changes(saved_yaml: str, new_yaml: str) -> dict[str, tuple]:
    """The changes of :func:`config_changes` that a resume may not make (not in
    :data:`SAFE_TO_CHANGE_ON_RESUME`)."""
    return {k: v for k, v in config_changes(saved_yaml, new_yaml).items() if not _safe(k)}


def check_resume_config(saved_yaml: str | None, new_yaml: str, source, allow_changes: bool) -> dict:
    """Compare a checkpoint's config with this run's before resuming from it.

    Changes to :data:`SAFE_TO_CHANGE_ON_RESUME` keys are returned as ``safe``; any other change
    (batch size, model, data, amp, optimizer, schedule, seed, ...) raises :class:`CheckpointError`
    listing the keys, unless ``allow_changes`` (``trainer.resume_allow_changes=true``), when they
    are returned as ``overridden``. Values are ``[saved, new]`` pairs, for summary.json.
    """
    if not saved_yaml:
        log.warning("%s holds no config (older checkpoint format): cannot check the resumed settings", source)
        return {"safe": {}, "overridden": {}, "checked": False}
    changes = config_changes(saved_yaml, new_yaml)
    safe = {k: list(v) for k, v in changes.items() if _safe(k)}
    unsafe = {k: list(v) for k, v in changes.items() if not _safe(k)}
    listing = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(unsafe.items())[:12])
    more = f"; and {len(unsafe) - 12} more" if len(unsafe) > 12 else ""
    if unsafe and not allow_changes:
        raise CheckpointError(
            f"cannot resume from {source}: these settings differ from the run being resumed: {listing}{more}. "
            "Run with the checkpoint's settings, start a fresh run (no trainer.resume), or pass "
            "trainer.resume_allow_changes=true to continue anyway (recorded in summary.json)")
    if unsafe:
        log.warning("resuming from %s with changed settings (trainer.resume_allow_changes=true): %s%s",
                    source, listing, more)
    if safe:
        log.info("resuming with changed settings that are safe to change: %s",
                 "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in safe.items()))
    return {"safe": safe, "overridden": unsafe, "checked": True}


def check_fits(model, weights: dict, source, what: str) -> None:
    """Raise :class:`CheckpointError` unless ``weights`` has exactly ``model``'s keys and shapes.

    Missing, unexpected and shape-mismatched keys are listed separately (Paddle's own
    ``set_state_dict`` reports a shape mismatch as both missing and unexpected).
    """
    report = compare_state_dict(model.state_dict(), weights)
    if report["missing"] or report["unexpected"] or report["shape_mismatch"]:
        parts = [f"{k.replace('_', ' ')} {len(report[k])} {report[k][:5]}"
                 for k in ("missing", "unexpected", "shape_mismatch") if report[k]]
        raise CheckpointError(f"{source} does not fit {what}: " + "; ".join(parts))


def rng_state() -> dict:
    """Python, NumPy and Paddle generator states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "paddle": paddle.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    paddle.set_rng_state(state["paddle"])


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
