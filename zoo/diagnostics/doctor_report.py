"""tools/amp_doctor.py's outputs: the terminal table, doctor.json, doctor.png and index.html."""
from __future__ import annotations

import html
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt
import numpy as np

from zoo.diagnostics.numerics import FORMATS, OFFSET, Stats


def _quantile_exp(s: Stats, q: float) -> float:
    """2^e below which a share ``q`` of the nonzero entries lie (from the exponent histogram)."""
    if not s.nonzero:
        return 0.0
    c = np.cumsum(s.hist) / s.nonzero
    return 2.0 ** (int(np.searchsorted(c, q)) - OFFSET)


def op_rows(result: dict) -> list[dict]:
    """One row per recorded op: forward and gradient magnitudes, prediction and emulated check."""
    fmt = FORMATS[result["dtype"]]
    scale = result["loss_scale"]["init_loss_scaling"] if fmt.name == "fp16" else 1.0
    comp = (result.get("comparison") or {}).get("ops", {})
    records = result["measured"].records
    ref = sum(r.grad.sumsq for r in records.values() if r.low)   # the fp16 op-output gradients (gradient_findings)
    rows = []
    for key, r in records.items():
        c = comp.get(key, {})
        lost = math.sqrt(r.grad.sumsq_below(fmt.min_subnormal / 2, scale) / ref) if ref > 0 and r.grad.numel else None
        rows.append({"key": key, "layer": r.layer, "layer_type": r.layer_type, "op": r.op, "mode": r.mode,
                     "precision": fmt.name if r.low else "fp32", "out": r.out.summary(fmt),
                     "grad": r.grad.summary(fmt, scale) if r.grad.numel else None,
                     "grad_p01": _quantile_exp(r.grad, 0.01) if r.grad.numel else None, "grad_signal_lost": lost,
                     "reduction_error": r.reduction_error or None, **c})
    return rows


def _risk(row) -> float:
    if row["precision"] == "fp32":
        return -1.0
    g = row["grad"] or {}
    return max(row["out"]["max_abs"] / 65504.0, row["grad_signal_lost"] or 0.0, g.get("above_max", 0.0) * 1e3)


def _fmt(x, spec="{:.3g}"):
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):   # a cosine against a non-finite emulated tensor
        return "nan"
    return spec.format(x)


def table(result: dict, rows: list[dict], top: int) -> str:
    fmt = FORMATS[result["dtype"]]
    ls = result["loss_scale"]
    head = (f"model={result['model']} amp={result['amp']} ({result['dtype']} {result['level']}, black list "
            f"{result['black_list'] or '[]'}, master_grad {result['master_grad']}, loss scale "
            f"{ls['init_loss_scaling']:g} {'dynamic' if ls['dynamic'] else 'static'}); {result['steps']} "
            f"steps of batch {result['batch_size']} on data={result['data']}")
    low = [r for r in rows if r["precision"] != "fp32"]
    lines = [head, f"{len(low)} of {len(rows)} op outputs computed in {fmt.name}; top {top} by risk "
             "(max|g|*S: gradient into the output at the initial loss scale; g->0: the share of the fp16 op-output "
             "gradients' L2 norm it loses to entries rounding to 0, n->0: the share of its entries that do; "
             "relerr, cos, g cos: emulated step 1 against FP32):",
             f"{'layer:op':<44} {'type':<14} {'max|x|':>9} {'>max':>7} {'max|g|*S':>9} {'g->0':>6} {'n->0':>6} "
             f"{'relerr':>7} {'cos':>6} {'g cos':>6}", "-" * 122]
    scale = ls["init_loss_scaling"] if fmt.name == "fp16" else 1.0
    for r in sorted(low, key=_risk, reverse=True)[:top]:
        g = r["grad"] or {}
        lines.append(f"{r['key'][-44:]:<44} {r['layer_type'][:14]:<14} {_fmt(r['out']['max_abs']):>9} "
                     f"{_fmt(r['out']['above_max'], '{:.1%}'):>7} "
                     f"{_fmt(g['max_abs'] * scale if g else None):>9} {_fmt(r['grad_signal_lost'], '{:.1%}'):>6} "
                     f"{_fmt(g.get('flushed'), '{:.0%}'):>6} "
                     f"{_fmt(r.get('act_rel_err'), '{:.1e}'):>7} {_fmt(r.get('act_cos'), '{:.3f}'):>6} "
                     f"{_fmt(r.get('grad_cos'), '{:.3f}'):>6}")
    lines.append("-" * 122)
    lines += _check_lines(result) + _eval_lines(result, fmt)
    lines.append("findings (worst first):" if result["findings"] else "findings: none")
    for i, f in enumerate(result["findings"], 1):
        lines += [f"{i}. [{f['severity']}] {f['what']}", f"   why: {f['why']}", f"   fix: {f['fix']}"]
        lines += _fix_check_lines(f.get("fix_check"))
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines)


