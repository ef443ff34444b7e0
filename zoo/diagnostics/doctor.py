"""AMP doctor: a few training steps in FP32 measured op by op, then the same steps emulated.

:func:`measure` runs ``steps`` training steps (forward, backward, the configured optimizer) in FP32
values under an :class:`~zoo.amp.emulation.Emulation` whose rounding is switched off: every op
computes in fp32, yet carries the emulation's own low-precision decision (its tag), so the
prediction made from these numbers uses the very rule the emulated run and
``tools/amp_conformance.py`` check. :func:`check` runs the same steps from the same initial weights
on the same batches through the :class:`~zoo.amp.Amp` component with emulated numerics, and
:func:`compare` sets step 1 of both side by side. :mod:`zoo.diagnostics.prescribe` turns it into findings.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from zoo.amp import emulation as emu
from zoo.amp.amp import keep_layers_fp32
from zoo.amp.capability import DeviceInfo
from zoo.diagnostics.numerics import FORMATS, Stats, cosine, relative_error
from zoo.diagnostics.eval_findings import eval_batch_count, examine_eval
from zoo.diagnostics.fix_check import check_fixes, reuses_measurement, with_overrides
from zoo.diagnostics.findings import SEVERITY, verdict
from zoo.diagnostics.prescribe import diagnose
from zoo.diagnostics.probe import Probe, param_grads, sample, train_batches
from zoo.engine.run import ConfigError, build, build_amp, build_optimizer, seed_everything, validate

CPU = DeviceInfo("cpu", "cpu")


@dataclass
class Run:
    """What one pass over the steps saw."""

    records: dict
    low_inputs: set = field(default_factory=set)      # parameters whose gradients pass the format
    params: dict = field(default_factory=dict)        # name -> Stats of the (unscaled) gradient
    first_params: dict = field(default_factory=dict)  # name -> sample of step 1's gradient
    sizes: dict = field(default_factory=dict)         # name -> entries of the gradient
    low_params: set = field(default_factory=set)      # names whose gradients a GPU stores low
    losses: list = field(default_factory=list)
    stepped: list = field(default_factory=list)
    scales: list = field(default_factory=list)
    flushed: list = field(default_factory=list)       # emulated: share of low-stored entries flushed
    seconds: float = 0.0


def _steps(model, task, batches, probe, autocast, backward, step) -> Run:
    """``steps`` training steps: forward under ``autocast()`` watched by ``probe``, then
    ``backward(loss)`` and ``step(run)`` (which returns the unscaled parameter gradients)."""
    run = Run(probe.records)
    t0 = time.time()
    for i, batch in enumerate(batches):
        probe.step = i
        with autocast(), probe.forward():
            losses = task.losses(model, batch)
        run.losses.append(float(losses["loss"]))
        backward(losses["loss"])
        for name, g in step(run).items():
            run.params.setdefault(name, Stats()).add(g)
            if i == 0:
                run.first_params[name], run.sizes[name] = sample(g), g.size
    run.seconds = time.time() - t0
    run.low_inputs = set(probe.low_inputs)
    return run


def measure(model, task, optimizer, batches, amp) -> Run:
    """FP32 steps with the emulation's op decisions recorded (no rounding anywhere)."""
    rule = emu.Emulation(amp.level, amp.dtype, amp.white, amp.black, forward=False, backward=False)
    zero = FORMATS[amp.dtype].min_subnormal / 2
    low = set()
    kept = keep_layers_fp32(model, amp.fp32_layers)  # amp.fp32_layers: those layers' ops are not low
    if amp.level == "O2":
        emu.mark_o2_parameters(model, amp.dtype, exclude=kept)
        if not amp.master_grad:
            ids = {id(p) for p in emu.low_precision_parameters(model.parameters())}
            low = {n for n, p in model.named_parameters() if id(p) in ids}

    def step(run):
        grads = param_grads(model)
        if low:  # what a GPU would flush storing these after unscaling: 0 < |g| < half the smallest subnormal
            kept = [grads[n] for n in low if n in grads]
            lost = sum(int(((g != 0) & (np.abs(g) < zero)).sum()) for g in kept)
            run.flushed.append(lost / max(1, sum(g.size for g in kept)))
        optimizer.step()
        optimizer.clear_grad()
        run.stepped.append(True)
        return grads

    with Probe(model, rule, amp.dtype) as probe:
        run = _steps(model, task, batches, probe, rule, lambda loss: loss.backward(), step)
    run.low_params = low
    return run


