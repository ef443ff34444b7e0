"""tools/eval.py's body: evaluate a checkpoint with the same configs training used."""
from __future__ import annotations

import time
from pathlib import Path

import paddle
from omegaconf import DictConfig

from zoo.amp import current_device
from zoo.engine import checkpoint as ckpt
from zoo.engine.evaluate import draw_samples, evaluate
from zoo.engine.run import build, build_amp, build_data, seed_everything, validate
from zoo.engine.runinfo import announce, git_revision, write_json


def resolve_weights(path: str | Path) -> tuple[dict, str]:
    """Model weights from a run folder, a training checkpoint or a weights file, and what was used.

    A run folder gives its best weights (``checkpoints/best.pdparams``) when training kept them,
    else the last checkpoint. A training checkpoint gives its EMA weights when it has them (those
    are what training evaluated), else its model weights.
    """
    path = Path(path)
    if path.is_dir():
        best = path / ckpt.CKPT_DIR / ckpt.BEST
        path = best if best.is_file() else path / ckpt.CKPT_DIR / ckpt.LAST
    if not path.is_file():
        raise ckpt.CheckpointError(f"checkpoint: nothing to evaluate at {path}")
    state = ckpt.read(path)
    if isinstance(state, dict) and "model" in state and "step" in state:
        if state.get("ema"):
            return state["ema"]["shadow"], f"{path} (EMA weights, step {state['step']})"
        return state["model"], f"{path} (step {state['step']})"
    if not isinstance(state, dict):
        raise ckpt.CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict")
    return state, str(path)


def evaluate_weights(cfg: DictConfig) -> tuple:
    """Build model, task, AMP and the validation split from ``cfg``, load ``cfg.checkpoint`` and
    evaluate: (metrics, task after the evaluation, model, validation set, amp, weights source)."""
    validate(cfg)
    amp = build_amp(cfg)
    seed_everything(cfg.seed)
    device = current_device()
    _, val_set, _ = build_data(cfg)
    model = build(cfg.model.net, "model.net")
    task = build(cfg.model.task, "model.task")
    weights, source = resolve_weights(cfg.checkpoint)
    ckpt.check_fits(model, weights, source, f"model {cfg.model.name}")
    model.set_state_dict(weights)
    model, _ = amp.setup(model, None, device)
    announce(amp.describe(device))
    metrics = evaluate(model, task, amp, val_set, cfg.model.eval_batch_size,
                       cfg.trainer.num_workers, cfg.trainer.progress)
    return metrics, task, model, val_set, amp, source


def evaluate_checkpoint(cfg: DictConfig, out_dir: str | Path) -> dict:
    """Evaluate ``cfg.checkpoint`` (:func:`evaluate_weights`) and write JSON."""
    t0 = time.time()
    metrics, task, model, val_set, amp, source = evaluate_weights(cfg)
    device = current_device()
    result = {"model": cfg.model.name, "data": cfg.data.name, "checkpoint": source,
              "requested_precision": amp.requested, "effective_precision": amp.effective,
              "device": device.name, "metrics": metrics,
              "primary_metric": {"name": task.primary_metric, "value": metrics[task.primary_metric]},
              "num_samples": len(val_set), "wall_time_s": time.time() - t0,
              "paddle_version": paddle.__version__, "git_revision": git_revision()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = draw_samples(task, model, val_set, cfg.trainer.draw_samples, out_dir / "drawings", "eval")
    result["drawings"] = [str(p) for p in drawn]
    write_json(out_dir / "eval.json", result)
    if cfg.get("output"):
        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(cfg.output), result)
    return result
