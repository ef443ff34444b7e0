"""Is a deployed low-precision network as accurate as FP32? The paired verdict.

Both networks are scored on the same validation images. The metric difference (low minus FP32, in
percentage points) gets a percentile bootstrap interval. Each replicate resamples the images once
and scores both networks on that resample, so the interval is that of the paired difference (the
tasks' ``resampled_primary``, the draws of zoo.metrics.bootstrap). The verdict reads the interval
against the margin, as a TOST does: ``equivalent`` when it lies inside ±margin, ``different`` when
it lies wholly outside, ``not shown`` otherwise. How alike the two sets of predictions are beyond the
metric is each task's ``agreement`` (zoo/metrics/agreement.py).
"""
from __future__ import annotations

import numpy as np

from zoo.metrics.bootstrap import percentile_ci, resample_counts

__all__ = ["paired_difference", "verdict"]


def paired_difference(fp32_task, low_task, n_resamples: int, level: float = 0.90, seed: int = 0) -> dict:
    """The low-minus-FP32 primary metric difference in pp, with its paired bootstrap interval.

    Both tasks hold the per-image outcomes of their last evaluation, on the same images in the same
    order (``n_evaluated_images`` and ``resampled_primary``).
    """
    n = fp32_task.n_evaluated_images()
    if low_task.n_evaluated_images() != n:
        raise ValueError(f"the two evaluations saw {n} and {low_task.n_evaluated_images()} images")
    ones = np.ones((1, n), dtype=np.int64)
    point = 100.0 * float(low_task.resampled_primary(ones)[0] - fp32_task.resampled_primary(ones)[0])
    draws = resample_counts(n, n_resamples, seed)
    diffs = 100.0 * (np.asarray(low_task.resampled_primary(draws), dtype=np.float64)
                     - np.asarray(fp32_task.resampled_primary(draws), dtype=np.float64))
    lo, hi = percentile_ci(diffs, level)
    return {"delta_pp": point, "ci_pp": [lo, hi], "level": level, "n_resamples": int(n_resamples),
            "n_images": int(n), "seed": seed}


def verdict(ci, margin: float) -> str:
    """``equivalent`` (interval inside ±margin), ``different`` (wholly outside) or ``not shown``."""
    lo, hi = float(ci[0]), float(ci[1])
    if -margin < lo and hi < margin:
        return "equivalent"
    if lo >= margin or hi <= -margin:
        return "different"
    return "not shown"
