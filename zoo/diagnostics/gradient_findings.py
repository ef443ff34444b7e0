"""Gradients against fp16's range: the loss-scale window, and underflow judged by the signal lost.

A gradient entry that rounds to 0 costs what it carried: tiny entries beside large ones, or a whole
tensor whose gradient is ~0 in FP32 too (a BatchNorm bias behind another normalisation barely moves
either way), lose next to nothing, however many they are. So underflow is ranked and judged by
the share of the L2 norm of the fp16 gradients of a kind (the gradients flowing into low-precision
ops; the parameter gradients low-precision ops produce) in the entries that round to 0, or that
fall below the smallest normal, where fp16 keeps fewer than its 10 bits (:func:`~zoo.diagnostics.
numerics.signal_lost`). A tensor ranks by the share of its kind's norm it loses. The share of
entries is kept beside it, and shown as a note when many entries but little signal round to 0.
The O2 stored-gradient flush (after unscaling) is judged against every parameter's gradient: the
update.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from zoo.diagnostics.findings import FAIL_SHARE, RISKY_SHARE
from zoo.diagnostics.findings import finding as _finding
from zoo.diagnostics.numerics import Stats, loss_scale_window, pick_scale, signal_lost


@dataclass
class Family:
    """Gradients of one kind a GPU holds in the format, and the squared L2 norm their lost signal is
    measured against (default: their own, together)."""

    kind: str
    named: list          # (name, Stats) of the low-precision gradients
    reference: float = -1.0

    def __post_init__(self):
        if self.reference < 0:
            self.reference = sum(s.sumsq for _, s in self.named)


def gradient_families(measured) -> list[Family]:
    """Gradients into low ops' outputs, and into the parameters low ops consume or that are stored
    low (a weight gradient of an fp16 conv is fp16)."""
    ops = [(k, r.grad) for k, r in measured.records.items() if r.low and r.grad.nonzero]
    low = measured.low_params | measured.low_inputs
    params = [(n, s) for n, s in measured.params.items() if n in low and s.nonzero]
    return [Family("op-output", ops), Family("parameter", params)]


def gradient_window(families: list[Family], fmt) -> tuple[float, float]:
    """The loss scales that keep the largest fp16 gradient finite and lose at most 1% of either
    family's L2 norm below the smallest normal (:func:`loss_scale_window`)."""
    windows = [loss_scale_window([s for _, s in f.named], fmt, reference=f.reference) for f in families if f.named]
    if not windows:
        return loss_scale_window([], fmt)
    return max(w[0] for w in windows), min(w[1] for w in windows)


def signal_ranking(families: list[Family], bound: float, scale: float) -> tuple[dict, list]:
    """Per family the share of its gradient's L2 norm in entries ``|g| * scale < bound``, and every
    tensor ranked by the share of its family's norm it loses (worst first)."""
    lost = {f.kind: signal_lost([s for _, s in f.named], bound, scale, f.reference) for f in families if f.named}
    ranked = [(n, math.sqrt(s.sumsq_below(bound, scale) / f.reference) if f.reference > 0 else 0.0)
              for f in families for n, s in f.named]
    return lost, sorted(ranked, key=lambda x: -x[1])


def _element_share(named, bound, scale) -> float:
    nonzero = sum(s.nonzero for _, s in named)
    return sum(s.count_below(bound, scale) for _, s in named) / max(1, nonzero)


def _underflow(families, scale, dynamic, fmt, fix, span) -> list[dict]:
    """Gradients rounding to 0, or to fewer bits than fp16's normals keep, at ``scale``: judged by
    the signal they carry, not their count."""
    zero = fmt.min_subnormal / 2
    lost, ranked = signal_ranking(families, zero, scale)
    below, ranked_below = signal_ranking(families, fmt.min_normal, scale)
    signal, subnormal = max(lost.values(), default=0.0), max(below.values(), default=0.0)
    elements = _element_share([x for f in families for x in f.named], zero, scale)
    by_below = signal <= RISKY_SHARE < subnormal   # nothing much rounds to 0: rank by the bits lost
    worst = ", ".join(f"{n} {x:.1%}" for n, x in (ranked_below if by_below else ranked)[:3] if x > 0) or "none"
    static = "" if dynamic else " (static: it never grows)"
    data = dict(kind="underflow", share=signal, signal_lost=lost, below_normal=below, element_share=elements,
                worst=ranked[:10])
    if signal > RISKY_SHARE or subnormal > RISKY_SHARE:
        severity = "will fail" if (not dynamic and signal > FAIL_SHARE) else "risky"
        parts = " and ".join(f"{lost[k]:.1%} ({below[k]:.1%}) of the {k} gradients' L2 norm" for k in lost)
        return [_finding(severity, f"gradients underflow {fmt.name} at loss scale {scale:g}",
                         f"{parts} sit in {fmt.name} entries that round to 0 (that are subnormal or 0, keeping "
                         f"fewer than 10 bits) at scale {scale:g}{static}; worst tensors (share of their kind's "
                         f"norm {'below the smallest normal' if by_below else 'rounding to 0'}): {worst}; "
                         f"{elements:.1%} of the nonzero entries round to 0; {span}", fix, **data)]
    if elements > 5 * RISKY_SHARE:   # many entries, no signal: shown, not judged
        return [_finding("note", f"{elements:.0%} of the nonzero {fmt.name} gradient entries round to 0 at "
                         f"loss scale {scale:g}, carrying {signal:.2%} of the gradient's L2 norm",
                         f"they sit in tensors whose gradient is ~0 in FP32 too (a parameter barely moving "
                         f"either way); worst by signal: {worst}", "none needed", **data)]
    return []


