"""Numerics guard: notice AMP going wrong early, say where, and stop with the evidence saved.

Paddle's GradScaler silently skips steps and halves the scale without a floor; PaddleOCR #6848
shows a DB run whose scale fell to ~1e-30 while training went on producing nothing. The guard
watches what the Amp component reports after every step:

- ``max_consecutive_skips``: that many skipped steps in a row stop the run (0 = never), naming the
  parameters whose gradients were non-finite on the last one. A dynamic scaler still coming down
  from a large ``init_loss_scaling`` (1e30 needs ~85 halvings) is calibrating, not failing: skips
  count only once the scale is at or below ``calibration_ceiling`` (2^16, Paddle's default initial
  scale), or always when the scale is static (PaddleOCR's ``use_amp`` alone: static 1.0).
- ``min_loss_scale``: a loss scale below this floor is reported; ``on_min_loss_scale`` is ``stop``
  or ``warn``.
- ``find_nonfinite_layer``: on a skipped step, name the first layer (in forward order) whose output
  was non-finite. It checks every layer's output each step, so it costs time; turn it on to debug.
- ``restore_running_stats``: with a loss scaler, a skipped step also drops the BatchNorm running
  statistics its forward wrote, and a step that left one non-finite gets the previous ones back
  (zoo/amp/running_stats.py); the layers are named in a ``nonfinite_running_stats`` event. ``false``
  keeps Paddle's behaviour (the statistics stay, whatever they hold), for comparison only.

Every event goes to metrics.jsonl; the console gets one line per event for the first few, then at
most one line every ``console_every_s`` seconds saying how many were not shown. Paddle's own
``Found inf or nan, current scale is ...`` print is silenced by the Amp component in favour of this.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import paddle

from zoo.utils.checks import COUNT_OR_ZERO, NON_NEGATIVE, POSITIVE, check_table, prefixed

log = logging.getLogger(__name__)


# amp.guard.* numbers (configs/amp/*.yaml); zoo/engine/run.py checks them with the rest of the config.
SETTINGS = {
    "max_consecutive_skips": COUNT_OR_ZERO.but(note="0 = never stop"),
    "calibration_ceiling": POSITIVE,
    "min_loss_scale": NON_NEGATIVE,
}


class NumericsGuardStop(FloatingPointError):
    """The guard stopped training; the message says why and what was saved."""


class NumericsGuard:
    """Checks run by the trainer after each optimizer step (see module docstring)."""

    CONSOLE_FIRST = 5  # events printed one by one before rate limiting starts

    def __init__(self, max_consecutive_skips: int = 0, min_loss_scale: float = 0.0,
                 on_min_loss_scale: str = "warn", find_nonfinite_layer: bool = False,
                 calibration_ceiling: float = 65536.0, console_every_s: float = 10.0,
                 restore_running_stats: bool = True):
        given = dict(max_consecutive_skips=max_consecutive_skips, calibration_ceiling=calibration_ceiling,
                     min_loss_scale=min_loss_scale)
        check_table(lambda key: given[key.removeprefix("amp.guard.")], prefixed("amp.guard.", SETTINGS))
        if on_min_loss_scale not in ("warn", "stop"):
            raise ValueError(f"amp.guard.on_min_loss_scale: expected warn or stop, got {on_min_loss_scale!r}")
        if not isinstance(restore_running_stats, bool):
            raise ValueError(f"amp.guard.restore_running_stats: expected true or false, got {restore_running_stats!r}")
        self.restore_stats = restore_running_stats
        self.max_skips = int(max_consecutive_skips)
        self.ceiling = float(calibration_ceiling)
        self.console_every = float(console_every_s)
        self.dynamic = True  # set by the Amp component from use_dynamic_loss_scaling
        self._console_last = -float("inf")
        self._console_hidden = 0
        self.min_scale = float(min_loss_scale)
        self.on_min = on_min_loss_scale
        self.find_layer = bool(find_nonfinite_layer)
        self.consecutive = 0
        self.events: list[dict] = []
        self._first_bad: str | None = None
        self._hooks: list = []
        self._warned_scale = False
        # the loss scale under min_loss_scale: floor, first step, steps below, lowest scale (None: never)
        self.below_floor: dict | None = None

    # ---- forward hooks (only when find_nonfinite_layer) --------------------------------------
    def attach(self, model) -> None:
        """Register forward hooks that remember the first layer with a non-finite output."""
        if not self.find_layer:
            return
        for name, layer in model.named_sublayers():
            if not list(layer.children()):  # leaf layers: the ones that compute
                self._hooks.append(layer.register_forward_post_hook(self._hook(name, layer)))

    def _hook(self, name: str, layer):
        def check(_layer, _inputs, output):
            if self._first_bad is None:
                outs = output if isinstance(output, (list, tuple)) else [output]
                for t in outs:
                    if isinstance(t, paddle.Tensor) and t.dtype in (paddle.float32, paddle.float16) and \
                            not bool(paddle.isfinite(t).all()):
                        self._first_bad = f"{name} ({type(layer).__name__})"
                        break
        return check

    def before_step(self) -> None:
        self._first_bad = None

    # ---- the check after each step -----------------------------------------------------------
    def after_step(self, step: int, stepped: bool, loss_scale: float | None, bad_params: list[str],
                   bad_stats: list[str] = ()) -> list[dict]:
        """Record events for this step; raise :class:`NumericsGuardStop` when a limit is hit.

        ``bad_stats``: layers whose running statistics this step's forward left non-finite
        (:class:`zoo.amp.running_stats.RunningStats`; restored unless ``restore_running_stats`` is off).
        """
        new = []
        if bad_stats:
            new.append({"step": step, "event": "nonfinite_running_stats", "layers": list(bad_stats)[:10],
                        "restored": self.restore_stats, "stepped": stepped})
        calibrating = self.dynamic and loss_scale is not None and loss_scale > self.ceiling
        if stepped:
            self.consecutive = 0
        else:
            self.consecutive += 0 if calibrating else 1
            event = {"step": step, "event": "skipped_step", "consecutive": self.consecutive,
                     "loss_scale": loss_scale, "nonfinite_grads": bad_params[:10]}
            if calibrating:
                event["calibrating"] = True
            if self._first_bad is not None:
                event["first_nonfinite_layer"] = self._first_bad
            new.append(event)
        if loss_scale is not None and loss_scale < self.min_scale:
            new.append({"step": step, "event": "loss_scale_below_floor", "loss_scale": loss_scale,
                        "floor": self.min_scale})
            below = self.below_floor or {"floor": self.min_scale, "first_step": step, "steps": 0,
                                         "lowest": loss_scale}
            below["steps"] += 1
            below["lowest"] = min(below["lowest"], loss_scale)
            self.below_floor = below
        self.events.extend(new)
        for e in new:
            if e["event"] == "skipped_step":
                self._console(e)
            if e["event"] == "nonfinite_running_stats":
                self._console_stats(e)
            if e["event"] == "loss_scale_below_floor" and self.on_min == "stop":
                raise NumericsGuardStop(
                    f"step {step}: loss scale {loss_scale:g} fell below amp.guard.min_loss_scale="
                    f"{self.min_scale:g}; gradients keep overflowing (see metrics.jsonl guard lines)")
            if e["event"] == "loss_scale_below_floor" and not self._warned_scale:
                log.warning("step %d: loss scale %g below amp.guard.min_loss_scale=%g", step, loss_scale,
                            self.min_scale)
                self._warned_scale = True
        if self.max_skips and self.consecutive >= self.max_skips:
            where = f"; first non-finite layer output: {self._first_bad}" if self._first_bad else ""
            raise NumericsGuardStop(
                f"step {step}: {self.consecutive} consecutive steps skipped for non-finite gradients "
                f"(amp.guard.max_consecutive_skips={self.max_skips}); loss scale {loss_scale}; "
                f"non-finite gradients in: {', '.join(bad_params[:10]) or 'unknown'}{where}")
        return new


    def _console_stats(self, e: dict) -> None:
        """The first non-finite running statistics always get a line; later ones at most one per
        console_every_s (they come with skipped steps, whose lines say how many were not shown)."""
        seen = sum(1 for x in self.events if x["event"] == "nonfinite_running_stats")
        if seen > 1 and time.monotonic() - self._console_last < self.console_every:
            return
        what = ("restored to the step before" if e["restored"] else
                "KEPT (amp.guard.restore_running_stats=false): evaluation will use them")
        after = "a skipped step" if not e["stepped"] else "a step whose gradients were finite"
        log.warning("step %d: %s left non-finite BatchNorm running statistics in %s; %s", e["step"], after,
                    ", ".join(e["layers"]), what)

    def _console(self, e: dict) -> None:
        """One warning line per skipped step at first, then at most one per console_every_s."""
        now = time.monotonic()
        skips = sum(1 for x in self.events if x["event"] == "skipped_step")
        if skips > self.CONSOLE_FIRST and now - self._console_last < self.console_every:
            self._console_hidden += 1
            return
        more = f" ({self._console_hidden} more skipped steps not shown)" if self._console_hidden else ""
        why = "calibrating: scale above amp.guard.calibration_ceiling" if e.get("calibrating") else \
            f"{e['consecutive']} in a row"
        log.warning("step %d: skipped (non-finite gradients), loss scale now %s, %s%s", e["step"],
                    e["loss_scale"], why, more)
        self._console_last, self._console_hidden = now, 0


def nonfinite_grads(model) -> list[str]:
    """Structured names of parameters whose gradient holds inf or NaN."""
    bad = []
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and not np.isfinite(g.numpy()).all():
            bad.append(name)
    return bad
