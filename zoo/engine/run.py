"""Build a run from a composed config and execute it: the body behind tools/train.py and tools/eval.py.

Objects are created here and only here with ``hydra.utils.instantiate`` (STYLE.md); classes receive
plain arguments, never the config. Everything a user can get wrong is checked before training
starts, and errors name the config key.
"""
from __future__ import annotations

import logging
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import paddle
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import zoo
from zoo.amp import current_device
from zoo.amp.amp import SETTINGS as AMP_SETTINGS
from zoo.amp.nonfinite import describe as describe_nonfinite
from zoo.amp.numerics_guard import SETTINGS as GUARD_SETTINGS
from zoo.amp.numerics_guard import NumericsGuardStop
from zoo.data.classification.mixup import MIXUP_ALPHA
from zoo.engine import checkpoint as ckpt
from zoo.engine import final_eval, provenance, resume
from zoo.engine import summary as run_summary
from zoo.engine.compiled import check_compile
from zoo.engine.ema import ModelEMA
from zoo.engine.runinfo import announce, git_revision, write_json
from zoo.engine.runlock import RunLock
from zoo.engine.schedules import SETTINGS as SCHED_SETTINGS
from zoo.engine.schedules import clipped_warmup_message
from zoo.engine.summary import RunFacts
from zoo.engine.task_rules import task_settings
from zoo.engine.trainer import SETTINGS as TRAINER_SETTINGS
from zoo.engine.trainer import Trainer, TrainerSettings
from zoo.tracking import Tracker
from zoo.utils import distributed as dist
from zoo.utils.checks import (
    ABSENT,
    COUNT,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    check_table,
    nonfinite_leaves,
    prefixed,
)
from zoo.utils.fileio import atomic_write

log = logging.getLogger(__name__)


# trainer.* keys read by this module, not by the loop (TrainerSettings)
RUN_LEVEL_TRAINER_KEYS = ("ema_decay", "eval_precision", "bootstrap_resamples", "predict_memory", "sync_bn")
PREDICT_MEMORY = ("auto", "on", "off")


class NumericsFailed(RuntimeError):
    """The run's numerics failed (inf/NaN gradients): raised after summary.json is written, exit 3."""

    exit_status = 3


class NoStepUpdated(NumericsFailed):
    """Every training step was skipped (the loss scaler found inf/NaN each time): the weights are
    the initial ones. Raised after summary.json is written (``all_steps_skipped: true``)."""


class GuardStopped(NumericsFailed):
    """The numerics guard stopped the run (amp.guard.*); summary.json says ``status: stopped_by_guard``."""


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


def announce_pretrained_fallback(model, key: str = "model.net") -> None:
    """A ``warning:`` line on the console (and the log) when ``model`` started from its
    ``pretrained_fallback`` because ``pretrained`` could not be downloaded (zoo.create_model)."""
    report = getattr(model, "pretrained_report", None) or {}
    if report.get("fallback_reason"):
        announce(f"warning: {key}.pretrained={report['requested']} could not be downloaded "
                 f"({report['fallback_reason']}); starting from {key}.pretrained_fallback instead: "
                 f"{report['file']} (summary.json pretrained; {key}.pretrained_fallback=null makes this an error)",
                 sys.stderr, logging.WARNING)


# Every number of a run's config with a rule, by its key: validate() checks each key the composed
# config holds before anything is built. The amp, guard, trainer and schedule rules are the tables
# those modules check their own arguments with; the model and data rules cover what the models'
# configs set (the classes taking them check what depends on more than one value). The rules of
# model.task.* are the task class's own (Task.SETTINGS; zoo/engine/task_rules.py), added per config.
SETTINGS = {
    "model.batch_size": COUNT,
    "model.eval_batch_size": COUNT,
    "optim.lr": POSITIVE,
    "optim.base_batch_size": COUNT.but(nullable=True, note="null = no LR scaling"),
    "optim.grad_clip_norm": POSITIVE.but(nullable=True, note="null = no clipping"),
    "optim.optimizer.weight_decay": NON_NEGATIVE.but(nullable=True),
    "optim.optimizer.momentum": FRACTION,
    "optim.optimizer.beta1": FRACTION,
    "optim.optimizer.beta2": FRACTION,
    "trainer.ema_decay": FRACTION.but(nullable=True, note="null or 0 = no EMA"),
    "trainer.bootstrap_resamples": final_eval.BOOTSTRAP_RESAMPLES,
    **prefixed("trainer.", TRAINER_SETTINGS),
    **prefixed("sched.", SCHED_SETTINGS),
    **prefixed("amp.", AMP_SETTINGS),
    **prefixed("amp.guard.", GUARD_SETTINGS),
    "data.num_classes": COUNT,
    **prefixed("data.builder.", {
        "num_train": COUNT, "num_val": COUNT, "max_objects": COUNT, "max_polys": COUNT,
        "max_instances": COUNT, "max_boxes": COUNT,
        "flip": PROBABILITY, "distort": PROBABILITY, "expand": PROBABILITY, "crop": PROBABILITY,
        "mixup_alpha": MIXUP_ALPHA}),
}