def loss_scale_findings(measured, amp, fmt) -> tuple[list[dict], dict]:
    """Overflow and underflow of the scaled gradients at ``init_loss_scaling`` (the first steps)."""
    args = amp.scaler_args
    scale, dynamic = args["init_loss_scaling"], args["use_dynamic_loss_scaling"]
    families = gradient_families(measured)
    window = gradient_window(families, fmt)
    info = {"init_loss_scaling": scale, "dynamic": dynamic, "window": list(window)}
    named = [x for f in families for x in f.named]
    if fmt.name != "fp16" or not named:
        return [], info
    total = Stats()
    for _, s in named:
        total.merge(s)
    zero = fmt.min_subnormal / 2
    lost, _ = signal_ranking(families, zero, scale)
    over = total.count_above(fmt.max, scale)
    info.update(max_grad=total.max_abs, overflowing=over, signal_lost=lost,
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
                                f"amp.init_loss_scaling={good:g}", kind="calibration",
                                candidates=[f"amp.init_loss_scaling={window[1]:g}"] if good != window[1] else []))
        else:
            out.append(_finding("will fail", f"gradients overflow at the static loss scale {scale:g}",
                                f"largest gradient {total.max_abs:.3g} x {scale:g} > {fmt.max:g}: every step "
                                f"skipped; {span}", fix, kind="static overflow"))
    return out + _underflow(families, scale, dynamic, fmt, fix, span), info


def flush_findings(measured, amp, fmt) -> tuple[list[dict], dict]:
    """O2 without master_grad: gradients stored in the format after unscaling; tiny ones become 0.
    Judged by the share of the update's (all parameter gradients') L2 norm they carry."""
    low = [(n, s) for n, s in measured.params.items() if n in measured.low_params]
    if not low:
        return [], {}
    zero = fmt.min_subnormal / 2
    family = Family("parameter", low, sum(s.sumsq for s in measured.params.values()))
    lost, ranked = signal_ranking([family], zero, 1.0)
    signal = lost.get("parameter", 0.0)
    flushed = sum(s.count_below(zero) for _, s in low)
    share = flushed / max(1, sum(s.numel for _, s in low))
    share_nz = flushed / max(1, sum(s.nonzero for _, s in low))
    info = {"stored_low_params": len(low), "flushed_share": share, "flushed_share_of_nonzero": share_nz,
            "signal_lost": signal, "worst": ranked[:5]}
    if signal <= RISKY_SHARE and share <= RISKY_SHARE and share_nz <= 5 * RISKY_SHARE:
        return [], info
    worst = ", ".join(f"{n} {x:.1%}" for n, x in ranked[:3] if x > 0) or "none"
    what = (f"{share_nz:.0%} of the nonzero parameter-gradient entries ({share:.1%} of all) flush to 0 when "
            f"stored in {fmt.name}, {signal:.2%} of the update's L2 norm")
    why = (f"amp.master_grad=false keeps {len(low)} parameters' gradients in {fmt.name}; after unscaling, "
           f"|g| < 2^-25 becomes 0; worst by signal lost: {worst}. A larger loss scale does not help: the "
           "flush happens after unscaling")
    if signal <= RISKY_SHARE:   # entries of gradients that are ~0 in FP32 too: shown, not judged
        return [_finding("note", what, why + ". They carry next to none of the update (Adam turns a "
                         "gradient above its epsilon, 1e-8, into a full step: see the element share)",
                         "amp.master_grad=true", kind="flush", share=signal, element_share=share_nz)], info
    return [_finding("risky", what, why, "amp.master_grad=true", kind="flush", share=signal,
                     element_share=share_nz)], info
