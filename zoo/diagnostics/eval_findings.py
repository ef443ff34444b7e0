"""Findings from the eval-mode forward (:mod:`zoo.diagnostics.eval_probe`), each fix checked first.

Three passes over the validation batches, from the same weights (``model.net.pretrained``):

1. FP32 values with the emulation's op decisions over every probed image: which low-precision ops
   exceed the format's max, by how much, and for which images (the cause);
2. the emulated numerics over the first batch and every image pass 1 flagged: whose outputs
   become inf/NaN (the cost; an image no op took above the max computes the same finite values
   up to rounding, and is not re-run);
3. per cause and per candidate fix, the flagged images again with the fix: a fix is printed only if
   every output stays finite and no low-precision op exceeds the max. ``trainer.eval_precision=fp32``
   is checked by pass 1 itself (its values are FP32's); a black-list entry by an emulated pass with
   the op added.
"""
from __future__ import annotations

import time

from zoo.amp import emulation as emu
from zoo.diagnostics.eval_probe import batch_size, probe_eval, regroup, val_batches
from zoo.diagnostics.numerics import FORMATS
from zoo.diagnostics.prescribe import LEGACY, black_list_line
from zoo.engine.run import ConfigError, build

EVAL_FP32 = "trainer.eval_precision=fp32"


def eval_batch_count(doc) -> int | None:
    """``doctor.eval_batches``: a count (0: no eval probe) or ``all``/null (the whole split)."""
    n = doc.get("eval_batches", 10)
    if n is None or n == "all":
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"doctor.eval_batches: expected a non-negative integer or all, got {n!r}")
    return n


def _rule(amp, rounding: bool) -> emu.Emulation:
    opts = amp.emulation_options if rounding else {"forward": False, "backward": False}
    return emu.Emulation(amp.level, amp.dtype, amp.white, amp.black, **opts)


def _with_black(amp, op: str) -> emu.Emulation:
    """The emulation of ``amp`` with ``op`` added to its black list (as the printed line adds it)."""
    black = sorted({*amp.black, LEGACY.get(op, op)})
    return emu.Emulation(amp.level, amp.dtype, amp.white, black, **amp.emulation_options)


def _roots(records) -> dict:
    """Low-precision ops that went above the format's max from inputs that had not: op -> records."""
    roots: dict = {}
    for r in records.values():
        if r.low and r.own_overflows:
            roots.setdefault(r.op, []).append(r)
    for recs in roots.values():
        recs.sort(key=lambda r: -r.max_abs)
    return dict(sorted(roots.items(), key=lambda kv: -kv[1][0].max_abs))


def _check_black(amp, model, task, val_set, batches, images, op, fmt) -> dict:
    """Pass 3 for a black-list entry: the ``images`` emulated with ``op`` added to the black list."""
    sub, _ = regroup(batches, images)
    run = probe_eval(model, task, sub, val_set, _with_black(amp, op), fmt.max, watch=True)
    over = sorted(r.key for r in run.records.values() if r.low and r.above)
    return {"images": run.images, "nonfinite_images": len(run.nonfinite), "ops_above_max": over,
            "prevents": not run.nonfinite and not over, "how": "emulated with the entry on the flagged images",
            "seconds": run.seconds}


def _fp32_check(fp32) -> dict:
    """``trainer.eval_precision=fp32`` checked: the FP32 pass's values are an FP32 evaluation's."""
    return {"images": fp32.images, "nonfinite_images": len(fp32.nonfinite), "prevents": not fp32.nonfinite,
            "how": "the FP32 pass over every probed image"}


def _train_max(measured, keys) -> str:
    got = [measured.records[k].out.max_abs for k in keys if k in measured.records]
    return f"; the training steps (train mode, batch statistics) reach {max(got):.3g} there" if got else ""


def _finding(op, recs, amp, fmt, bad, probed, checks, measured, covered, eval_precision="both") -> dict:
    share = sum(r.above for r in recs) / max(1, sum(r.numel for r in recs))
    names = ", ".join(f"{r.key} ({r.layer_type})" for r in recs[:3]) + (
        f" and {len(recs) - 3} more" if len(recs) > 3 else "")
    cost = (f"emulated, {len(bad)} of {probed} validation images get non-finite outputs: the evaluation's "
            "metric is computed on NaN/inf maps for them" if bad else
            "emulated, the outputs stay finite (the inf saturates downstream) but are not FP32's")
    ok = [line for line, c in checks.items() if c["prevents"]]
    fix = ok[0] if ok else "none prevents it among " + ", ".join(checks)
    note = (" (trainer.eval_precision=fp32: the final evaluation, the run's metric, in FP32; periodic "
            "evaluations, trainer.eval_every, stay in the training precision)"
            if EVAL_FP32 in ok and eval_precision != "fp32" else "")
    note += "".join(f". {line} also keeps them finite (emulated on the flagged images); it runs every {op} in "
                    "fp32, in training too" for line in ok[1:] if line != EVAL_FP32)
    why = (f"in the eval-mode forward ({covered}): max |{op}| = {recs[0].max_abs:.3g} > {fmt.max:g} "
           f"({share:.2%} of its outputs), computed in {fmt.name} ({recs[0].mode}-list op at {amp.level})"
           f"{_train_max(measured, [r.key for r in recs])}; {cost}. A deployment that folds BatchNorm into "
           f"the convolutions (Paddle Inference) computes other values there: `tools/export.py "
           f"export.precision={fmt.name}` checks that form{note}")
    severity = "will fail" if bad and len(bad) == probed else "risky"
    if eval_precision == "fp32":  # already the recipe's (or the user's) setting: the metric is FP32's
        severity, fix = "note", f"none needed: {EVAL_FP32} is set"
        why += (f". This config already has {EVAL_FP32}: the run's metric is the FP32 evaluation, and "
                f"the {fmt.name} evaluation recorded beside it (summary.json primary_metric_train_precision_eval, "
                "eval_numerics) and any periodic evaluation (trainer.eval_every) meet these values")
    return {"severity": severity, "mode": "eval",
            "kind": f"eval overflow {op}", "what": f"{op} overflows {fmt.name} in the eval-mode forward: {names}",
            "why": why, "fix": fix, "candidates": ok[1:], "op": op, "layers": [r.key for r in recs],
            "max_abs": recs[0].max_abs, "nonfinite_images": len(bad), "images": probed, "fix_checks": checks}


