"""Build a run from a composed config and execute it: the body behind tools/train.py and tools/eval.py.

Objects are created here and only here with ``hydra.utils.instantiate`` (STYLE.md); classes receive
plain arguments, never the config. Everything a user can get wrong is checked before training
starts, and errors name the config key.
"""
from __future__ import annotations

import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import paddle
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import zoo
from zoo.amp import current_device
from zoo.engine import distributed as dist
from zoo.engine import final_eval, provenance
from zoo.engine.ema import ModelEMA
from zoo.engine.runinfo import git_revision, peak_memory_mb, write_json
from zoo.engine.trainer import Trainer, TrainerSettings

log = logging.getLogger(__name__)


# trainer.* keys read by this module, not by the loop (TrainerSettings)
RUN_LEVEL_TRAINER_KEYS = ("ema_decay", "eval_precision", "bootstrap_resamples")


class ConfigError(ValueError):
    """A config value is unusable; the message starts with the key."""


def build(node: DictConfig, key: str, **kwargs):
    """``instantiate`` with the original error (and the config key) instead of Hydra's wrapper."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as e:
        cause = e.__cause__ or e
        msg = str(cause)
        raise ConfigError(msg if msg.split(":")[0].startswith(key.split(".")[0]) else f"{key}: {msg}") from cause


def _positive_int(cfg: DictConfig, key: str) -> int:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{key}: expected a positive integer, got {value!r}")
    return value


def validate(cfg: DictConfig) -> None:
    """Checks Hydra cannot make (unknown keys and group choices Hydra already rejects)."""
    _positive_int(cfg, "model.batch_size")
    _positive_int(cfg, "model.eval_batch_size")
    if cfg.model.net.get("name") not in zoo.list_models():
        raise ConfigError(f"model.net.name: unknown model {cfg.model.net.get('name')!r}; "
                          f"known: {', '.join(zoo.list_models())}")
    lr = cfg.optim.lr
    if not isinstance(lr, (int, float)) or lr <= 0:
        raise ConfigError(f"optim.lr: expected a positive number, got {lr!r}")
    if "root" in cfg.data and not Path(str(cfg.data.root)).exists():
        raise ConfigError(f"data.root: {cfg.data.root} does not exist (data={cfg.data.name})")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)


def build_amp(cfg: DictConfig):
    return build(cfg.amp, "amp")


def build_data(cfg: DictConfig):
    data = build(cfg.data.builder, "data")
    return data.build("train", cfg.seed), data.build("val", cfg.seed)


def build_optimizer(cfg: DictConfig, model, steps_per_epoch: int, total_steps: int):
    """LR scheduler first, then the optimizer partial with it (Paddle's order)."""
    global_batch = cfg.model.batch_size * dist.world_size()
    base = cfg.optim.get("base_batch_size")
    lr = float(cfg.optim.lr) * (global_batch / base if base else 1.0)
    sched = build(cfg.sched, "sched")(base_lr=lr, total_steps=total_steps, steps_per_epoch=steps_per_epoch)
    clip = cfg.optim.get("grad_clip_norm")
    grad_clip = paddle.nn.ClipGradByGlobalNorm(float(clip)) if clip else None
    opt = build(cfg.optim.optimizer, "optim.optimizer")(learning_rate=sched, parameters=model.parameters(),
                                                        grad_clip=grad_clip)
    return opt, sched, lr


def build_trainer(cfg: DictConfig, out_dir: Path) -> tuple[Trainer, dict]:
    """Everything a run needs, validated, in the order that fails fastest."""
    validate(cfg)
    amp = build_amp(cfg)
    settings = TrainerSettings(**{k: v for k, v in OmegaConf.to_container(cfg.trainer).items()
                                  if k not in RUN_LEVEL_TRAINER_KEYS})
    final_eval.check_settings(cfg.trainer.get("eval_precision", "train"),
                              cfg.trainer.get("bootstrap_resamples", 0))
    seed_everything(cfg.seed)
    dist.init()
    device = current_device()
    train_set, val_set = build_data(cfg)
    names = getattr(val_set, "class_names", None)  # detection sets know their classes
    if names and "num_classes" in cfg.data and len(names) != int(cfg.data.num_classes):
        raise ConfigError(f"data.num_classes: {cfg.data.num_classes}, but data={cfg.data.name} has "
                          f"{len(names)} classes ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''})")
    model = build(cfg.model.net, "model.net")
    task = build(cfg.model.task, "model.task")
    per_epoch = len(train_set) // (cfg.model.batch_size * dist.world_size())
    if per_epoch == 0:
        raise ConfigError(f"model.batch_size: {cfg.model.batch_size} x {dist.world_size()} ranks exceeds "
                          f"the {len(train_set)} training samples of data={cfg.data.name}")
    # Before O2 decoration and any resume: what a run with this seed starts from (pairing check).
    pairing = provenance.pairing_digests(model, train_set, cfg.model.batch_size, cfg.seed)
    if settings.epochs:  # the run's length, derived once; the trainer only counts steps
        settings.max_steps = math.ceil(settings.epochs * per_epoch)
    total = settings.max_steps
    optimizer, sched, lr = build_optimizer(cfg, model, per_epoch, total)
    model, optimizer = amp.setup(model, optimizer, device)
    ema = ModelEMA(model, cfg.trainer.ema_decay) if cfg.trainer.get("ema_decay") else None
    model = dist.wrap(model)
    trainer = Trainer(model, task, amp, optimizer, sched, train_set, val_set, cfg.model.batch_size,
                      cfg.model.eval_batch_size, cfg.seed, settings, out_dir, ema=ema,
                      config_yaml=OmegaConf.to_yaml(cfg, resolve=True))
    info = {"device": device.name, "lr": lr, "amp": amp, "device_info": device, "pairing": pairing,
            "data_version": provenance.dataset_version(train_set)}
    return trainer, info


def train(cfg: DictConfig, out_dir: str | Path) -> dict:
    """Train as configured; write config.yaml, metrics.jsonl, checkpoints/ and summary.json."""
    t0 = time.time()
    out_dir = Path(out_dir)
    trainer, info = build_trainer(cfg, out_dir)
    amp = info["amp"]
    if dist.is_main():
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(trainer.config_yaml)
        print(amp.describe(info["device_info"]), flush=True)
    result = trainer.fit()
    evals = final_eval.after_training(trainer, lambda: build(cfg.model.net, "model.net"), result["metrics"],
                                      cfg.trainer.get("eval_precision", "train"),
                                      cfg.trainer.get("bootstrap_resamples", 0))
    digests = dist.gather_digests(dist.parameter_digest(trainer.model))
    peak_mb, peak_kind = peak_memory_mb()
    primary = trainer.task.primary_metric
    summary = {
        "status": "completed", "model": cfg.model.name, "data": cfg.data.name, "seed": cfg.seed,
        "requested_precision": amp.requested, "effective_precision": amp.effective,
        "precision_reason": amp.reason, "device": info["device"], "world_size": dist.world_size(),
        "batch_size_per_rank": cfg.model.batch_size,
        "global_batch_size": cfg.model.batch_size * dist.world_size(), "lr": info["lr"],
        "steps": trainer.step, "epochs": trainer.step / result["steps_per_epoch"],
        "primary_metric": {"name": primary, "value": result["metrics"][primary]},
        "metrics": result["metrics"], "best": result["best"],
        "images_per_s": result["images_per_s"], "train_time_s": result["train_time_s"],
        "wall_time_s": time.time() - t0, "skipped_steps": amp.skipped_steps,
        "final_loss_scale": amp.loss_scale, "loss_scaler": amp.scaler_args if amp.scaler else None,
        "guard_events": amp.guard.events[-100:], "guard_event_count": len(amp.guard.events),
        "paddle_version": paddle.__version__, "git_revision": git_revision(),
        "resumed_from": result["resumed_from"], "param_digests": digests,
        "versions": provenance.library_versions(), "data_version": info["data_version"],
        "config_digest": provenance.config_digest(cfg),
        "config_digest_excludes": list(provenance.CONFIG_DIGEST_EXCLUDES), "pairing": info["pairing"],
        "ranks_in_sync": len(set(digests)) == 1, "run_dir": str(out_dir),
        "peak_memory_mb": round(peak_mb, 1), "peak_memory_kind": peak_kind,
        **evals,
    }
    if dist.is_main():
        write_json(out_dir / "summary.json", summary)
        print(f"{primary} {summary['primary_metric']['value']:.4f} after {trainer.step} steps "
              f"({summary['effective_precision']}); run folder {out_dir}", flush=True)
    if not summary["ranks_in_sync"]:
        raise RuntimeError(f"ranks ended with different parameters: {digests}")
    return summary
