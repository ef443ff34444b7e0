"""Bootstrap confidence intervals over validation images: how much of a run's metric is evaluation
noise (which images happen to be in the validation split) rather than training.

Each resample draws as many images as the split holds, with replacement; it is represented by how
often each image was drawn (a multinomial count vector), so per-image statistics that add up
(top-1 hits; DB's matched / ground-truth / detection counts) resample with one matrix product.
The interval is the percentile interval of the resampled metric.
"""
from __future__ import annotations

import time

import numpy as np

DEFAULT_RESAMPLES = 1000
LEVEL = 0.95
SEED = 0  # fixed: the interval describes the validation split, not the run's seed


def resample_counts(n_items: int, n_resamples: int, seed: int = SEED) -> np.ndarray:
    """[n_resamples, n_items] draw counts, each row a bootstrap resample of ``n_items`` items."""
    if n_items <= 0:
        raise ValueError("bootstrap over an empty validation split")
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_items, np.full(n_items, 1.0 / n_items), size=n_resamples)


def percentile_ci(values, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates (numpy's linear interpolation)."""
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(np.asarray(values, dtype=float), [tail, 1.0 - tail])
    return float(lo), float(hi)


def _result(values, point: float, n_items: int, n_resamples: int, level: float, seed: int,
            t0: float, what: str) -> dict:
    lo, hi = percentile_ci(values, level)
    return {"value": float(point), "low": lo, "high": hi, "level": level, "n_resamples": n_resamples,
            "n_images": n_items, "seed": seed, "method": f"percentile bootstrap over validation images ({what})",
            "time_s": round(time.perf_counter() - t0, 3)}


def bootstrap_mean(correct, n_resamples: int = DEFAULT_RESAMPLES, level: float = LEVEL,
                   seed: int = SEED) -> dict:
    """CI of a mean of per-image values (top-1: 1 for a correct image, 0 otherwise)."""
    t0 = time.perf_counter()
    x = np.asarray(correct, dtype=np.float64).reshape(-1)
    w = resample_counts(x.size, n_resamples, seed)
    return _result(w @ x / x.size, x.mean(), x.size, n_resamples, level, seed, t0, "per-image hits")


def hmean_from_sums(gt, det, hit):
    """ICDAR precision/recall/hmean from summed counts, vectorised (0 where undefined)."""
    gt, det, hit = (np.asarray(v, dtype=np.float64) for v in (gt, det, hit))
    with np.errstate(divide="ignore", invalid="ignore"):
        recall = np.where(gt > 0, hit / np.where(gt > 0, gt, 1), 0.0)
        precision = np.where(det > 0, hit / np.where(det > 0, det, 1), 0.0)
        s = precision + recall
        return np.where(s > 0, 2 * precision * recall / np.where(s > 0, s, 1), 0.0)


def bootstrap_hmean(counts, n_resamples: int = DEFAULT_RESAMPLES, level: float = LEVEL,
                    seed: int = SEED) -> dict:
    """CI of DB's hmean from per-image ``(gt_care, det_care, matched)`` rows: images are resampled,
    their counts summed, and hmean recomputed from the sums (as the metric itself pools them)."""
    t0 = time.perf_counter()
    c = np.asarray(counts, dtype=np.float64).reshape(-1, 3)
    w = resample_counts(len(c), n_resamples, seed)
    sums = w @ c
    point = float(hmean_from_sums(*c.sum(axis=0)))
    return _result(hmean_from_sums(sums[:, 0], sums[:, 1], sums[:, 2]), point, len(c), n_resamples,
                   level, seed, t0, "per-image gt/det/matched counts")


def bootstrap_statistic(stat, n_items: int, point: float, n_resamples: int, level: float = LEVEL,
                        seed: int = SEED, what: str = "") -> dict:
    """CI of any ``stat(counts)`` taking a per-image draw-count vector (COCO mAP re-accumulates)."""
    t0 = time.perf_counter()
    w = resample_counts(n_items, n_resamples, seed)
    return _result([stat(row) for row in w], point, n_items, n_resamples, level, seed, t0, what)