def check_numbers(cfg: DictConfig) -> None:
    """Each number of :data:`SETTINGS` and of the task's rules within its rule; then no nan / inf
    anywhere in the config."""
    check_table(lambda key: OmegaConf.select(cfg, key, default=ABSENT), {**SETTINGS, **task_settings(cfg)},
                ConfigError)
    for key, value in nonfinite_leaves(OmegaConf.to_container(cfg, resolve=True)):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")


def _missing_keys(node, prefix: str = "") -> list[str]:
    """Keys still ``???`` (read unresolved: resolving an interpolation to one would raise)."""
    if isinstance(node, dict):
        return [k for key, v in node.items() for k in _missing_keys(v, f"{prefix}{key}.")]
    if isinstance(node, list):
        return [k for i, v in enumerate(node) for k in _missing_keys(v, f"{prefix}{i}.")]
    return [prefix[:-1]] if node == "???" else []


def validate(cfg: DictConfig) -> None:
    """Checks Hydra cannot make (unknown keys and group choices Hydra already rejects)."""
    missing = _missing_keys(OmegaConf.to_container(cfg, resolve=False))
    if missing:
        raise ConfigError(f"{missing[0]}: missing mandatory value; set it on the command line "
                          f"({missing[0]}=...){'; also missing: ' + ', '.join(missing[1:]) if missing[1:] else ''}")
    seed = cfg.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed: expected a non-negative integer, got {seed!r}")
    check_numbers(cfg)
    if cfg.model.net.get("name") not in zoo.list_models():
        raise ConfigError(f"model.net.name: unknown model {cfg.model.net.get('name')!r}; "
                          f"known: {', '.join(zoo.list_models())}")
    if "root" in cfg.data and not Path(str(cfg.data.root)).exists():
        raise ConfigError(f"data.root: {cfg.data.root} does not exist (data={cfg.data.name})")
    predict_memory_setting(cfg)


def predict_memory_setting(cfg: DictConfig) -> str:
    """``trainer.predict_memory`` checked: auto, on or off (YAML 1.1 reads a bare on/off as a boolean)."""
    value = cfg.trainer.get("predict_memory", "auto")
    value = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
    if value not in PREDICT_MEMORY:
        raise ConfigError(f"trainer.predict_memory: expected auto, on or off, got {value!r}")
    return value


def wants_memory_prediction(setting: str, device_kind: str) -> bool:
    """Whether summary.json gets the planner's predicted peak: ``on`` always, ``auto`` only on a GPU
    (on a CPU the measured peak is the process's RSS, not comparable with a GPU prediction)."""
    return setting == "on" or (setting == "auto" and device_kind == "gpu")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)


def build_amp(cfg: DictConfig):
    return build(cfg.amp, "amp")


def build_data(cfg: DictConfig):
    data = build(cfg.data.builder, "data")
    train_set, val_set = data.build("train", cfg.seed), data.build("val", cfg.seed)
    report = data.data_report() if hasattr(data, "data_report") else None
    return train_set, val_set, report


# Message lists of a data report: written to data_problems.txt, counted (not listed) in summary.json.
# problems: samples left out as bad; notes: data accepted by a rule that changed or dropped it (COCO
# boxes clipped to their image, or dropped as outside it, of zero size or duplicated).
_REPORT_MESSAGES = ("problems", "notes")