def check(model, task, optimizer, batches, amp) -> Run:
    """The same steps through the Amp component with emulated numerics (the CPU path)."""
    amp.on_unsupported = "emulate"
    model, optimizer = amp.setup(model, optimizer, CPU)
    low_ids = {id(p) for p in amp._low_grads}

    def backward(loss):
        probe.grad_scale = amp.loss_scale or 1.0
        amp.backward(loss)

    def step(run):
        before = {n: p.grad.numpy() / (amp.loss_scale or 1.0) for n, p in model.named_parameters()
                  if p.grad is not None and id(p) in low_ids}
        run.scales.append(amp.loss_scale)
        stepped = amp.step(optimizer)
        grads = param_grads(model)   # unscaled by GradScaler (and rounded, when stored low)
        if before and not stepped:
            run.flushed.append(None)
        if before and stepped:   # a skipped step's gradients are inf/NaN: nothing to count
            lost = sum(int(((before[n] != 0) & (grads[n] == 0)).sum()) for n in before)
            run.flushed.append(lost / max(1, sum(b.size for b in before.values())))
        optimizer.clear_grad()
        run.stepped.append(stepped)
        return grads

    with Probe(model, amp.emulation, amp.dtype) as probe:
        run = _steps(model, task, batches, probe, amp.autocast, backward, step)
    run.low_params = {n for n, p in model.named_parameters() if id(p) in low_ids}
    return run


def compare(ref: Run, got: Run) -> dict:
    """Step 1 of two runs, per op key and per parameter: relative error and cosine similarity."""
    rows = {}
    for key, r in ref.records.items():
        g = got.records.get(key)
        if g is None or r.first_out is None or g.first_out is None or r.first_out.shape != g.first_out.shape:
            continue
        row = {"act_rel_err": relative_error(r.first_out, g.first_out),
               "act_cos": cosine(r.first_out, g.first_out),
               "act_nonfinite": int((~np.isfinite(g.first_out)).sum())}
        if r.first_grad is not None and g.first_grad is not None and r.first_grad.shape == g.first_grad.shape:
            row.update(grad_rel_err=relative_error(r.first_grad, g.first_grad),
                       grad_cos=cosine(r.first_grad, g.first_grad))
        rows[key] = row
    params = {}
    for name, r in ref.first_params.items():
        g = got.first_params.get(name)
        if g is not None:
            params[name] = {"grad_rel_err": relative_error(r, g), "grad_cos": cosine(r, g)}
    lost = total = 0.0   # O2 stored-low gradients: nonzero in FP32, 0 emulated, step 1 (same weights)
    first_stepped = bool(got.stepped and got.stepped[0])   # a skipped step's gradients say nothing
    for name in (got.low_params & set(ref.first_params)) if first_stepped else ():
        r, g = ref.first_params[name], got.first_params.get(name)
        if g is not None and r.shape == g.shape and np.isfinite(g).all():
            weight = ref.sizes[name] / r.size   # the samples stand for the whole tensor
            lost += weight * int(((r != 0) & (g == 0)).sum())
            total += weight * int((r != 0).sum())
    return {"ops": rows, "params": params,
            "lost_nonzero_param_grads": lost / total if total else None,
            "update_rel_err": update_error(ref, got) if first_stepped else None}


def update_error(ref: Run, got: Run) -> float | None:
    """Step 1's whole parameter gradient (the update's direction), emulated against FP32:
    ||g - r|| / ||r|| over every parameter, each sample standing for its tensor. A parameter whose
    FP32 gradient is ~0 weighs ~0 here, however far off its own relative error is."""
    diff = norm = 0.0
    for name, r in ref.first_params.items():
        g = got.first_params.get(name)
        if g is None or g.shape != r.shape or not np.isfinite(g).all():
            return None
        weight = ref.sizes[name] / r.size
        diff += weight * float(((g.astype(np.float64) - r) ** 2).sum())
        norm += weight * float((r.astype(np.float64) ** 2).sum())
    return float(np.sqrt(diff / norm)) if norm > 0 else None


