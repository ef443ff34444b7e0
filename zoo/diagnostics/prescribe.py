"""From the doctor's FP32 measurement to ranked findings, each with the config line that fixes it.

Severity: ``will fail`` (the run cannot train as configured: an fp16 forward overflow on every step,
gradients overflowing under a static scale, most gradients flushed under a static scale),
``risky`` (training goes on but loses something: flushed or subnormal gradients, bf16 sums that
cancel, values close to the format's max), ``note`` (no effect on the verdict, e.g. a dynamic
scaler calibrating down for a few steps). The verdict is the worst severity, ``OK`` when none.
"""
from __future__ import annotations

import math

from zoo.amp import emulation as emu
from zoo.diagnostics.numerics import FORMATS, Stats, loss_scale_window, pick_scale

SEVERITY = {"will fail": 2, "risky": 1, "note": 0}
LEGACY = {v: k for k, v in emu.ALIASES.items() if k.startswith("reduce_")}   # mean -> reduce_mean
HEADROOM = 4.0          # low-precision values within this factor of the format max are risky
RISKY_SHARE = 0.01      # gradient entries flushed / subnormal above this share are risky
FAIL_SHARE = 0.10       # under a static scale, flushed activation gradients above this share fail


def _black(amp, op: str) -> str:
    names = sorted({*amp.black, LEGACY.get(op, op)})
    return f"amp.custom_black_list=[{','.join(names)}]"


def _layers(recs, n=3) -> str:
    names = [f"{r.layer} ({r.layer_type})" for r in recs[:n]]
    return ", ".join(names) + (f" and {len(recs) - n} more" if len(recs) > n else "")


def _finding(severity, what, why, fix, **data):
    return {"severity": severity, "what": what, "why": why, "fix": fix, **data}


def forward_overflow(records, amp, fmt) -> list[dict]:
    by_op: dict = {}
    for r in records.values():
        if r.low and r.out.count_above(fmt.max) > 0:
            by_op.setdefault(r.op, []).append(r)
    # An op fed by an already overflowed output is a consequence, not a cause: named with its cause.
    roots = {op: recs for op, recs in by_op.items() if any(r.inputs_overflowed < r.calls for r in recs)}
    after = sorted(op for op in by_op if op not in roots)
    out = []
    for op, recs in roots.items():
        recs.sort(key=lambda r: -r.out.max_abs)
        share = sum(r.out.count_above(fmt.max) for r in recs) / max(1, sum(r.out.numel for r in recs))
        nan = (" Its backward is computed from that inf output (inf * 0 = NaN), so every gradient is "
               "NaN and every step is skipped." if op in emu._OUTPUT_GRAD else
               " The inf reaches the loss or its gradients and the scaler skips the step.")
        out.append(_finding(
            "will fail", f"{op} overflows {fmt.name} in the forward: {_layers(recs)}",
            f"max |{op}| = {recs[0].out.max_abs:.3g} > {fmt.max:g} ({share:.2%} of its outputs), computed "
            f"in {fmt.name} ({recs[0].mode}-list op at {amp.level}); no loss scale changes a forward "
            f"value.{nan}"
            + (f" Downstream, fed by it: {', '.join(after)}." if after else ""), _black(amp, op), op=op, layers=[r.key for r in recs], max_abs=recs[0].out.max_abs))
    return out


def near_overflow(records, amp, fmt) -> list[dict]:
    recs = sorted((r for r in records.values() if r.low and fmt.max / HEADROOM < r.out.max_abs
                   and r.out.count_above(fmt.max) == 0), key=lambda r: -r.out.max_abs)
    if not recs or fmt.name != "fp16":
        return []
    r = recs[0]
    return [_finding("risky", f"{len(recs)} op outputs within {HEADROOM:g}x of the {fmt.name} max: {_layers(recs)}",
                     f"max |{r.op}| = {r.out.max_abs:.3g} (limit {fmt.max:g}) over the measured "
                     "steps; activations usually grow as training proceeds", _black(amp, r.op),
                     layers=[x.key for x in recs])]