def record_data_report(report: dict | None, out_dir: Path) -> dict | None:
    """Write every skipped-sample message, then every note of data fixed by a rule, to
    data_problems.txt (``<split>: <message>`` lines); return the counts for summary.json."""
    if not report:
        return None
    lines = [f"{split}: {msg}" for key in _REPORT_MESSAGES for split, r in report.items() for msg in r.get(key, [])]
    if lines:
        atomic_write(out_dir / "data_problems.txt", lambda tmp: tmp.write_text("\n".join(lines) + "\n"))
    return {split: {k: v for k, v in r.items() if k not in _REPORT_MESSAGES} for split, r in report.items()}


def build_optimizer(cfg: DictConfig, model, steps_per_epoch: int, total_steps: int):
    """LR scheduler first, then the optimizer partial with it (Paddle's order)."""
    global_batch = cfg.model.batch_size * dist.world_size()
    base = cfg.optim.get("base_batch_size")
    lr = float(cfg.optim.lr) * (global_batch / base if base else 1.0)
    sched = build(cfg.sched, "sched")(base_lr=lr, total_steps=total_steps, steps_per_epoch=steps_per_epoch)
    if getattr(sched, "warmup_clipped", None) and dist.is_main():
        announce(clipped_warmup_message(sched.warmup_clipped), sys.stderr, logging.WARNING)
    clip = cfg.optim.get("grad_clip_norm")
    grad_clip = paddle.nn.ClipGradByGlobalNorm(float(clip)) if clip else None
    opt = build(cfg.optim.optimizer, "optim.optimizer")(learning_rate=sched, parameters=model.parameters(),
                                                        grad_clip=grad_clip)
    return opt, sched, lr


def sync_batch_norm(cfg: DictConfig, model, device):
    """``trainer.sync_bn``: BatchNorm -> SyncBatchNorm under a launch of several ranks where Paddle
    has the kernel (:func:`zoo.utils.distributed.convert_sync_bn`); summary.json's ``sync_bn``.
    Asked for but not done on several ranks (Paddle's CPU build has no kernel) is a warning, once, on
    rank 0, with the reason: the run normalises per rank and never claims otherwise. One process
    (the same statistics as SyncBN) and a conversion done are one plain line."""
    try:
        model, info = dist.convert_sync_bn(model, cfg.trainer.get("sync_bn", False), device.kind)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if info["requested"] and not info["effective"] and dist.is_main():
        if dist.world_size() > 1:  # several ranks normalising apart where SyncBN was asked for
            _warn(f"warning: trainer.sync_bn=true not in effect: {info['reason']} (summary.json sync_bn)")
        else:
            announce(f"trainer.sync_bn: {info['reason']} (summary.json sync_bn)")
    elif info["effective"] and dist.is_main():
        announce(f"trainer.sync_bn: {info['converted_layers']} BatchNorm layers -> SyncBatchNorm over "
                 f"{dist.world_size()} ranks")
    return model, info