def _fix_check_lines(c: dict | None) -> list[str]:
    if not c or not c.get("checked"):
        return []
    out = []
    if c.get("verdict_with_fix"):
        out.append(f"   checked: verdict with it {c['verdict_with_fix']} (without: {c['verdict_without']}); {c['how']}")
    out += [f"   rejected: {r['fix']} ({', '.join(r['worse'])})" for r in c.get("rejected", [])]
    return out


def eval_rows(result: dict) -> list[dict]:
    """One row per low-precision op of the eval-mode probe (FP32 values): magnitude against the max."""
    return [{"key": r.key, "layer": r.layer, "layer_type": r.layer_type, "op": r.op, "mode": r.mode,
             "max_abs": r.max_abs, "above_max": r.above / max(1, r.numel), "causes": r.own_overflows}
            for r in result.get("eval_records", {}).values() if r.low]


def _eval_lines(result: dict, fmt) -> list[str]:
    ev = result.get("eval")
    if ev is None:
        return ["eval-mode probe: off (doctor.eval_batches=0)"]
    rows = sorted(eval_rows(result), key=lambda r: -r["max_abs"])
    over = [r for r in rows if r["above_max"] > 0]
    lines = [f"eval-mode probe (model.eval() under the same rule, as evaluation runs; {ev['covered']}; "
             f"{ev['seconds']['total']:.0f} s): {len(rows)} ops in {fmt.name}, {len(over)} above its max; largest:"]
    lines += [f"  {r['key'][-44:]:<44} {r['layer_type'][:14]:<14} {_fmt(r['max_abs']):>9} {_fmt(r['above_max'], '{:.2%}'):>7}"
              for r in (over or rows)[:3]]
    lines.append(f"  emulated on {ev['emulated_images']} images (the first batch and the {len(ev['flagged_images'])} "
                 f"an op took above the max): {len(ev['nonfinite_images'])} with non-finite outputs; FP32: "
                 f"{len(ev['nonfinite_images_fp32'])}")
    return lines


def _check_lines(result: dict) -> list[str]:
    emu, measured = result.get("emulated"), result["measured"]
    pre = (["parameter-gradient entries a GPU would flush storing them low (FP32 measurement), per step: "
            + ", ".join(f"{x:.1%}" for x in measured.flushed)] if measured.flushed else [])
    if emu is None:
        return pre + ["emulated check: skipped (doctor.check=false)"]
    skipped = [i + 1 for i, s in enumerate(emu.stepped) if not s]
    scales = ", ".join(_fmt(s, "{:g}") for s in emu.scales) if any(s is not None for s in emu.scales) else "none"
    line = (f"emulated check ({len(emu.stepped)} steps): skipped steps {skipped or 'none'}; loss scale per "
            f"step {scales}; loss {', '.join(_fmt(v, '{:.4g}') for v in emu.losses)} (FP32: "
            f"{', '.join(_fmt(v, '{:.4g}') for v in measured.losses)})")
    out = pre + [line]
    update = (result.get("comparison") or {}).get("update_rel_err")
    if update is not None:   # the signal the update keeps: ~0 FP32 gradients weigh ~0 here
        out.append(f"  step 1, every parameter's gradient (the update) emulated against FP32: relative L2 error {update:.3g}")
    lost = (result.get("comparison") or {}).get("lost_nonzero_param_grads")
    if lost is not None:
        out.append(f"  step 1: {lost:.0%} of the stored-low gradient entries FP32 has nonzero are 0 emulated "
                   f"(predicted over all steps: {result['flush'].get('flushed_share_of_nonzero', 0):.0%} flushed by "
                   "storing; more can underflow earlier, in the fp16 backward)")
    if emu.flushed:
        out.append("  emulated, flushed by the fp16 store itself (share of all stored entries), per step: "
                   + ", ".join("skipped" if x is None else f"{x:.1%}" for x in emu.flushed))
    return out