def gradient_window(measured, amp, fmt) -> tuple[list[tuple[str, Stats]], tuple[float, float]]:
    """Gradients a GPU holds in the format: into low ops' outputs, into the parameters low ops
    consume (a weight gradient of an fp16 conv is fp16), and stored low (O2)."""
    named = [(k, r.grad) for k, r in measured.records.items() if r.low and r.grad.nonzero]
    low = measured.low_params | measured.low_inputs
    named += [(n, s) for n, s in measured.params.items() if n in low and s.nonzero]
    return named, loss_scale_window([s for _, s in named], fmt)


def loss_scale_findings(measured, amp, fmt) -> tuple[list[dict], dict]:
    """Overflow and underflow of the scaled gradients at ``init_loss_scaling`` (the first steps)."""
    args = amp.scaler_args
    scale, dynamic = args["init_loss_scaling"], args["use_dynamic_loss_scaling"]
    named, window = gradient_window(measured, amp, fmt)
    info = {"init_loss_scaling": scale, "dynamic": dynamic, "window": list(window)}
    if fmt.name != "fp16" or not named:
        return [], info
    total = Stats()
    for _, s in named:
        total.merge(s)
    zero = fmt.min_subnormal / 2
    lost = sorted(((n, s.mass_below(zero, scale)) for n, s in named), key=lambda x: -x[1])
    mean_lost = sum(x for _, x in lost) / len(lost)
    over = total.count_above(fmt.max, scale)
    info.update(max_grad=total.max_abs, overflowing=over, mean_mass_flushed=mean_lost,
                flushed=total.count_below(zero, scale) / max(1, total.nonzero),
                subnormal=total.count_below(fmt.min_normal, scale) / max(1, total.nonzero))
    good = pick_scale(window)
    fix = f"amp.init_loss_scaling={good:g}" + ("" if dynamic else " amp.use_dynamic_loss_scaling=true")
    span = (f"window [{window[0]:g}, {window[1]:g}]" if window[0] <= window[1] else
            f"no scale keeps both ends (needs >= {window[0]:g} for the small ones, <= {window[1]:g} for the largest)")
    out = []
    if over:
        steps = max(1, math.ceil(math.log2(scale / window[1])))
        if dynamic:
            out.append(_finding("note", f"the first ~{steps} steps are skipped while the scaler calibrates",
                                f"largest gradient {total.max_abs:.3g} x scale {scale:g} > {fmt.max:g}; {span}; "
                                "each skip drops one batch's update: no loss on average, but it spreads short "
                                "runs (db_det fine-tune: 0.5 pp between twins, MODEL_CARDS.md ablation)",
                                f"amp.init_loss_scaling={window[1]:g}"))
        else:
            out.append(_finding("will fail", f"gradients overflow at the static loss scale {scale:g}",
                                f"largest gradient {total.max_abs:.3g} x {scale:g} > {fmt.max:g}: every step "
                                f"skipped; {span}", fix))
    bad = [(n, x) for n, x in lost if x > 5 * RISKY_SHARE]
    if mean_lost > RISKY_SHARE or bad:
        severity = "will fail" if (not dynamic and mean_lost > FAIL_SHARE) else "risky"
        worst = ", ".join(f"{n} {x:.0%}" for n, x in lost[:3])
        out.append(_finding(severity, f"gradients underflow {fmt.name} at loss scale {scale:g}",
                            f"on average {mean_lost:.1%} of each {fmt.name} gradient's magnitude (L1) sits in "
                            f"entries that round to 0 at scale {scale:g}{'' if dynamic else ' (static: it never grows)'};"
                            f" {len(bad)} of {len(named)} tensors lose > {5 * RISKY_SHARE:.0%}, worst {worst}; {span}",
                            fix, share=mean_lost))
    return out, info