def build_trainer(cfg: DictConfig, out_dir: Path, command_line=None) -> tuple[Trainer, RunFacts]:
    """Everything a run needs, validated, in the order that fails fastest.

    What the run resumes is found and loaded first (:func:`zoo.engine.resume.plan`): it may set the
    run's length in ``cfg`` (kept from the resumed run unless ``command_line``, the overrides as
    typed, sets it), which the LR schedule is built for."""
    validate(cfg)
    resume_plan = resume.plan(cfg, out_dir, command_line)
    amp = build_amp(cfg)
    settings = TrainerSettings(**{k: v for k, v in OmegaConf.to_container(cfg.trainer).items()
                                  if k not in RUN_LEVEL_TRAINER_KEYS})
    final_eval.check_settings(cfg.trainer.get("eval_precision", "train"),
                              cfg.trainer.get("bootstrap_resamples", 0))
    seed_everything(cfg.seed)
    dist.init()
    device = current_device()
    amp.resolve(device)  # again in amp.setup; here so a refused combination fails before data is built
    check_compile(settings.compile, amp, device.name)
    train_set, val_set, data_report = build_data(cfg)
    names = getattr(val_set, "class_names", None)  # detection sets know their classes
    if names and "num_classes" in cfg.data and len(names) != int(cfg.data.num_classes):
        raise ConfigError(f"data.num_classes: {cfg.data.num_classes}, but data={cfg.data.name} has "
                          f"{len(names)} classes ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''})")
    model = build(cfg.model.net, "model.net")
    announce_pretrained_fallback(model)
    task = build(cfg.model.task, "model.task")
    per_epoch = len(train_set) // (cfg.model.batch_size * dist.world_size())
    if not settings.drop_last:  # the partial batch counts (TrainBatchSampler pads the ranks to equal shares)
        per_epoch = math.ceil(math.ceil(len(train_set) / dist.world_size()) / cfg.model.batch_size)
    if per_epoch == 0:
        raise ConfigError(f"model.batch_size: {cfg.model.batch_size} x {dist.world_size()} ranks exceeds "
                          f"the {len(train_set)} training samples of data={cfg.data.name}")
    # Before O2 decoration and any resume: what a run with this seed starts from (pairing check).
    pairing = provenance.pairing_digests(model, train_set, cfg.model.batch_size, cfg.seed)
    if settings.epochs:  # the run's length, derived once; the trainer only counts steps
        settings.max_steps = math.ceil(settings.epochs * per_epoch)
    total = settings.max_steps
    model, sync_bn = sync_batch_norm(cfg, model, device)
    optimizer, sched, lr = build_optimizer(cfg, model, per_epoch, total)
    model, optimizer = amp.setup(model, optimizer, device)
    ema = ModelEMA(model, cfg.trainer.ema_decay) if cfg.trainer.get("ema_decay") else None
    model = dist.wrap(model)
    trainer = Trainer(model, task, amp, optimizer, sched, train_set, val_set, cfg.model.batch_size,
                      cfg.model.eval_batch_size, cfg.seed, settings, out_dir, ema=ema,
                      config_yaml=ckpt.checkpoint_config(cfg), guard=amp.guard, resume=resume_plan)
    facts = RunFacts(amp=amp, device=device, lr=lr, pairing=pairing,
                     data_version=provenance.dataset_version(train_set),
                     pretrained=getattr(dist.unwrap(model), "pretrained_report", None), data_report=data_report,
                     warmup_clipped=getattr(sched, "warmup_clipped", None), sync_bn=sync_bn)
    return trainer, facts


def start_tracking(tracker: Tracker | None, cfg: DictConfig, trainer: Trainer, facts: RunFacts, out_dir: Path,
                   context: dict | None) -> None:
    """Open the loggers' runs (continuing the resumed folder's) and feed them every metrics line."""
    if not tracker:
        return
    source = trainer.resume.path if trainer.resume is not None else None  # what the trainer resumes, if anything
    amp = facts.amp
    tracker.start(OmegaConf.to_container(cfg, resolve=True), out_dir,
                  {"requested_precision": amp.requested, "effective_precision": amp.effective,
                   "precision_reason": amp.reason, "device": facts.device.name, "world_size": dist.world_size(),
                   "git_revision": git_revision(), "paddle_version": paddle.__version__},
                  resume_dir=source.parent.parent if source is not None else None, context=context)
    trainer.metrics.follow(tracker)


def _warn(message: str) -> None:
    announce(message, sys.stderr, logging.WARNING)


def copy_launch_logs(out_dir: Path) -> None:
    """Under ``paddle.distributed.launch``, copy the ranks' logs (``--log_dir``) into the run folder.

    The launcher writes them to ``./log`` of wherever it was started unless told otherwise; a copy
    beside summary.json keeps every rank's output with the run it belongs to.
    """
    log_dir = os.environ.get("PADDLE_LOG_DIR")
    if dist.world_size() <= 1 or not log_dir or not Path(log_dir).is_dir():
        return
    dest = out_dir / "launch_log"
    dest.mkdir(exist_ok=True)
    for f in Path(log_dir).glob("workerlog.*"):
        shutil.copyfile(f, dest / f.name)


# (cfg, effective precision, per-rank batch) -> summary.json keys; the engine cannot import the
# planner (zoo.diagnostics sits above it), so tools/train.py passes it in.
MemoryPredictor = Callable[[DictConfig, str, int], dict]