def _fresh(cfg, n_batches: int):
    """Model, task, optimizer exactly as a run with this config starts them (same seed)."""
    seed_everything(cfg.seed)
    model = build(cfg.model.net, "model.net")
    model.train()
    task = build(cfg.model.task, "model.task")
    optimizer, _, _ = build_optimizer(cfg, model, max(1, n_batches), int(cfg.trainer.max_steps))
    return model, task, optimizer


def _judge(cfg, batches, measured, steps: int, run_check: bool):
    """``judge(overrides)``: the findings of the training steps with ``overrides`` applied, the FP32
    measurement reused when only the loss scaler changes, the emulated steps re-run."""
    def judge(over: dict) -> list[dict]:
        c = with_overrides(cfg, over)
        fresh = measured if reuses_measurement(over) else measure(*_fresh(c, steps), batches, build_amp(c))
        emulated = check(*_fresh(c, steps), batches, build_amp(c)) if run_check else None
        return diagnose(fresh, emulated, build_amp(c))["findings"]
    return judge


def examine(cfg) -> dict:
    """Measure, predict, check: everything ``tools/amp_doctor.py`` writes, as one dict."""

    validate(cfg)
    doc = cfg.get("doctor") or {}
    steps = doc.get("steps", 3)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"doctor.steps: expected a positive integer, got {steps!r}")
    eval_batch_count(doc)   # a bad doctor.eval_batches fails before anything runs
    for key in ("check", "check_fixes"):
        if not isinstance(doc.get(key, True), bool):
            raise ConfigError(f"doctor.{key}: expected true or false, got {doc.get(key)!r}")
    amp = build_amp(cfg)
    if not amp.enabled:
        raise ConfigError(f"amp: {cfg.amp.name} computes in FP32, nothing to predict; pick O1, O2, "
                          "bf16_O1 or bf16_O2")
    t0 = time.time()
    batches = train_batches(cfg, steps)
    if len(batches) < steps:
        raise ConfigError(f"doctor.steps: {steps}, but data={cfg.data.name} gives {len(batches)} "
                          f"batches of {cfg.model.batch_size}")
    measured = measure(*_fresh(cfg, steps), batches, amp)
    emulated = None
    if doc.get("check", True):
        emulated = check(*_fresh(cfg, steps), batches, build_amp(cfg))
    result = diagnose(measured, emulated, amp)
    n_eval = eval_batch_count(doc)
    if n_eval != 0:   # what runs in evaluation: the eval-mode forward on validation images
        probed = examine_eval(cfg, amp, measured, n_eval)
        result["findings"] = sorted(result["findings"] + probed["findings"], key=lambda f: -SEVERITY[f["severity"]])
        result["verdict"] = verdict(result["findings"])
        result["eval"], result["eval_records"] = probed["info"], probed["records"]
    t1 = time.time()
    if doc.get("check_fixes", True):   # no prescription its own judgement calls worse
        check_fixes(result["findings"], _judge(cfg, batches, measured, steps, bool(doc.get("check", True))))
    result.update(model=cfg.model.name, amp=cfg.amp.name, level=amp.level, dtype=amp.dtype,
                  black_list=list(amp.black), white_list=list(amp.white), master_grad=amp.master_grad,
                  steps=steps, batch_size=int(cfg.model.batch_size), data=cfg.data.name,
                  seconds={"measure": measured.seconds, "check": emulated.seconds if emulated else None,
                           "eval": result["eval"]["seconds"]["total"] if "eval" in result else None,
                           "fix_checks": time.time() - t1, "total": time.time() - t0})
    result["measured"], result["emulated"] = measured, emulated
    result["comparison"] = compare(measured, emulated) if emulated else None
    return result
