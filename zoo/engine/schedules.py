"""Learning-rate schedules, stepped once per iteration, with optional linear warm-up.

Configs (``configs/sched/*.yaml``) are partials of these functions; the entry point completes them
with the base LR and the run's length, then hands the scheduler to the optimizer partial.
Boundaries given in epochs are converted with ``steps_per_epoch`` (PaddleClas states its piecewise
schedule in epochs: 30/60/90). A warm-up longer than the run is clipped to half the run, and the
returned scheduler says so in ``warmup_clipped`` (else None).
"""
from __future__ import annotations

from collections.abc import Sequence

import paddle.optimizer.lr as lr

from zoo.utils.checks import COUNT_OR_ZERO, NON_NEGATIVE, POSITIVE, PROBABILITY, Bound, check

# The schedules' numbers (configs/sched/*.yaml); zoo/engine/run.py checks them, as sched.<key>, with
# the rest of a run's config, and each schedule checks the ones it is given.
SETTINGS = {
    "warmup_steps": COUNT_OR_ZERO,
    "warmup_epochs": NON_NEGATIVE.but(nullable=True),
    "warmup_start_factor": PROBABILITY.but(note="of the base LR"),
    "eta_min": NON_NEGATIVE,
    "horizon": Bound(1, note="cosine period / run length"),
    "gamma": POSITIVE,
}


def _numbers(**values) -> None:
    for key, value in values.items():
        check(f"sched.{key}", value, SETTINGS[key])


def _warmup(sched, base_lr: float, warmup_steps: int, warmup_start_factor: float):
    if warmup_steps <= 0:
        return sched
    return lr.LinearWarmup(sched, warmup_steps=warmup_steps,
                           start_lr=base_lr * warmup_start_factor, end_lr=base_lr)


def _fit_warmup(total_steps: int, warmup_steps: int, warmup_epochs: float | None = None) -> tuple[int, dict | None]:
    """The warm-up a run of ``total_steps`` gets, and a note when it had to be shortened.

    A warm-up as long as the run (``trainer.max_steps=10`` under a 10- or 20-step warm-up) would
    never reach the base LR; it is clipped to ``total_steps // 2``, so that a short run still spends
    its second half on the schedule proper (cosine decay, piecewise boundaries) at the configured LR,
    rather than ``total_steps - 1`` steps of ramp and one step of schedule. Runs whose warm-up fits
    are untouched. A negative warm-up is refused (``SETTINGS``), never clipped.
    """
    if warmup_steps < 0:
        raise ValueError(f"sched.warmup_steps: expected an integer >= 0, got {warmup_steps}")
    if warmup_steps < total_steps:
        return warmup_steps, None
    used = total_steps // 2
    note = {"key": "sched.warmup_epochs" if warmup_epochs is not None else "sched.warmup_steps",
            "configured": warmup_epochs if warmup_epochs is not None else warmup_steps,
            "configured_steps": warmup_steps, "used_steps": used, "total_steps": total_steps}
    return used, note


def clipped_warmup_message(note: dict) -> str:
    """The one warning line for a clipped warm-up (printed by zoo/engine/run.py)."""
    given = (f"{note['configured']:g} epochs (= {note['configured_steps']} steps)"
             if note["key"] == "sched.warmup_epochs" else f"{note['configured_steps']} steps")
    return (f"warning: {note['key']}: a warm-up of {given} is not shorter than the run ({note['total_steps']} "
            f"steps); clipped to {note['used_steps']} steps, half the run (summary.json: warmup_clipped)")


def _noted(sched, note: dict | None):
    sched.warmup_clipped = note  # read by zoo/engine/run.py: the warning line and summary.json
    return sched


def constant(base_lr: float, total_steps: int, steps_per_epoch: int, warmup_steps: int = 0,
             warmup_start_factor: float = 0.0):
    """Constant LR (PaddleOCR's DB recipes), after an optional warm-up."""
    _numbers(warmup_steps=warmup_steps, warmup_start_factor=warmup_start_factor)
    warmup_steps, note = _fit_warmup(total_steps, warmup_steps)
    return _noted(_warmup(lr.PiecewiseDecay([total_steps + 1], [base_lr, base_lr]), base_lr, warmup_steps,
                          warmup_start_factor), note)


def cosine(base_lr: float, total_steps: int, steps_per_epoch: int, warmup_steps: int = 0,
           warmup_start_factor: float = 0.0, eta_min: float = 0.0, warmup_epochs: float | None = None,
           horizon: float = 1.0):
    """Cosine decay from ``base_lr`` to ``eta_min`` over the steps after warm-up.

    ``warmup_epochs`` (when set) replaces ``warmup_steps``. ``horizon`` stretches the cosine period to
    ``horizon * total_steps``, so the run stops before the LR reaches ``eta_min``: PaddleDetection's
    ppyoloe_crn_s_300e_coco trains 300 epochs on a CosineDecay of max_epochs 360 (horizon 1.2).
    """
    _numbers(warmup_steps=warmup_steps, warmup_epochs=warmup_epochs, warmup_start_factor=warmup_start_factor,
             eta_min=eta_min, horizon=horizon)
    if warmup_epochs is not None:
        warmup_steps = int(round(float(warmup_epochs) * steps_per_epoch))
    warmup_steps, note = _fit_warmup(total_steps, warmup_steps, warmup_epochs)
    period = int(round(horizon * total_steps)) - warmup_steps
    return _noted(_warmup(lr.CosineAnnealingDecay(base_lr, T_max=max(period, 1), eta_min=eta_min),
                          base_lr, warmup_steps, warmup_start_factor), note)


def piecewise(base_lr: float, total_steps: int, steps_per_epoch: int,
              boundary_epochs: Sequence[float] = (), boundary_steps: Sequence[int] = (),
              gamma: float = 0.1, warmup_steps: int = 0, warmup_start_factor: float = 0.0):
    """Multiply the LR by ``gamma`` at each boundary (given in epochs or in steps, not both)."""
    _numbers(warmup_steps=warmup_steps, warmup_start_factor=warmup_start_factor, gamma=gamma)
    warmup_steps, note = _fit_warmup(total_steps, warmup_steps)
    if boundary_epochs and boundary_steps:
        raise ValueError("sched: give boundary_epochs or boundary_steps, not both")
    bounds = [int(round(e * steps_per_epoch)) for e in boundary_epochs] or [int(s) for s in boundary_steps]
    if bounds != sorted(bounds) or any(b <= 0 for b in bounds):
        raise ValueError(f"sched boundaries must be positive and increasing, got {bounds}")
    values = [base_lr * gamma**i for i in range(len(bounds) + 1)]
    return _noted(_warmup(lr.PiecewiseDecay(bounds, values), base_lr, warmup_steps, warmup_start_factor), note)