def train(cfg: DictConfig, out_dir: str | Path, announce_folder: bool = True,
          predict_memory: MemoryPredictor | None = None, locate_nonfinite=None, command_line=None,
          tracking_context: dict | None = None) -> dict:
    """Train as configured; write config.yaml, metrics.jsonl, checkpoints/ and summary.json.

    The run folder is locked for the run's duration (:mod:`zoo.engine.runlock`); the closing
    line names it unless ``announce_folder`` is false (a temporary folder, as tools/benchmark.py uses).
    ``predict_memory`` (tools/train.py passes :func:`zoo.diagnostics.memory.summary_prediction`) is
    called after the run, on rank 0, when ``trainer.predict_memory`` asks for it on this device;
    its keys go into summary.json beside ``peak_memory_mb``. ``locate_nonfinite`` (tools/train.py
    passes :func:`zoo.diagnostics.nonfinite_step.locate_and_describe`) names the first non-finite op
    when the numerics guard stops the run. ``command_line`` (tools/train.py passes Hydra's overrides
    as typed) tells a resume which run length the user asked for (:mod:`zoo.engine.resume`); None
    takes ``cfg``'s as asked for. ``logger=...`` (cfg.logger) tracks the run in MLflow,
    TensorBoard or W&B (:mod:`zoo.tracking`; ``tracking_context``: the sweep and recipe, from
    tools/train.py): a logger that cannot start fails here, before anything is built.
    """
    out_dir = Path(out_dir)
    loggers = OmegaConf.to_container(cfg.logger, resolve=True) if cfg.get("logger") else None
    tracker = Tracker.from_config(loggers, enabled=dist.is_main(), warn=_warn)
    with RunLock(out_dir, enabled=dist.is_main()), tracker.running():
        return _train(cfg, out_dir, announce_folder, predict_memory, locate_nonfinite, command_line, tracker,
                      tracking_context)


def _memory_prediction(cfg: DictConfig, facts: RunFacts, predict_memory: MemoryPredictor | None) -> dict:
    """summary.json's predicted_peak_memory_mb / predicted_memory (null when not asked for)."""
    none = {"predicted_peak_memory_mb": None, "predicted_memory": None}
    if not (dist.is_main() and wants_memory_prediction(predict_memory_setting(cfg), facts.device.kind)):
        return none
    if predict_memory is None:
        log.warning("trainer.predict_memory: this entry point has no memory planner (tools/train.py has)")
        return none
    try:
        return predict_memory(cfg, facts.amp.effective, int(cfg.model.batch_size))
    except Exception as err:  # noqa: BLE001  (a finished run is not lost to its prediction)
        announce(f"warning: trainer.predict_memory: no prediction ({type(err).__name__}: {err})",
                 sys.stderr, logging.WARNING)
        return {"predicted_peak_memory_mb": None, "predicted_memory": {"error": f"{type(err).__name__}: {err}"}}


def result_line(summary: dict, steps: int) -> str:
    """The closing line: the primary metric, the precision it was evaluated in when that is not the
    training precision, and any evaluation whose outputs held inf or NaN (never a metric computed on
    them without saying so)."""
    pm, trained = summary["primary_metric"], summary["effective_precision"]
    if pm["value"] is None:
        return (f"{pm['name']} not evaluated (trainer.final_eval=false) after {steps} steps ({trained})"
                + _scale_note(summary))
    line = f"{pm['name']} {pm['value']:.4f} after {steps} steps ({trained})"
    own = summary.get("primary_metric_train_precision_eval")
    if pm.get("evaluated_in") == "fp32" and trained != "fp32" and own:
        line = (f"{pm['name']} {pm['value']:.4f} in the FP32 evaluation (trainer.eval_precision=fp32) after "
                f"{steps} steps of {trained} training; the {trained} evaluation: {pm['name']} {own['value']:.4f}")
    for key, where in (("eval_numerics", trained), ("eval_numerics_fp32", "fp32")):
        said = describe_nonfinite(summary.get(key))
        if said and not (key == "eval_numerics_fp32" and trained == "fp32"):
            line += f"; in the {where} evaluation {said} (summary.json {key})"
    return line + _scale_note(summary)


def _scale_note(summary: dict) -> str:
    """What the closing line adds about the numerics the guard watched: BatchNorm running statistics a
    step left non-finite, and a loss scale that amp.guard.on_min_loss_scale=warn let fall below the floor."""
    note = _stats_note(summary.get("nonfinite_running_stats"))
    below = summary.get("loss_scale_below_floor")
    if not below:
        return note
    return note + (f"; the loss scale fell below amp.guard.min_loss_scale={below['floor']:g} at step "
            f"{below['first_step']} and stayed under it for {below['steps']} steps, down to "
            f"{below['lowest']:g}: gradients overflowed even unscaled, {summary.get('skipped_steps', 0)} "
            f"steps skipped (summary.json loss_scale_below_floor)")


