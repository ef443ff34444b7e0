"""From the doctor's FP32 measurement to ranked findings, each with the config line that fixes it.

Severities and the verdict: :mod:`zoo.diagnostics.findings`; the loss-scale and underflow findings:
:mod:`zoo.diagnostics.gradient_findings`; the eval-mode ones: :mod:`zoo.diagnostics.eval_findings`.
"""
from __future__ import annotations

import math

from zoo.amp import emulation as emu
from zoo.diagnostics.findings import SEVERITY, verdict
from zoo.diagnostics.findings import finding as _finding
from zoo.diagnostics.gradient_findings import flush_findings, loss_scale_findings
from zoo.diagnostics.numerics import FORMATS

LEGACY = {v: k for k, v in emu.ALIASES.items() if k.startswith("reduce_")}   # mean -> reduce_mean
HEADROOM = 4.0          # low-precision values within this factor of the format max are risky


def black_list_line(amp, op: str) -> str:
    """The black-list override that adds ``op`` (by its name in Paddle's lists) to the config's."""
    names = sorted({*amp.black, LEGACY.get(op, op)})
    return f"amp.custom_black_list=[{','.join(names)}]"


# Ops that carry a network's compute: black-listing one by type leaves almost nothing in low precision,
# so when few layers are at fault they are kept fp32 by name instead (amp.fp32_layers), the type next.
COMPUTE_OPS = {"conv2d", "depthwise_conv2d", "conv2d_transpose", "matmul", "matmul_v2", "linear"}
MAX_NAMED_LAYERS = 3


def fix_lines(amp, op: str, recs) -> tuple[str, list[str]]:
    """The fix for ``op`` overflowing in the layers of ``recs``, and the lines tried after it: for a
    compute op in at most :data:`MAX_NAMED_LAYERS` layers, ``amp.fp32_layers=[...]`` (those layers
    added to the config's), then the black list; otherwise the black list."""
    layers = list(dict.fromkeys(r.layer for r in recs))
    if op in COMPUTE_OPS and len(layers) <= MAX_NAMED_LAYERS and all(layers):
        names = list(dict.fromkeys([*getattr(amp, "fp32_layers", []), *layers]))
        return f"amp.fp32_layers=[{','.join(names)}]", [black_list_line(amp, op)]
    return black_list_line(amp, op), []


def _layers(recs, n=3) -> str:
    names = [f"{r.layer} ({r.layer_type})" for r in recs[:n]]
    return ", ".join(names) + (f" and {len(recs) - n} more" if len(recs) > n else "")


def forward_overflow(records, amp, fmt) -> list[dict]:
    by_op: dict = {}
    for r in records.values():
        if r.low and r.out.count_above(fmt.max) > 0:
            by_op.setdefault(r.op, []).append(r)
    # An op fed by an already overflowed output is a consequence, not a cause: named with its cause.
    roots = {op: recs for op, recs in by_op.items() if any(r.own_overflows for r in recs)}
    after = sorted(op for op in by_op if op not in roots)
    out = []
    for op, recs in roots.items():
        recs.sort(key=lambda r: -r.out.max_abs)
        share = sum(r.out.count_above(fmt.max) for r in recs) / max(1, sum(r.out.numel for r in recs))
        nan = (" Its backward is computed from that inf output (inf * 0 = NaN), so every gradient is "
               "NaN and every step is skipped." if op in emu._OUTPUT_GRAD else
               " The inf reaches the loss or its gradients and the scaler skips the step.")
        fix, candidates = fix_lines(amp, op, recs)
        out.append(_finding(
            "will fail", f"{op} overflows {fmt.name} in the forward: {_layers(recs)}",
            f"max |{op}| = {recs[0].out.max_abs:.3g} > {fmt.max:g} ({share:.2%} of its outputs), computed "
            f"in {fmt.name} ({recs[0].mode}-list op at {amp.level}); no loss scale changes a forward "
            f"value.{nan}" + (f" Downstream, fed by it: {', '.join(after)}." if after else ""),
            fix, kind=f"forward overflow {op}", op=op, layers=[r.key for r in recs],
            max_abs=recs[0].out.max_abs, candidates=candidates))
    return out


def near_overflow(records, amp, fmt) -> list[dict]:
    recs = sorted((r for r in records.values() if r.low and fmt.max / HEADROOM < r.out.max_abs
                   and r.out.count_above(fmt.max) == 0), key=lambda r: -r.out.max_abs)
    if not recs or fmt.name != "fp16":
        return []
    r = recs[0]
    fix, candidates = fix_lines(amp, r.op, [x for x in recs if x.op == r.op])
    return [_finding("risky", f"{len(recs)} op outputs within {HEADROOM:g}x of the {fmt.name} max: {_layers(recs)}",
                     f"max |{r.op}| = {r.out.max_abs:.3g} (limit {fmt.max:g}) over the measured "
                     "steps; activations usually grow as training proceeds", fix,
                     kind="near overflow", layers=[x.key for x in recs], candidates=candidates)]


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
                     "the sum cancels or spans a large map", black_list_line(amp, r.op), kind="bf16 sum",
                     layers=[x.key for x in bad])]


def check_findings(predicted: list[dict], emulated, calibration_steps: int) -> list[dict]:
    """Where the emulated steps disagree with the prediction."""
    skipped = sum(1 for s in emulated.stepped if not s)
    fails = any(f["severity"] == "will fail" for f in predicted)
    if skipped > calibration_steps and not fails:
        return [_finding("risky", f"the emulated steps skipped {skipped} of {len(emulated.stepped)} steps",
                         "non-finite gradients the FP32 measurement did not predict (see the per-layer table)",
                         "amp.guard.find_nonfinite_layer=true (tools/train.py) to name the layer",
                         kind="emulated skips")]
    return []


def diagnose(measured, emulated, amp) -> dict:
    """Findings ranked (worst first), verdict, and the numbers behind them."""
    fmt = FORMATS[amp.dtype]
    findings = forward_overflow(measured.records, amp, fmt) + near_overflow(measured.records, amp, fmt)
    scale_f, scale_info = loss_scale_findings(measured, amp, fmt)
    flush_f, flush_info = flush_findings(measured, amp, fmt)
    findings += scale_f + flush_f + bf16_findings(measured.records, amp, fmt)
    calib = 0   # skips the dynamic scaler needs to come down from init_loss_scaling into the window
    if any(f["kind"] == "calibration" for f in scale_f):
        calib = max(1, math.ceil(math.log2(amp.scaler_args["init_loss_scaling"] / scale_info["window"][1])))
    findings += check_findings(findings, emulated, calib) if emulated else []
    findings.sort(key=lambda f: -SEVERITY[f["severity"]])
    return {"verdict": verdict(findings), "findings": findings, "loss_scale": scale_info, "flush": flush_info,
            "format": fmt.name}
