"""The training loop: one call sequence for every precision, few hooks in a visible order.

After every optimizer step four hooks run, in this order (``Trainer._after_step``): the LR scheduler
steps, then the log hook (metrics line, progress bar), the eval hook (every ``eval_every`` steps, keeping the best
weights) and the checkpoint hook (every ``ckpt_every`` steps, atomic). The loop never branches on
precision: that is the Amp component's business.
"""
from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from zoo.amp import Amp
from zoo.amp.numerics_guard import NumericsGuard, NumericsGuardStop, nonfinite_grads
from zoo.amp.running_stats import RunningStats, nonfinite_stats
from zoo.data import SampleLoadError, TrainBatchSampler, build_loader
from zoo.engine import checkpoint as ckpt
from zoo.engine.compiled import training_forward
from zoo.engine.evaluate import draw_samples, evaluate, nonfinite_line
from zoo.engine.metrics_log import MetricsLog
from zoo.engine.resume import ResumePlan, mark_continued
from zoo.engine.resume_hint import resume_command
from zoo.engine.signals import (StopRequested, StopRequests, TrainingInterrupted, forget_stop, ignoring_stop_signals,
                                record_stop)
from zoo.engine.summary import FitResult
from zoo.utils import distributed as dist
from zoo.utils.checks import COUNT, COUNT_OR_ZERO, POSITIVE, check_table, prefixed
from zoo.utils.progress import Progress

log = logging.getLogger(__name__)

def _file_identity(path: Path) -> tuple | None:
    """What changes when a file is replaced (a rename gives it another inode), or None if absent."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN/inf in a run without a loss scaler to absorb it."""


# The numbers among the loop's settings; zoo/engine/run.py checks them, as trainer.<key>, with the
# rest of a run's config.
SETTINGS = {
    "max_steps": COUNT,
    "epochs": POSITIVE.but(nullable=True),
    "log_every": COUNT,
    "eval_every": COUNT_OR_ZERO.but(note="0 = only at the end"),
    "ckpt_every": COUNT,
    "num_workers": COUNT_OR_ZERO.but(note="0 = load in the main process"),
    "draw_samples": COUNT_OR_ZERO,
}


@dataclass
class TrainerSettings:
    """``trainer.*`` config values (see configs/trainer/default.yaml for their meaning)."""

    max_steps: int = 100
    epochs: float | None = None
    log_every: int = 10
    eval_every: int = 0
    ckpt_every: int = 50
    resume: str | None = None
    resume_allow_changes: bool = False
    progress: bool = True
    num_workers: int = 0
    draw_samples: int = 0
    final_eval: bool = True
    compile: bool = False
    drop_last: bool = True

    def __post_init__(self):
        check_table(lambda key: getattr(self, key.removeprefix("trainer.")), prefixed("trainer.", SETTINGS))
        for key in ("final_eval", "compile", "drop_last"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"trainer.{key}: expected true or false, got {getattr(self, key)!r}")


def _new_window(partial: bool = False) -> dict:
    """The steps since the last ``train`` line of metrics.jsonl: how many, their time, the sums of
    their loss terms, the LR of the last one, and whether some of its steps are missing (a resume
    from a checkpoint that did not keep the window)."""
    return {"steps": 0, "time": 0.0, "terms": {}, "lr": None, "partial": partial}