def _stats_note(stats: dict | None) -> str:
    """What the closing line adds when a step's forward left non-finite BatchNorm running statistics."""
    if not stats:
        return ""
    layers = ", ".join(stats["layers"][:4]) + (" ..." if len(stats["layers"]) > 4 else "")
    what = ("restored each time to the step before" if stats["restored"] else
            "KEPT (amp.guard.restore_running_stats=false), so the evaluation used them")
    return (f"; {stats['steps']} step(s) left non-finite BatchNorm running statistics ({layers}), "
            f"{what} (summary.json nonfinite_running_stats)")


def _guard_stopped(cfg: DictConfig, trainer: Trainer, facts: RunFacts, out_dir: Path, stop: Exception,
                   wall_s: float) -> GuardStopped:
    """summary.json of a run the numerics guard stopped (no metric: the weights are not the result),
    and the error to raise (exit 3)."""
    doctor = f"python tools/amp_doctor.py model={cfg.model.name} amp={cfg.amp.name}"
    message = (f"{stop}; see it before a run with '{doctor}' (plus this run's other overrides); "
               f"summary.json: status stopped_by_guard")
    if dist.is_main():
        write_json(out_dir / "summary.json", run_summary.stopped_by_guard(cfg, trainer, facts, out_dir, str(stop),
                                                                           wall_s).to_json())
    return GuardStopped(message)


def _train(cfg: DictConfig, out_dir: Path, announce_folder: bool,
           predict_memory: MemoryPredictor | None = None, locate_nonfinite=None, command_line=None,
           tracker: Tracker | None = None, tracking_context: dict | None = None) -> dict:
    t0 = time.time()
    git_revision()  # fixed now, before training: the revision of the code this process runs
    trainer, facts = build_trainer(cfg, out_dir, command_line)
    trainer.locate_nonfinite = locate_nonfinite
    amp = facts.amp
    # before the run writes a file: a logger that cannot open its run leaves no run folder behind
    start_tracking(tracker, cfg, trainer, facts, out_dir, tracking_context)
    if dist.is_main():
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / "config.yaml", lambda tmp: tmp.write_text(OmegaConf.to_yaml(cfg, resolve=True)))
        facts.data_report = record_data_report(facts.data_report, out_dir)
        announce(amp.describe(facts.device))
    primary = trainer.task.primary_metric
    # One signal handling from the first step to the last evaluation: a stop in any phase leaves a
    # checkpoint of the last completed step (written before the final evaluation) and one line.
    with trainer.handling_signals():
        try:
            result = trainer.fit()
        except NumericsGuardStop as stop:
            raise _guard_stopped(cfg, trainer, facts, out_dir, stop, time.time() - t0) from None
        if result.metrics:
            evals = final_eval.after_training(trainer, lambda: build(cfg.model.net, "model.net"), result.metrics,
                                              cfg.trainer.get("eval_precision", "train"),
                                              cfg.trainer.get("bootstrap_resamples", 0))
        else:  # trainer.final_eval=false and no evaluation at the last step: nothing measured
            evals = {"eval_precision": None,
                     "primary_metric": {"name": primary, "value": None, "evaluated_in": None, "ci": None}}
    digests = dist.gather_digests(dist.parameter_digest(trainer.model))
    summary = run_summary.completed(cfg, trainer, facts, result, evals, _memory_prediction(cfg, facts, predict_memory),
                                    out_dir, t0, digests).to_json()
    if dist.is_main():
        copy_launch_logs(out_dir)
        write_json(out_dir / "summary.json", summary)
        folder = f"; run folder {out_dir}" if announce_folder else ""
        announce(f"{result_line(summary, trainer.step)}{folder}")
    if summary["all_steps_skipped"]:
        raise NoStepUpdated(
            f"every one of the {trainer.step} steps was skipped (inf/NaN gradients at each step, "
            f"loss scale now {amp.loss_scale:g}): the weights were never updated and the metric is "
            f"the initial weights'; summary.json says all_steps_skipped: true. Use the model's "
            f"family recipe (recipe/<family>/<amp>.yaml), a lower amp.init_loss_scaling, or run "
            f"tools/amp_doctor.py to find the op that overflows")
    if not summary["ranks_in_sync"]:
        raise RuntimeError(f"ranks ended with different parameters: {digests}")
    return summary
