"""tools/eval.py's body: evaluate a checkpoint with the same configs training used."""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import paddle
from omegaconf import DictConfig

from zoo.amp import current_device
from zoo.engine import checkpoint as ckpt
from zoo.engine.evaluate import draw_samples, evaluate, nonfinite_line
from zoo.engine.from_run import resolve_weights, run_source
from zoo.engine.run import ConfigError, build, build_amp, seed_everything, validate
from zoo.engine.runinfo import announce, git_revision, write_json

__all__ = ["evaluate_checkpoint", "evaluate_weights"]


def evaluate_weights(cfg: DictConfig) -> tuple:
    """Build model, task, AMP and the validation split from ``cfg``, load ``cfg.run`` (or its older
    name ``cfg.checkpoint``) and evaluate: (metrics, task after the evaluation, model, validation
    set, amp, weights source). Only the validation split is read: the training one need not exist."""
    given = run_source(cfg, "checkpoint")
    if given is None:
        raise ConfigError("run: missing: pass run=<run folder> (or a training checkpoint / weights file; "
                          "checkpoint= is its older name)")
    validate(cfg)
    amp = build_amp(cfg)
    weights, source = resolve_weights(given[1], given[0])  # before the data: a wrong path fails at once
    seed_everything(cfg.seed)
    device = current_device()
    val_set = build(cfg.data.builder, "data").build("val", cfg.seed)
    model = build(cfg.model.net, "model.net")
    task = build(cfg.model.task, "model.task")
    ckpt.check_fits(model, weights, source, f"model {cfg.model.name}")
    model.set_state_dict(weights)
    model, _ = amp.setup(model, None, device)
    announce(amp.describe(device))
    metrics = evaluate(model, task, amp, val_set, cfg.model.eval_batch_size,
                       cfg.trainer.num_workers, cfg.trainer.progress)
    said = nonfinite_line(metrics, amp.effective)
    if said:
        announce(f"warning: {said}", sys.stderr, logging.WARNING)
    return metrics, task, model, val_set, amp, source


def evaluate_checkpoint(cfg: DictConfig, out_dir: str | Path) -> dict:
    """Evaluate ``cfg.run`` (:func:`evaluate_weights`) and write JSON."""
    t0 = time.time()
    metrics, task, model, val_set, amp, source = evaluate_weights(cfg)
    device = current_device()
    result = {"model": cfg.model.name, "data": cfg.data.name, "checkpoint": source,
              "run": (run_source(cfg, "checkpoint") or (None, None))[1],
              "requested_precision": amp.requested, "effective_precision": amp.effective,
              "device": device.name, "metrics": dict(metrics), "numerics": metrics.numerics,
              "primary_metric": {"name": task.primary_metric, "value": metrics[task.primary_metric],
                                 "nonfinite_images": metrics.numerics["nonfinite_images"]},
              "num_samples": len(val_set), "wall_time_s": time.time() - t0,
              "paddle_version": paddle.__version__, "git_revision": git_revision()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = draw_samples(task, model, val_set, cfg.trainer.draw_samples, out_dir / "drawings",
                         f"eval_{amp.effective}", amp, f"predictions in {amp.effective}")
    result["drawings"] = [str(p) for p in drawn]
    write_json(out_dir / "eval.json", result)
    if cfg.get("output"):
        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(cfg.output), result)
    return result
