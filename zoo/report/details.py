"""The per-comparison lines under the parity table: which test and why, the per-seed differences,
runs that were not paired, the power line, the eval-only effect and the evaluation noise."""
from __future__ import annotations

from zoo.report.runs import seed_order


def _pp(x: float) -> str:
    return f"{x:+.2f}"


def _seed_list(items, fmt: str | None = None) -> str:
    return ", ".join(f"seed {seed} {fmt.format(v) if fmt else _pp(v)}" for seed, v in items)


def seed_ranges(seeds) -> str:
    """Seeds in numeric order, three or more consecutive ones collapsed: 0, 2, 3, 5-19."""
    ordered = sorted({str(x) for x in seeds}, key=seed_order)
    out, start, prev = [], None, None
    for s in ordered + [None]:
        n = int(s) if s is not None and s.lstrip("-").isdigit() else None
        if n is not None and prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out += [str(start)] if start == prev else (
                [str(start), str(prev)] if prev == start + 1 else [f"{start}-{prev}"])
            start = prev = None
        if n is not None:
            start = prev = n
        elif s is not None:
            out.append(s)
    return ", ".join(out)


def unpaired_lines(unpaired: list[dict]) -> list[str]:
    """One line per run left out, except runs whose seed has no run on the other side: those are one
    line per side (a 20-seed FP32 base against a 5-seed row would otherwise list 15 lines)."""
    lines, groups = [], {}
    for u in unpaired:
        if u.get("missing"):
            groups.setdefault((u["run_side"], u["missing"]), []).append(u)
    for u in unpaired:
        group = groups.get((u.get("run_side"), u.get("missing"))) if u.get("missing") else None
        if group and len(group) > 1:
            if u is group[0]:
                lines.append(f"- not paired: the {u['run_side']} runs of seeds "
                             f"{seed_ranges(g['seed'] for g in group)} ({len(group)} runs): no "
                             f"{u['missing']} run with those seeds")
            continue
        lines.append(f"- not paired: `{u['path']}` (seed {u['seed']}): {u['reason']}")
    return lines


def power_text(side: dict, delta: float) -> str:
    """The power line: smallest margin shown, and seeds the configured margin needs."""
    p = side.get("power")
    if not p:
        return "power: no comparison"
    if p["min_margin"] is None:
        return ("power: one seed on a side gives no variance estimate, so no margin can be shown; "
                "run two or more paired seeds and this line says how many the margin needs")
    unit = "paired seeds" if p["paired"] else "seeds per side"
    spread = "std of the per-seed differences" if p["paired"] else "sqrt(var FP32 + var AMP) over seeds"
    need = (f"{p['n_needed']} {unit}" if p["n_needed"] is not None else f"more than 10000 {unit}")
    text = (f"power: equivalence could be shown at any margin above {p['min_margin']:.2f} pp (largest "
            f"|bound| of the 90% CI); the ±{delta:g} pp margin needs {need} for {p['power']:.0%} power "
            f"({spread} {p['sd']:.2f} pp, true difference assumed 0)")
    if side.get("diff") is not None and abs(side["diff"]) >= delta:
        text += ("; the observed difference is beyond the margin: if it is real, no number of seeds "
                 "shows equivalence")
    return text


def nonfinite_lines(entry: dict, side: dict) -> list[str]:
    """Runs whose evaluation had inf/NaN outputs (summary.json eval_numerics), per seed."""
    lines = []
    for s in (entry["fp32"], side):
        if not s:
            continue
        counts = s.get("nonfinite") or {}
        for key, what in (("primary", "the evaluation behind the metric"),
                          ("train_precision", f"the {s['precision']} evaluation")):
            bad = counts.get(key) or {}
            if bad and not (key == "train_precision" and bad == counts.get("primary")):
                lines.append(f"- **non-finite outputs** in {what} ({s['precision']} runs; images of "
                             f"{counts.get('images')}): "
                             + _seed_list(sorted(bad.items(), key=lambda kv: seed_order(kv[0])), "{}"))
    return lines


def comparison_lines(entry: dict, side: dict) -> list[str]:
    """Markdown lines explaining one AMP-vs-FP32 comparison."""
    lines = [f"**{entry['group']} / {side['precision']} vs fp32**: {side['test']} ({side['test_reason']}); "
             f"verdict {side['verdict']}"]
    if side.get("pairs"):
        lines.append(f"- per-seed differences ({side['precision']} − fp32, pp): "
                     + _seed_list((p["seed"], p["diff"]) for p in side["pairs"]))
    lines += unpaired_lines(side.get("unpaired", []))
    lines.append(f"- {power_text(side, entry['delta'])}")
    effect = side.get("eval_only_effect")
    if effect:
        lines.append(f"- eval-only effect ({side['precision']} evaluation − FP32 evaluation of the same "
                     f"final weights): mean {_pp(effect['mean'])} pp; "
                     + _seed_list(sorted(effect["per_seed"].items(), key=lambda kv: seed_order(kv[0]))))
    lines += nonfinite_lines(entry, side)
    noise = []
    for s in (entry["fp32"], side):
        if s is None:
            continue
        cis = [c for c in s.get("eval_ci", []) if c]
        if cis:
            noise.append(f"{s['precision']}: " + ", ".join(
                f"seed {c['seed']} [{c['low']:.2f}, {c['high']:.2f}]" for c in cis))
    if noise:
        n_img = next(c["n_images"] for s in (entry["fp32"] or {}, side) for c in s.get("eval_ci", []) if c)
        lines.append(f"- evaluation noise (95% bootstrap CI over {n_img} validation images, pp): "
                     + "; ".join(noise))
        wide = [s["eval_ci_half_width"] for s in (entry["fp32"] or {}, side) if s.get("eval_ci_half_width")]
        if wide and max(wide) > entry["delta"]:
            lines.append(f"- evaluation split: a run's evaluation noise (±{max(wide):.2f} pp, mean 95% "
                         f"half-width) is wider than the ±{entry['delta']:g} pp margin. All runs are scored "
                         f"on the same {n_img} images, so this test covers seed-to-seed variation on this "
                         "split, not the choice of images, and on a split this small that choice can exceed the "
                         "margin: `python tools/split_noise.py <these runs>` measures it")
    return lines