def _unlocated(bad, probed, fp32, covered) -> dict:
    """Emulated outputs non-finite with no low op above the max in FP32 (e.g. an fp16 accumulation)."""
    return {"severity": "will fail" if len(bad) == probed else "risky", "mode": "eval", "kind": "eval non-finite",
            "what": f"{len(bad)} of {probed} validation images get non-finite outputs in the emulated eval-mode forward",
            "why": f"({covered}) no low-precision op exceeds the format's max in FP32 values; the emulated "
                   "numerics (rounding, fp16 accumulation) make them: the evaluation's metric is computed on "
                   "NaN/inf maps for them", "fix": EVAL_FP32 if not fp32.nonfinite else "none checked",
            "nonfinite_images": len(bad), "images": probed,
            "fix_checks": {EVAL_FP32: _fp32_check(fp32)}}


def probe_findings(model, task, batches, val_set, amp, measured, covered: str, eval_precision: str = "both") -> dict:
    """Passes 1-3 over ``batches`` (a model in any state; it is left in eval mode): findings with
    their fixes checked, what was seen (doctor.json) and the op records of the FP32 pass."""
    t0, fmt = time.time(), FORMATS[amp.dtype]
    if amp.level == "O2":   # decorate's casts: the parameters enter every op low
        emu.mark_o2_parameters(model, amp.dtype)
    probed = sum(batch_size(b) for b in batches)
    fp32 = probe_eval(model, task, batches, val_set, _rule(amp, False), fmt.max, watch=True)
    first = list(range(batch_size(batches[0]))) if batches else []
    sub, order = regroup(batches, first + fp32.flagged)
    emulated = probe_eval(model, task, sub, val_set, _rule(amp, True), fmt.max, watch=False)
    bad = [order[i] for i in emulated.nonfinite]
    findings, seconds = [], {"fp32": fp32.seconds, "emulated": emulated.seconds}
    roots = _roots(fp32.records)
    for op, recs in roots.items():
        checks = {EVAL_FP32: _fp32_check(fp32)}
        line = black_list_line(amp, op)
        checks[line] = _check_black(amp, model, task, val_set, batches, sorted({*bad, *fp32.flagged}), op, fmt)
        seconds[f"check {line}"] = checks[line].pop("seconds")
        findings.append(_finding(op, recs, amp, fmt, bad, probed, checks, measured, covered, eval_precision))
    if bad and not roots:
        findings.append(_unlocated(bad, probed, fp32, covered))
    if fp32.nonfinite:   # the weights themselves, whatever the precision
        findings.append({"severity": "risky", "mode": "eval", "kind": "eval non-finite in fp32",
                         "what": f"{len(fp32.nonfinite)} of {probed} validation images get non-finite outputs in FP32 too",
                         "why": f"({covered}) the weights (model.net.pretrained) make them, not the precision",
                         "fix": "none: not a precision setting"})
    seconds["total"] = time.time() - t0
    info = {"covered": covered, "images": probed, "emulated_images": emulated.images,
            "flagged_images": fp32.flagged, "nonfinite_images": bad, "nonfinite_images_fp32": fp32.nonfinite,
            "seconds": seconds}
    return {"findings": findings, "info": info, "records": fp32.records}


def examine_eval(cfg, amp, measured, n_batches: int | None) -> dict:
    """The eval-mode probe of ``cfg``'s weights (``model.net.pretrained``) on ``n_batches``
    validation batches of ``model.eval_batch_size`` (None: all): :func:`probe_findings`."""
    t0 = time.time()
    batches, val_set = val_batches(cfg, n_batches)
    model, task = build(cfg.model.net, "model.net"), build(cfg.model.task, "model.task")
    probed = sum(batch_size(b) for b in batches)
    size = "x".join(str(d) for d in batches[0]["image"].shape[2:]) if batches else "-"
    covered = (f"{probed} of {len(val_set)} validation images, {len(batches)} batches of "
               f"{int(cfg.model.eval_batch_size)} at {size} px")
    out = probe_findings(model, task, batches, val_set, amp, measured, covered,
                         str(cfg.trainer.get("eval_precision", "both")))
    out["info"].update(split=len(val_set), batches=len(batches))
    out["info"]["seconds"]["total"] = time.time() - t0   # data and weights loading included
    return out
