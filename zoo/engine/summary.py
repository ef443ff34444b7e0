"""summary.json as a typed record: what a run measured, in the run-folder contract's flat keys.

:class:`RunSummary` is the one definition of the keys every summary.json holds (DESIGN.md, "Run
folder"), grouped by what they say; :meth:`RunSummary.to_json` writes them flat, as the report and
tools/eval.py read them, with the final evaluation's keys (``final_eval.after_training``) and the
memory planner's after them. A completed run and a run the numerics guard stopped are built from
the same record (:func:`completed`, :func:`stopped_by_guard`), so they cannot drift apart.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import paddle

from zoo.amp import Amp, DeviceInfo
from zoo.engine import provenance
from zoo.engine.compiled import COMPILED_SCOPE
from zoo.engine.runinfo import git_revision, peak_memory_mb
from zoo.utils import distributed as dist
from zoo.utils.runfolder import last_checkpoint


@dataclass
class RunFacts:
    """What the run's builder learned while building, for summary.json (beside the Trainer)."""

    amp: Amp
    device: DeviceInfo
    lr: float                        # the base LR after batch scaling
    pairing: dict                    # digests of the initial weights and first batches
    data_version: dict
    pretrained: dict | None          # load report of model.net.pretrained
    data_report: dict | None         # skipped samples per split (counts, then messages)
    warmup_clipped: dict | None = None  # the schedule's warm-up, shortened to fit the run (schedules.py)
    sync_bn: dict | None = None      # trainer.sync_bn requested / effective (zoo.utils.distributed.convert_sync_bn)


@dataclass
class FitResult:
    """What :meth:`zoo.engine.trainer.Trainer.fit` measured."""

    metrics: dict                    # the final evaluation's (empty with trainer.final_eval=false)
    numerics: dict | None            # its images with inf/NaN (zoo/amp/nonfinite.py)
    best: dict                       # the best evaluation: step, value, metric
    resumed_from: str | None
    resume_changes: dict | None
    train_time_s: float
    steps_per_epoch: int
    images_per_s: float


@dataclass
class RunSummary:
    """Every key of summary.json but the final evaluation's and the memory planner's (``extra``)."""

    # what ran
    status: str  # completed | stopped_by_guard (a folder a resume continued: "continued", zoo/engine/resume.py)
    model: str
    data: str
    seed: int
    requested_precision: str
    effective_precision: str
    precision_reason: str
    device: str
    world_size: int
    sync_bn: dict | None
    run_dir: str
    # how long and how fast
    steps: int
    wall_time_s: float
    skipped_steps: int
    all_steps_skipped: bool
    final_loss_scale: float | None
    loss_scaler: dict | None
    guard_events: list
    guard_event_count: int
    paddle_version: str
    git_revision: str
    primary_metric: dict
    metrics: dict = field(default_factory=dict)
    loss_scale_below_floor: dict | None = None  # first step, steps below, lowest scale (NumericsGuard)
    # steps whose forward left non-finite BatchNorm running statistics, their layers, whether restored
    nonfinite_running_stats: dict | None = None
    # set by a completed run (None when the guard stopped it)
    compiled: bool | None = None
    compiled_scope: str | None = None
    batch_size_per_rank: int | None = None
    warmup_clipped: dict | None = None
    global_batch_size: int | None = None
    lr: float | None = None
    epochs: float | None = None
    eval_numerics: dict | None = None
    best: dict | None = None
    images_per_s: float | None = None
    train_time_s: float | None = None
    wall_time_before_resume_s: float | None = None
    resumed_from: str | None = None
    resume_changes: dict | None = None
    pretrained: dict | None = None
    data_report: dict | None = None
    param_digests: list | None = None
    versions: dict | None = None
    data_version: dict | None = None
    config_digest: str | None = None
    config_digest_excludes: list | None = None
    pairing: dict | None = None
    ranks_in_sync: bool | None = None
    peak_memory_mb: float | None = None
    peak_memory_kind: str | None = None
    # set by a run the numerics guard stopped
    stop_reason: str | None = None
    nonfinite_origin: dict | None = None
    checkpoint: str | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The flat summary.json object; a stopped run's file leaves out what it never measured."""
        out = asdict(self)
        extra = out.pop("extra")
        if self.status == "stopped_by_guard":
            out = {k: v for k, v in out.items() if v is not None or k in _STOPPED_KEYS}
        else:
            for k in ("stop_reason", "nonfinite_origin", "checkpoint"):
                out.pop(k)
        return {**out, **extra}


