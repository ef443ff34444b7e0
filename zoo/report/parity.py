"""Compare every AMP group with its FP32 group on the primary metric and give a verdict.

Metric values in summaries are fractions in [0, 1]; everything here is in percentage points (x100),
the unit the equivalence margins in configs/report.yaml are written in.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml

from zoo.report.runs import ReportInputError, Run
from zoo.report.stats import tost, welch_t_test

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "report.yaml"
FP32 = "fp32"


def load_margins(path: Path = DEFAULT_CONFIG) -> dict:
    """The delta table and the short-run rule of configs/report.yaml."""
    try:
        cfg = yaml.safe_load(Path(path).read_text())
        return {"short_below_steps": int(cfg["short_below_steps"]),
                "deltas": {regime: {str(k).lower(): float(v) for k, v in table.items()}
                           for regime, table in cfg["deltas"].items()}}
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise ReportInputError(f"{path}: unusable report config ({err})") from None


def pick_delta(metric: str, steps: int, margins: dict, override: float | None) -> tuple[float, str]:
    """Margin in pp and where it came from ("--delta", or the regime "full"/"short")."""
    if override is not None:
        return float(override), "--delta"
    regime = "short" if steps < margins["short_below_steps"] else "full"
    table = margins["deltas"].get(regime, {})
    if metric.lower() not in table:
        raise ReportInputError(f"{DEFAULT_CONFIG}: no '{regime}' delta for metric '{metric}'; "
                               "add one or pass --delta")
    return table[metric.lower()], regime


def _side(runs: list[Run]) -> dict:
    """Per-precision row facts: metric in pp over seeds, speed, memory, scaler behaviour."""
    vals = np.array([r.metric * 100.0 for r in runs])
    s = [r.summary for r in runs]

    def mean_of(key):
        xs = [float(x[key]) for x in s if isinstance(x.get(key), (int, float))]
        return float(np.mean(xs)) if xs else None

    scales = sorted({float(x["final_loss_scale"]) for x in s
                     if isinstance(x.get("final_loss_scale"), (int, float))})
    return {"precision": runs[0].precision, "n": len(runs), "seeds": [x["seed"] for x in s],
            "values": vals.tolist(), "mean": float(vals.mean()),
            "std": float(vals.std(ddof=1)) if len(vals) > 1 else 0.0,
            "batch_size_per_rank": s[0].get("batch_size_per_rank"),
            "global_batch_size": s[0].get("global_batch_size"), "world_size": s[0].get("world_size"),
            "peak_memory_mb": mean_of("peak_memory_mb"), "peak_memory_kind": s[0].get("peak_memory_kind"),
            "images_per_s": mean_of("images_per_s"), "skipped_steps": mean_of("skipped_steps"),
            "final_loss_scale": scales, "device": s[0].get("device"),
            "runs": [str(r.path) for r in runs]}


def compare(amp: list[Run], fp32: list[Run], delta: float, alpha: float) -> dict:
    """Verdict of one AMP side against the FP32 side (both lists of runs, one per seed)."""
    a = np.array([r.metric * 100.0 for r in amp])
    b = np.array([r.metric * 100.0 for r in fp32])
    if len(a) >= 2 and len(b) >= 2:
        t = tost(a, b, delta, alpha)
        welch = welch_t_test(a, b)
        if t["equivalent"]:
            verdict = "equivalent"
        elif welch["p"] < alpha and abs(t["diff"]) > delta:
            # Significantly different AND beyond the margin: a difference that matters.
            verdict = "different"
        else:
            verdict = "not shown"  # too few seeds or too much noise to decide either way
        return {"test": "TOST (Welch)", "diff": t["diff"], "ci": list(t["ci"]), "p_tost": t["p"],
                "p_welch": welch["p"], "df": t["df"], "se": t["se"], "verdict": verdict}
    # One seed on a side: no variance estimate, so only the raw difference against the margin.
    diff = float(a.mean() - b.mean())
    return {"test": "single seed", "diff": diff, "ci": None, "p_tost": None, "p_welch": None,
            "df": None, "se": None, "verdict": "equivalent" if abs(diff) <= delta else "different"}


def _label(key: tuple) -> str:
    model, data, steps, gbs = key
    return f"{model} / {data} / {steps} steps / batch {gbs}"


def parity_table(groups: dict, delta: float | None = None, alpha: float = 0.05,
                 margins: dict | None = None) -> list[dict]:
    """One entry per group: FP32 reference facts and one comparison per AMP precision."""
    margins = margins or load_margins()
    table = []
    for key, by_prec in groups.items():
        first = next(iter(by_prec.values()))[0]
        metric = first.metric_name
        names = {r.metric_name for runs in by_prec.values() for r in runs}
        if len(names) > 1:
            raise ReportInputError(f"{first.path / 'summary.json'}: runs of group {_label(key)} "
                                   f"disagree on the primary metric ({sorted(names)})")
        d, source = pick_delta(metric, key[2], margins, delta)
        fp32 = by_prec.get(FP32)
        entry = {"group": _label(key), "model": key[0], "data": key[1], "steps": key[2],
                 "global_batch_size": key[3], "metric": metric, "delta": d, "delta_source": source,
                 "alpha": alpha, "fp32": _side(fp32) if fp32 else None, "amp": []}
        for prec in sorted(p for p in by_prec if p != FP32):
            side = _side(by_prec[prec])
            if fp32:
                side.update(compare(by_prec[prec], fp32, d, alpha))
            else:
                side.update({"test": "no FP32 runs", "diff": None, "ci": None, "p_tost": None,
                             "p_welch": None, "df": None, "se": None, "verdict": "not shown"})
            entry["amp"].append(side)
        table.append(entry)
    return table


def overall_ok(table: list[dict]) -> bool:
    """True only when at least one AMP comparison exists and every one is "equivalent"."""
    verdicts = [side["verdict"] for entry in table for side in entry["amp"]]
    return bool(verdicts) and all(v == "equivalent" for v in verdicts)


def finite_or_none(x):
    """JSON-safe number: NaN/inf become None (json would write invalid tokens)."""
    return x if not isinstance(x, float) or math.isfinite(x) else None