def plot(result: dict, rows: list[dict], path: Path) -> None:
    fmt = FORMATS[result["dtype"]]
    scale = result["loss_scale"]["init_loss_scaling"] if fmt.name == "fp16" else 1.0
    layers: dict = {}
    for key, r in result["measured"].records.items():
        if r.low:
            a, g = layers.setdefault(r.layer, (Stats(), Stats()))
            a.merge(r.out)
            g.merge(r.grad)
    names = list(layers)
    if len(names) > 40:
        keep = set(sorted(names, key=lambda n: -layers[n][0].max_abs)[:40])
        names = [n for n in names if n in keep]
    fig, axes = plt.subplots(1, 2, figsize=(14, max(3.0, 0.22 * len(names) + 1.5)), sharey=True,
                             layout="constrained")
    y = np.arange(len(names))
    for ax, idx, title, mult in ((axes[0], 0, "activations |x|", 1.0), (axes[1], 1, f"gradients |g| x scale {scale:g}", scale)):
        floor = fmt.min_subnormal / 1e4   # bars start here when the 1st percentile is lower still
        lo = [max(_quantile_exp(layers[n][idx], 0.01) * mult, floor) for n in names]
        hi = [max(layers[n][idx].max_abs * mult, floor) for n in names]
        bad = [h >= fmt.max for h in hi]
        ax.barh(y, np.array(hi) - np.array(lo), left=lo, color=["#c33" if b else "#48a" for b in bad])
        ax.set_xscale("log")
        ax.set_xlim(floor, max(fmt.max * 100, max(hi, default=1.0) * 10))
        ax.axvspan(fmt.min_normal, fmt.max, color="#efe", zorder=0)
        ax.axvline(fmt.max, color="r", ls="--", label=f"{fmt.name} max {fmt.max:.3g}")
        ax.axvline(fmt.min_normal, color="orange", ls="--", label=f"smallest normal {fmt.min_normal:.2g}")
        ax.axvline(fmt.min_subnormal, color="k", ls=":", label=f"smallest subnormal {fmt.min_subnormal:.2g}")
        ax.set_title(title + " (1st percentile .. max)")
        ax.legend(fontsize=7, loc="best")
    lo_s, hi_s = result["loss_scale"]["window"]
    if fmt.name == "fp16" and lo_s <= hi_s:
        axes[1].set_xlabel(f"loss-scale window [{lo_s:g}, {hi_s:g}] keeps the largest finite, 99% normal")
    axes[0].set_yticks(y)
    axes[0].set_yticklabels([n[-40:] for n in names], fontsize=6)
    axes[0].invert_yaxis()
    fig.suptitle(f"{result['model']} {result['amp']}: {fmt.name} ops, per layer — verdict {result['verdict']}")
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _json(result: dict, rows: list[dict]) -> dict:
    skip = {"measured", "emulated", "comparison", "eval_records"}
    out = {k: v for k, v in result.items() if k not in skip}
    out["ops"] = rows
    if "eval_records" in result:
        out["eval"] = {**result["eval"], "ops": eval_rows(result)}
    emu = result.get("emulated")
    if emu is not None:
        out["check"] = {"stepped": emu.stepped, "loss_scale": emu.scales, "loss": emu.losses,
                        "flushed_param_grad_share": emu.flushed,
                        "predicted_flushed_param_grad_share": result["measured"].flushed,
                        "params": (result.get("comparison") or {}).get("params", {}),
                        "lost_nonzero_param_grads": (result.get("comparison") or {}).get("lost_nonzero_param_grads"),
                        "update_rel_err": (result.get("comparison") or {}).get("update_rel_err")}
    return out


def _html(result: dict, text: str) -> str:
    items = "".join(f"<li><b>{html.escape(f['severity'])}</b>: {html.escape(f['what'])}<br>"
                    f"{html.escape(f['why'])}<br>fix: <code>{html.escape(f['fix'])}</code>"
                    f"{html.escape(' '.join(_fix_check_lines(f.get('fix_check'))))}</li>"
                    for f in result["findings"])
    return ("<!doctype html><html><head><meta charset='utf-8'><title>AMP doctor</title>"
            "<style>body{font-family:sans-serif}pre{font-size:12px}img{max-width:100%}</style></head><body>"
            f"<h1>AMP doctor: {html.escape(result['model'])} {html.escape(result['amp'])} — "
            f"{html.escape(result['verdict'])}</h1><h2>Findings</h2><ol>{items or '<li>none</li>'}</ol>"
            "<h2>Per layer</h2><img src='doctor.png' alt='doctor.png'>"
            f"<h2>Table</h2><pre>{html.escape(text)}</pre></body></html>\n")


def write(result: dict, out: Path, top: int = 15) -> str:
    """Write doctor.json, doctor.png, index.html into ``out``; return the terminal text."""
    out.mkdir(parents=True, exist_ok=True)
    rows = op_rows(result)
    text = table(result, rows, top)
    (out / "doctor.json").write_text(json.dumps(_json(result, rows), indent=1, default=float))
    plot(result, rows, out / "doctor.png")
    (out / "index.html").write_text(_html(result, text))
    return text + f"\nwrote {out}/doctor.json, doctor.png, index.html"