def flush_findings(measured, amp, fmt) -> tuple[list[dict], dict]:
    """O2 without master_grad: gradients stored in the format after unscaling; tiny ones become 0."""
    low = [s for n, s in measured.params.items() if n in measured.low_params]
    if not low:
        return [], {}
    total = Stats()
    for s in low:
        total.merge(s)
    lost = total.count_below(fmt.min_subnormal / 2)
    share, share_nz = lost / max(1, total.numel), lost / max(1, total.nonzero)
    per = sorted(((n, s.count_below(fmt.min_subnormal / 2) / max(1, s.numel)) for n, s in measured.params.items()
                  if n in measured.low_params), key=lambda x: -x[1])
    info = {"stored_low_params": len(low), "flushed_share": share, "flushed_share_of_nonzero": share_nz,
            "worst": per[:5]}
    if share <= RISKY_SHARE and share_nz <= 5 * RISKY_SHARE:
        return [], info
    worst = ", ".join(f"{n} {s:.0%}" for n, s in per[:3])
    return [_finding("risky", f"{share_nz:.0%} of the nonzero parameter-gradient entries ({share:.1%} of all) "
                     f"flush to 0 when stored in {fmt.name}",
                     f"amp.master_grad=false keeps {len(low)} parameters' gradients in {fmt.name}; after "
                     f"unscaling, |g| < 2^-25 becomes 0 (no update for those weights); worst: {worst}. A larger "
                     "loss scale does not help: the flush happens after unscaling", "amp.master_grad=true",
                     share=share)], info


def bf16_findings(records, amp, fmt) -> list[dict]:
    if fmt.name != "bf16":
        return []
    recs = sorted((r for r in records.values() if r.reduction_error > 0), key=lambda r: -r.reduction_error)
    bad = [r for r in recs if r.reduction_error > 8 * fmt.unit_roundoff]
    if not bad:
        return []
    r = bad[0]
    return [_finding("risky", f"bf16 sums lose the loss's precision: {_layers(bad)}",
                     f"relative error of {r.op} over {r.out.numel // max(1, r.calls)} values "
                     f"up to {r.reduction_error:.2%} (bf16 keeps 8 bits: {fmt.unit_roundoff:.2%} per rounding); "
                     "the sum cancels or spans a large map", _black(amp, r.op), layers=[x.key for x in bad])]


def check_findings(predicted: list[dict], emulated, calibration_steps: int) -> list[dict]:
    """Where the emulated steps disagree with the prediction."""
    skipped = sum(1 for s in emulated.stepped if not s)
    fails = any(f["severity"] == "will fail" for f in predicted)
    if skipped > calibration_steps and not fails:
        return [_finding("risky", f"the emulated steps skipped {skipped} of {len(emulated.stepped)} steps",
                         "non-finite gradients the FP32 measurement did not predict (see the per-layer table)",
                         "amp.guard.find_nonfinite_layer=true (tools/train.py) to name the layer")]
    return []


def diagnose(measured, emulated, amp) -> dict:
    """Findings ranked (worst first), verdict, and the numbers behind them."""
    fmt = FORMATS[amp.dtype]
    findings = forward_overflow(measured.records, amp, fmt) + near_overflow(measured.records, amp, fmt)
    scale_f, scale_info = loss_scale_findings(measured, amp, fmt)
    flush_f, flush_info = flush_findings(measured, amp, fmt)
    findings += scale_f + flush_f + bf16_findings(measured.records, amp, fmt)
    calib = 0   # skips the dynamic scaler needs to come down from init_loss_scaling into the window
    if any(f["severity"] == "note" for f in scale_f):
        calib = max(1, math.ceil(math.log2(amp.scaler_args["init_loss_scaling"] / scale_info["window"][1])))
    findings += check_findings(findings, emulated, calib) if emulated else []
    findings.sort(key=lambda f: -SEVERITY[f["severity"]])
    worst = max((SEVERITY[f["severity"]] for f in findings), default=0)
    verdict = {2: "will fail", 1: "risky", 0: "OK"}[worst]
    return {"verdict": verdict, "findings": findings, "loss_scale": scale_info, "flush": flush_info,
            "format": fmt.name}
