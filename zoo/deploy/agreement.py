"""Over the user's images: how often the low-precision prediction disagrees with FP32, and a verdict.

The disagreement share is ``1 - sum(agreed) / sum(units)`` over images (units per task, zoo/deploy/
tasks.py). Its interval is a percentile bootstrap over images, the ratio of sums recomputed on each
resample (zoo/metrics/bootstrap.py draws the resamples), since the user's images are the sample.

The verdict is an equivalence test against a margin: "equivalent" when the interval's upper end is
within it, "different" when its lower end is beyond it, "not shown" otherwise; any non-finite value
in a low-precision output is "different" outright (a deployment that emits inf/NaN is broken even
where the arg-max survives). As in the export check (zoo/export/resolution.py), a margin finer than
one unit cannot be resolved: one changed unit of 19 is 5.3 %, over a 5 % margin, so the note says
how many units it would take.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from zoo.export.resolution import binomial_quantile
from zoo.metrics.bootstrap import percentile_ci, resample_counts

__all__ = ["DEFAULT_MARGINS_PCT", "agreement_verdict", "paired_agreement", "resolution_note"]

# Disagreement, in percent of the units, that still counts as "keeps its predictions".
# - text_det 5 % of FP32 text boxes not matched at IoU 0.9: fp16 moves probabilities near the 0.3
#   threshold by ~1e-3 and so box edges by a pixel; on a 20 px high line one pixel costs ~5 % IoU,
#   so a few boxes of tens are expected to cross 0.9 without a reader seeing any change.
# - det 5 % of FP32 boxes (same class, IoU 0.9): likewise for box edges; a score near draw_threshold
#   flipping in or out is the other expected source.
# - cls / text_cls 1 % of images flip top-1: a flip needs two classes within rounding of each other,
#   which real models show on about that share of ambiguous images; more is a real change.
# - text_rec 2 % of strings change: a string is many arg-maxes, each able to flip, so looser than
#   cls; an OCR engine's own string-level noise between releases is of this order.
DEFAULT_MARGINS_PCT = {"text_det": 5.0, "det": 5.0, "cls": 1.0, "text_cls": 1.0, "text_rec": 2.0}


def paired_agreement(per_image: Sequence[Mapping], n_resamples: int = 1000, level: float = 0.90,
                     seed: int = 0) -> dict:
    """Pooled disagreement of per-image ``agree`` dicts, with a seeded percentile bootstrap interval.

    Returns ``{"disagreement_pct", "ci_low_pct", "ci_high_pct", "level", "n_resamples", "seed",
    "n_images", "n_units", "n_agreed", "unit_pct", "nonfinite_images"}``; with no units at all
    (no FP32 box on any image) the percentages and the interval are None.
    """
    units = np.array([float(r["units"]) for r in per_image])
    agreed = np.array([float(r["agreed"]) for r in per_image])
    if np.any(agreed > units) or np.any(agreed < 0):
        raise ValueError("per-image agreement: expected 0 <= agreed <= units on every image")
    n_units = float(units.sum())
    stats = {"level": level, "n_resamples": int(n_resamples), "seed": int(seed), "n_images": len(units),
             "n_units": int(n_units), "n_agreed": int(agreed.sum()),
             "unit_pct": 100.0 / n_units if n_units else None,
             "nonfinite_images": int(sum(bool(r.get("nonfinite", False)) for r in per_image))}
    if not n_units:
        return {**stats, "disagreement_pct": None, "ci_low_pct": None, "ci_high_pct": None}
    w = resample_counts(len(units), n_resamples, seed)
    u, a = w @ units, w @ agreed
    # a resample of only unit-less images says nothing against agreement: count it as 0 %
    rates = np.where(u > 0, 100.0 * (1.0 - a / np.where(u > 0, u, 1.0)), 0.0)
    low, high = percentile_ci(rates, level)
    return {**stats, "disagreement_pct": float(100.0 * (1.0 - agreed.sum() / n_units)), "ci_low_pct": low,
            "ci_high_pct": high}


def agreement_verdict(stats: Mapping, margin_pct: float, nonfinite: bool) -> str:
    """``"different"`` if any low-precision output held inf/NaN; else ``"equivalent"`` when the
    interval's upper end is <= ``margin_pct``, ``"different"`` when its lower end is above it, and
    ``"not shown"`` otherwise (or when there were no units to compare)."""
    if nonfinite or stats.get("nonfinite_images"):
        return "different"
    if stats.get("ci_high_pct") is None:
        return "not shown"
    if stats["ci_high_pct"] <= margin_pct:
        return "equivalent"
    if stats["ci_low_pct"] > margin_pct:
        return "different"
    return "not shown"


def resolution_note(stats: Mapping, margin_pct: float, unit: str = "unit") -> str | None:
    """A line when one ``unit`` is more than the margin (19 boxes: one box = 5.3 % > 5 %), else None."""
    if not stats.get("n_units"):
        return f"no {unit} in FP32 on any of the {stats.get('n_images', 0)} images: nothing to compare"
    one = stats["unit_pct"]
    if one <= margin_pct:
        return None
    q = binomial_quantile(stats["n_images"], (1 + stats["level"]) / 2)
    need = math.ceil(100.0 * q / margin_pct)
    return (f"resolution: one {unit} is {one:.1f} % of the {stats['n_units']}, more than the {margin_pct:g} % "
            f"margin, so a single changed {unit} cannot be shown equivalent; with about {need} or more of them (more "
            f"images) one change could pass at the {100 * stats['level']:.0f} % level")