class Trainer:
    """Runs training to ``max_steps`` and returns the summary facts it measured."""

    def __init__(self, model, task, amp, optimizer, scheduler, train_set, val_set, batch_size: int,
                 eval_batch_size: int, seed: int, settings: TrainerSettings, out_dir: Path,
                 ema=None, config_yaml: str = "", guard: NumericsGuard | None = None,
                 resume: ResumePlan | None = None):
        self.model, self.task, self.amp = model, task, amp
        # the numerics guard watches every step; the Amp component configures it (amp.guard.*)
        self.guard = guard if guard is not None else NumericsGuard()
        # (model, forward, backward) -> (found, one clause): where a guard stop's inf/NaN starts; the entry
        # point passes zoo.diagnostics.nonfinite_step (the engine does not import diagnostics)
        self.locate_nonfinite = None
        self.nonfinite_origin: dict | None = None
        self.optimizer, self.scheduler, self.ema = optimizer, scheduler, ema
        self.train_set, self.val_set = train_set, val_set
        self.batch_size, self.eval_batch_size, self.seed = batch_size, eval_batch_size, seed
        self.settings = settings
        self.out_dir = Path(out_dir)
        self.config_yaml = config_yaml
        self.main = dist.is_main()
        self.metrics = MetricsLog(self.out_dir / "metrics.jsonl", enabled=self.main)
        self.step = 0
        self.best: dict = {}
        self.last_eval: dict = {}
        self.train_time = 0.0
        # wall time of the segments before a resume (from the checkpoint), and when this one began
        self.wall_before_resume = 0.0
        self.wall_start = time.time()
        self.images_seen = 0
        self.resume = resume  # what this run continues (zoo/engine/resume.py), loaded in fit()
        self.resumed_from: str | None = None
        self.saved_step: int | None = None  # step of the newest checkpoint of this run
        self._writing: tuple | None = None  # (step, the file's identity before) while a checkpoint is written
        self.resume_changes: dict | None = None  # settings that differ from the resumed checkpoint's
        # What the run is doing (named by the interruption line), and whether an evaluation due at
        # this step has not finished: a checkpoint written meanwhile says so, and a resume redoes it.
        self.phase = "training"
        self.eval_pending = False
        # The steps since the last metrics.jsonl line: checkpointed, so a resumed run's next line
        # averages the same steps as an uninterrupted run's.
        self.window = _new_window()
        self.stop = StopRequests(enabled=False)  # replaced by the live one in handling_signals()
        # BatchNorm running statistics of a step the scaler may skip: copied before, restored after a
        # skip or when they went non-finite (zoo/amp/running_stats.py); only where a scaler can skip
        self.running_stats = RunningStats(dist.unwrap(model), restore=self.guard.restore_stats) \
            if amp.scaler is not None else None
        self.bad_stats: list[str] = []
        # autocast + forward + loss; paddle.jit.to_static around it when trainer.compile=true
        self.forward_losses = training_forward(task, model, amp, settings.compile)

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        layer = dist.unwrap(self.model)
        return {"format": "ampzoo-ckpt-1", "step": self.step, "model": layer.state_dict(),
                "optimizer": ckpt.optimizer_state_portable(self.optimizer.state_dict(), layer),
                "scheduler": self.scheduler.state_dict(),
                "amp": self.amp.state_dict(), "ema": self.ema.state_dict() if self.ema else None,
                "rng": ckpt.rng_state(), "best": self.best, "train_time": self.train_time,
                "wall_time": self.wall_before_resume + time.time() - self.wall_start,
                "images_seen": self.images_seen, "config": self.config_yaml,
                "eval_pending": self.eval_pending, "log_window": self.window,
                "running_stats": self.running_stats.summary() if self.running_stats is not None else None}

    def load_state_dict(self, state: dict, source: Path) -> None:
        layer = dist.unwrap(self.model)
        ckpt.check_fits(layer, state["model"], source, "this model")
        layer.set_state_dict(state["model"])
        self.optimizer.set_state_dict(ckpt.optimizer_state_local(state["optimizer"], dist.unwrap(self.model)))
        self.scheduler.set_state_dict(state["scheduler"])
        self.amp.set_state_dict(state["amp"])
        if self.ema is not None and state.get("ema"):
            self.ema.set_state_dict(state["ema"])
        ckpt.set_rng_state(state["rng"])
        self.step, self.best = int(state["step"]), dict(state.get("best") or {})
        self.train_time = float(state.get("train_time", 0.0))
        self.wall_before_resume = float(state.get("wall_time", 0.0))  # 0 for checkpoints that predate it
        self.images_seen = int(state.get("images_seen", 0))
        self.eval_pending = bool(state.get("eval_pending", False))
        if self.running_stats is not None and state.get("running_stats"):
            self.running_stats.load(state["running_stats"])
        # A checkpoint from before the window was kept, taken between two log steps: the first line
        # after the resume says that it averages fewer steps (window_steps).
        saved_window = state.get("log_window")
        self.window = {**_new_window(), **saved_window} if saved_window else \
            _new_window(partial=self.step % self.settings.log_every != 0)

    def save_checkpoint(self) -> None:
        dist.sync_buffers(self.model, self.ema)
        if self.main:
            path = ckpt.last_checkpoint(self.out_dir)
            self._writing = (self.step, _file_identity(path))
            ckpt.atomic_save(self.state_dict(), path)
            # This folder now holds the run: the folder it continued is marked, never resumed again.
            # (Not before: a run killed ahead of its first checkpoint leaves the old one resumable.)
            plan = self.resume
            if plan is not None and plan.continues is not None:
                mark_continued(plan.continues, self.out_dir, plan.step, plan.record)
                plan.continues = None
        dist.barrier()
        self.saved_step, self._writing = self.step, None

    def kept_step(self) -> int | None:
        """The step of the checkpoint on disk. A write cut short (a second signal) either renamed the
        new file into place or left the old one, both whole: the file's identity tells which."""
        if self._writing is not None:
            step, before = self._writing
            if _file_identity(ckpt.last_checkpoint(self.out_dir)) != before:
                return step
        return self.saved_step

    def _maybe_resume(self) -> None:
        """Load what :func:`zoo.engine.resume.plan` found (the entry point plans before the optimizer
        is built: the run's length sets its LR schedule)."""
        plan = self.resume
        if plan is None:
            return
        self.resume_changes = plan.changes
        self.load_state_dict(plan.state, plan.path)
        plan.state = None  # the loaded state is in the model now; do not hold a second copy
        self.resumed_from = str(plan.path)
        self.saved_step = self.step
        # An evaluation at this step is redone: a pending one, or the final one (a run stopped in
        # its final evaluation or drawings, or a finished run resumed as it is); keep no old line of it.
        redo = self.eval_pending or (self.step >= self.settings.max_steps and self.settings.final_eval)
        self.metrics.carry_over(plan.path.parent.parent / "metrics.jsonl", self.step,
                                drop_eval_at=self.step if redo else None)
        log.info("resumed from %s at step %d (run length %d steps)", plan.path, self.step, self.settings.max_steps)

    # ---- the loop -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def handling_signals(self):
        """SIGINT/SIGTERM inside the block stop the run at its next safe point (the end of a training
        step, an evaluation batch, a phase) with a checkpoint of the last completed step, raising
        :class:`TrainingInterrupted`. Nested use is the outer block's (run.py spans training, the
        final evaluations and the drawings with one)."""
        if self.stop.active:
            yield self.stop
            return
        forget_stop()
        with StopRequests(enabled=dist.world_size() == 1) as stop:
            self.stop = stop
            try:
                yield stop
            except TrainingInterrupted:
                raise
            except StopRequested as req:  # at a safe point: the state is whole, save it
                signum, at_once = req.signum, False
                try:
                    if self.step and self.saved_step != self.step:
                        self.save_checkpoint()
                except KeyboardInterrupt as again:  # a second signal while it is written
                    signum, at_once = getattr(again, "signum", req.signum), True
                raise self._last_words(signum, at_once) from None
            except KeyboardInterrupt as e:  # a second signal, or one outside the handlers' reach
                raise self._last_words(getattr(e, "signum", signal.SIGINT), True) from None
            finally:
                self.stop = StopRequests(enabled=False)

    def fit(self) -> FitResult:
        """Train (resuming if asked), evaluate at the end (unless ``final_eval`` is off), write the
        final checkpoint, draw.

        The checkpoint of the last step is written before the final evaluation, so a stop signal in
        any phase leaves it: SIGINT/SIGTERM raise :class:`TrainingInterrupted` at the next safe point
        (:meth:`handling_signals`, :mod:`zoo.engine.signals`), and ``trainer.resume=auto`` continues
        from there (redoing an unfinished evaluation, never a finished step).
        """
        with self.handling_signals():
            return self._fit()

    def _fit(self) -> FitResult:
        self._maybe_resume()
        sampler = TrainBatchSampler(len(self.train_set), self.batch_size, self.seed, dist.rank(),
                                    dist.world_size(), drop_last=self.settings.drop_last, start_step=self.step,
                                    stop_step=self.settings.max_steps)
        self.steps_per_epoch = sampler.steps_per_epoch
        loader = build_loader(self.train_set, sampler, self.settings.num_workers)
        self.guard.attach(dist.unwrap(self.model))
        self.model.train()
        if self.eval_pending and self.step < self.settings.max_steps:  # stopped in this evaluation
            self.evaluate()
        # a bar on a terminal; in a redirected log one plain line per log step (trainer.log_every)
        bar = Progress(total=self.settings.max_steps, initial=self.step, desc="train", unit="steps", every=0,
                       disable=not (self.main and self.settings.progress))
        try:
            self._loop(iter(loader), bar)
        except SampleLoadError as e:  # the steps done so far are kept: fix the file, then resume
            self._stopped_by_data(e)
        finally:
            bar.close()
        if self.last_eval.get("step") == self.step:
            final = self.last_eval["metrics"]
        elif self.settings.final_eval:
            self.eval_pending = True  # the final checkpoint now, so a stop in the evaluation keeps it
            self.save_checkpoint()
            try:
                final = self.evaluate("final evaluation")
            except SampleLoadError as e:  # a bad validation image must not cost the steps just trained
                self._stopped_by_data(e)
        else:  # trainer.final_eval=false: no metrics (timing runs, benchmarks)
            final = {}
        self.save_checkpoint()
        if self.settings.draw_samples > 0 and self.main:
            self.phase = "drawing"
            self.stop.check()
            model = dist.unwrap(self.model)
            with self.ema.applied(model) if self.ema is not None else contextlib.nullcontext():
                for label, amp in self._drawing_precisions():
                    draw_samples(self.task, model, self.val_set, self.settings.draw_samples,
                                 self.out_dir / "drawings", f"step{self.step}_{label}", amp,
                                 f"step {self.step}, predictions in {label}")
            self.stop.check()
        return FitResult(metrics=final, numerics=self.last_eval.get("numerics") if final else None,
                         best=self.best, resumed_from=self.resumed_from, resume_changes=self.resume_changes,
                         train_time_s=self.train_time, steps_per_epoch=self.steps_per_epoch,
                         images_per_s=self.images_seen / max(self.train_time, 1e-9))

    def _drawing_precisions(self) -> list:
        """(label, amp) pairs to draw in: the training precision, which the evaluation measured, and
        FP32 beside it when that differs and this model can run it (not a model decorated for O2)."""
        pairs = [(self.amp.effective, self.amp)]
        if self.amp.active and (self.amp.emulated or self.amp.level != "O2"):
            pairs.append(("fp32", Amp()))
        return pairs

    def _loop(self, data_iter, bar) -> None:
        window = self.window
        while self.step < self.settings.max_steps:
            t0 = time.perf_counter()  # data loading counts: images/s is what training delivers
            batch = next(data_iter)
            window["lr"] = float(self.optimizer.get_lr())  # the LR this step uses
            terms, stepped, bad = self.train_step(batch)
            dt = time.perf_counter() - t0
            self.train_time += dt
            self.images_seen += self.batch_size * dist.world_size()
            window["time"] += dt
            window["steps"] += 1
            for k, v in terms.items():
                window["terms"][k] = window["terms"].get(k, 0.0) + v
            self.step += 1
            bar.update(1)
            self._guard(stepped, bad, batch)
            self._after_step(window, bar)
            self.stop.check()  # a signal during the step: save it (handling_signals) and stop

    def _stopped_by_data(self, err: SampleLoadError):
        """Re-raise a sample that failed to load, the steps done so far kept: fix the file, then resume.

        The checkpoint is written unless it holds this step already, and the message says where it
        is (nothing is saved before the first step)."""
        if self.step and self.saved_step != self.step:
            self.save_checkpoint()
        if self.saved_step is not None:
            raise SampleLoadError(f"{err}; checkpoint of step {self.saved_step} saved to "
                                  f"{ckpt.last_checkpoint(self.out_dir)}, resume with "
                                  "trainer.resume=auto once the file is fixed") from None
        raise err

    def _last_words(self, signum: int, at_once: bool) -> TrainingInterrupted:
        """:meth:`_interrupted` with stop signals ignored: a further signal while the line is put
        together would escape unrecorded and be reported as a stop outside training."""
        with ignoring_stop_signals():
            return self._interrupted(signum, at_once=at_once)

    def _interrupted(self, signum: int, at_once: bool = False) -> TrainingInterrupted:
        """The stop's one line: where it stopped, the step whose checkpoint is kept, the command that
        resumes it. ``at_once``: a second signal stopped the run where it was, not at a safe point."""
        path, kept = ckpt.last_checkpoint(self.out_dir), self.kept_step()
        if kept == self.step:
            where = f"checkpoint saved to {path}"
        elif kept is not None:
            lost = f"step {self.step}" if kept + 1 == self.step else f"steps {kept + 1}-{self.step}"
            where = f"the checkpoint of step {kept} is kept ({path}; {lost} not saved)"
        else:
            where = "no checkpoint saved yet"
        hint = f", resume with {resume_command(self.out_dir)}" if kept is not None else ""
        during = "" if self.phase == "training" else f" ({self.phase})"
        how = f" by a second {signal.Signals(signum).name}, at once" if at_once else ""
        return record_stop(TrainingInterrupted(f"interrupted at step {self.step}{during}{how}; {where}{hint}",
                                               signum))

    def train_step(self, batch) -> tuple[dict[str, float], bool, list[str]]:
        """Forward, backward, optimizer step: the same calls whatever the precision.

        Returns the loss terms, whether the parameters moved, and (on a skipped step) the names of
        the parameters whose gradients were non-finite. With a loss scaler, a skipped step leaves
        the BatchNorm running statistics as they were (:attr:`running_stats`); the layers whose
        statistics it found non-finite are in :attr:`bad_stats` for the guard.
        """
        self.guard.before_step()
        if self.running_stats is not None:
            self.running_stats.snapshot()
        losses = self.forward_losses(batch)  # under amp.autocast(), compiled or not
        self.amp.backward(losses["loss"])
        stepped = self.amp.step(self.optimizer)
        bad = [] if stepped else nonfinite_grads(dist.unwrap(self.model))
        self.bad_stats = self.running_stats.after_step(stepped) if self.running_stats is not None else []
        self.optimizer.clear_grad()
        values = {k: float(v) for k, v in losses.items()}
        if not math.isfinite(values["loss"]) and self.amp.scaler is None:
            raise NonFiniteLossError(
                f"loss is {values['loss']} at step {self.step + 1} ({self.amp.effective}, no loss "
                f"scaler); last complete checkpoint: {ckpt.last_checkpoint(self.out_dir)}")
        if stepped and self.ema is not None:
            self.ema.update(dist.unwrap(self.model))
        return values, stepped, bad

    def _guard(self, stepped: bool, bad: list[str], batch) -> None:
        """Numerics guard after each step; on a stop, save the evidence first, then find where the
        inf or NaN starts (:attr:`locate_nonfinite`, re-running the step) and say so."""
        try:
            events = self.guard.after_step(self.step, stepped, self.amp.loss_scale, bad, self.bad_stats)
        except NumericsGuardStop as stop:
            for e in self.guard.events[-1:]:
                self.metrics.write("guard", e["step"], **{k: v for k, v in e.items() if k != "step"})
            self.save_checkpoint()
            where = self._locate_nonfinite(batch)
            raise NumericsGuardStop(f"{stop}; {where}; checkpoint saved: "
                                    f"{ckpt.last_checkpoint(self.out_dir)}") from None
        for e in events:
            self.metrics.write("guard", e["step"], **{k: v for k, v in e.items() if k != "step"})

    def _locate_nonfinite(self, batch) -> str:
        """The first op whose output or gradient was non-finite, on this batch (after the checkpoint:
        the re-run's train-mode forward moves BatchNorm statistics). Recorded in
        :attr:`nonfinite_origin` for summary.json."""
        if self.locate_nonfinite is None or dist.world_size() > 1:
            return "the op was not located (run tools/amp_doctor.py with the same overrides)"
        model = dist.unwrap(self.model)
        try:
            found, said = self.locate_nonfinite(model, lambda: self.forward_losses(batch)["loss"], self.amp.backward)
        except Exception as err:  # noqa: BLE001  (the stop, its checkpoint and summary.json matter more)
            found, said = None, f"the op was not located ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
        finally:
            self.optimizer.clear_grad()
        self.nonfinite_origin = found
        return said

    def _after_step(self, window: dict, bar) -> None:
        self.scheduler.step()  # hook 1: lr_step
        if self.step % self.settings.log_every == 0 or self.step == self.settings.max_steps:  # hook 2: log
            n = max(window["steps"], 1)
            rec = {k: v / n for k, v in window["terms"].items()}
            images = n * self.batch_size * dist.world_size()
            rec.update(lr=window["lr"], loss_scale=self.amp.loss_scale,
                       skipped_steps=self.amp.skipped_steps, epoch=self.step / self.steps_per_epoch,
                       time=time.time(), images_per_s=images / max(window["time"], 1e-9))
            if window["partial"]:  # resumed from a checkpoint without the window: fewer steps averaged
                rec["window_steps"] = window["steps"]
            self.metrics.write("train", self.step, **rec)
            bar.report(loss=f"{rec['loss']:.4f}", lr=f"{rec['lr']:.2e}",
                       scale=f"{rec['loss_scale']:g}" if rec["loss_scale"] else "-",
                       ips=f"{rec['images_per_s']:.1f}")
            window.update(_new_window())
        if self.settings.eval_every and self.step % self.settings.eval_every == 0:  # hook 3: eval
            self.evaluate()
        if self.step % self.settings.ckpt_every == 0 and self.step < self.settings.max_steps:  # hook 4: checkpoint
            self.save_checkpoint()

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate(self, phase: str = "evaluation") -> dict[str, float]:
        """Evaluate (EMA weights when EMA is on), log, and keep the best weights.

        Until it finishes, :attr:`eval_pending` is set (a checkpoint written on a stop signal in it
        records that this step's evaluation is still to do)."""
        self.phase, self.eval_pending = phase, True
        model = dist.unwrap(self.model)
        dist.sync_buffers(model, self.ema)
        weights = self.ema.applied(model) if self.ema is not None else contextlib.nullcontext()
        with weights:
            bad_stats = nonfinite_stats(model)  # a backstop: a scaler's skipped steps restore them
            if bad_stats and self.main:
                log.warning("step %d: evaluating with non-finite BatchNorm running statistics in %s: the "
                            "metric is not the model's", self.step, ", ".join(bad_stats[:10]))
            metrics = evaluate(model, self.task, self.amp, self.val_set, self.eval_batch_size,
                               self.settings.num_workers, self.settings.progress, stop=self.stop)
            primary = metrics[self.task.primary_metric]
            if not self.best or primary > self.best["value"]:
                self.best = {"step": self.step, "value": primary, "metric": self.task.primary_metric}
                if self.main:
                    ckpt.atomic_save(model.state_dict(), ckpt.best_weights(self.out_dir))
        model.train()
        numerics = metrics.numerics
        extra = {"nonfinite_running_stats": bad_stats} if bad_stats else {}
        self.metrics.write("eval", self.step, **metrics, nonfinite_images=numerics["nonfinite_images"], **extra)
        self.last_eval = {"step": self.step, "metrics": metrics, "numerics": numerics}
        self.phase, self.eval_pending = "training", False
        if self.main:
            log.info("eval at step %d: %s", self.step, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
            said = nonfinite_line(metrics, self.amp.effective)
            if said:
                log.warning("step %d: %s", self.step, said)
        return metrics

