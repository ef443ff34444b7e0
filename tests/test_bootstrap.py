"""Bootstrap CIs over validation images (top-1, DB hmean, COCO mAP) against known cases."""
from __future__ import annotations

import math

import numpy as np
import pytest
from test_coco_metric import _coco

from zoo.metrics.bootstrap import bootstrap_hmean, bootstrap_mean, percentile_ci, resample_counts
from zoo.metrics.coco_eval import COCOMetric


def test_resample_counts_rows_are_resamples():
    w = resample_counts(7, 50, seed=3)
    assert w.shape == (50, 7) and (w.sum(axis=1) == 7).all() and (w >= 0).all()
    assert (resample_counts(7, 50, seed=3) == w).all()  # seeded: the same CI every time


def test_top1_bootstrap_matches_the_binomial_interval():
    # 400 images, 320 correct: the sampling distribution of the accuracy is binomial,
    # sd = sqrt(0.8 * 0.2 / 400) = 0.02, so the 95% interval is 0.8 -/+ 1.96 * 0.02 = [0.7608, 0.8392].
    hits = np.r_[np.ones(320), np.zeros(80)]
    ci = bootstrap_mean(hits, n_resamples=4000)
    assert ci["value"] == pytest.approx(0.8)
    assert ci["low"] == pytest.approx(0.7608, abs=0.006) and ci["high"] == pytest.approx(0.8392, abs=0.006)
    assert ci["n_images"] == 400 and ci["level"] == 0.95
    # every image right: no resample can be anything but 1
    assert bootstrap_mean(np.ones(30), 200)["low"] == 1.0


def test_hmean_bootstrap_recomputes_hmean_from_resampled_sums():
    # identical images: every resample has the same hmean (P = R = 1/2 -> hmean 1/2)
    same = bootstrap_hmean([(2, 2, 1)] * 10, 300)
    assert same["value"] == pytest.approx(0.5) and same["low"] == same["high"] == pytest.approx(0.5)
    # two images, one perfectly found (1, 1, 1) and one missed with a false alarm (1, 1, 0):
    # resamples AA (p = 1/4) hmean 1, AB (1/2) hmean 1/2, BB (1/4) hmean 0.
    ci = bootstrap_hmean([(1, 1, 1), (1, 1, 0)], 4000)
    assert ci["value"] == pytest.approx(0.5) and (ci["low"], ci["high"]) == (0.0, 1.0)
    w = resample_counts(2, 4000)
    frac_aa = np.mean(w[:, 0] == 2)
    assert frac_aa == pytest.approx(0.25, abs=0.03)
    # the 25%..75% interval sits on the middle atom
    assert percentile_ci(np.where(w[:, 0] == 2, 1.0, np.where(w[:, 0] == 1, 0.5, 0.0)), 0.4) == (0.5, 0.5)


def test_coco_map_resampling_reuses_matching():
    # image 1: one box found exactly (AP 1 on its own); image 2: one box, no detection (AP 0).
    coco = _coco({1: (200, 200), 2: (200, 200)}, [(1, 1, [10, 10, 50, 50]), (2, 1, [20, 20, 60, 60])])
    m = COCOMetric(coco, {0: 1})
    m.update(1, [[10, 10, 60, 60]], [0.9], [0])
    m.update(2, np.zeros((0, 4)), np.zeros(0), np.zeros(0))
    out = m.accumulate()
    # both images: recall reaches 1/2 at precision 1 -> 51 of 101 recall points -> 51/101
    assert out["mAP"] == pytest.approx(51 / 101)
    assert m.resampled_map([1, 1]) == pytest.approx(out["mAP"])
    assert m.resampled_map([2, 2]) == pytest.approx(out["mAP"])  # doubling every image changes nothing
    assert m.resampled_map([2, 0]) == pytest.approx(1.0)
    assert m.resampled_map([0, 2]) == pytest.approx(0.0)
    ci = m.bootstrap_map(100)
    assert ci["value"] == pytest.approx(51 / 101) and ci["low"] == 0.0 and ci["high"] == 1.0
    assert ci["n_resamples"] == 100 and math.isfinite(ci["time_s"])