_STOPPED_KEYS = {"final_loss_scale", "loss_scaler", "nonfinite_origin"}


def _common(cfg, trainer, facts: RunFacts, out_dir: Path, status: str, wall_s: float, primary_metric: dict,
            metrics: dict) -> dict:
    amp = facts.amp
    return dict(
        status=status, model=cfg.model.name, data=cfg.data.name, seed=cfg.seed,
        requested_precision=amp.requested, effective_precision=amp.effective, precision_reason=amp.reason,
        device=facts.device.name, world_size=dist.world_size(), sync_bn=facts.sync_bn, run_dir=str(out_dir), steps=trainer.step,
        wall_time_s=wall_s, skipped_steps=amp.skipped_steps,
        all_steps_skipped=trainer.step > 0 and amp.skipped_steps >= trainer.step,
        final_loss_scale=amp.loss_scale, loss_scaler=amp.scaler_args if amp.scaler else None,
        guard_events=trainer.guard.events[-100:], guard_event_count=len(trainer.guard.events),
        loss_scale_below_floor=trainer.guard.below_floor,
        nonfinite_running_stats=trainer.running_stats.summary() if trainer.running_stats is not None else None,
        paddle_version=paddle.__version__, git_revision=git_revision(), primary_metric=primary_metric,
        metrics=metrics)


def completed(cfg, trainer, facts: RunFacts, result: FitResult, evals: dict, memory: dict, out_dir: Path,
              t0: float, digests: list) -> RunSummary:
    """The summary of a finished run (``evals``: final_eval.after_training's keys)."""
    primary = trainer.task.primary_metric
    compiled = trainer.settings.compile
    peak_mb, peak_kind = peak_memory_mb()
    # a resumed run's wall time includes the segments before the resume (checkpoint "wall_time")
    wall = trainer.wall_before_resume + time.time() - t0
    return RunSummary(
        **_common(cfg, trainer, facts, out_dir, "completed", wall,
                  {"name": primary, "value": result.metrics.get(primary)}, result.metrics),
        compiled=compiled, compiled_scope=COMPILED_SCOPE if compiled else None,
        batch_size_per_rank=cfg.model.batch_size, warmup_clipped=facts.warmup_clipped,
        global_batch_size=cfg.model.batch_size * dist.world_size(), lr=facts.lr,
        epochs=trainer.step / result.steps_per_epoch, eval_numerics=result.numerics, best=result.best,
        images_per_s=result.images_per_s, train_time_s=result.train_time_s,
        wall_time_before_resume_s=trainer.wall_before_resume, resumed_from=result.resumed_from,
        resume_changes=result.resume_changes, pretrained=facts.pretrained, data_report=facts.data_report,
        param_digests=digests, versions=provenance.library_versions(), data_version=facts.data_version,
        config_digest=provenance.config_digest(cfg),
        config_digest_excludes=list(provenance.CONFIG_DIGEST_EXCLUDES), pairing=facts.pairing,
        ranks_in_sync=len(set(digests)) == 1, peak_memory_mb=round(peak_mb, 1), peak_memory_kind=peak_kind,
        extra={**memory, **evals})


def stopped_by_guard(cfg, trainer, facts: RunFacts, out_dir: Path, reason: str, wall_s: float) -> RunSummary:
    """The summary of a run the numerics guard stopped: no metric (the weights are not the result)."""
    primary = {"name": trainer.task.primary_metric, "value": None, "evaluated_in": None, "ci": None}
    return RunSummary(**_common(cfg, trainer, facts, out_dir, "stopped_by_guard", wall_s, primary, {}),
                      stop_reason=reason, nonfinite_origin=trainer.nonfinite_origin,
                      checkpoint=str(last_checkpoint(out_dir)))
