"""ICDAR-style IoU evaluation of text detections, as summable per-image counts.

Matches PaddleOCR's ``DetectionIoUEvaluator`` (ppocr/metrics/eval_det_iou.py, itself from MhLiao/DB):

* a ground-truth or detected polygon that shapely calls invalid (self-intersecting, degenerate) is
  dropped before anything else, as upstream does;
* a detection whose area lies more than ``area_precision_constraint`` inside some don't-care
  ground truth is a don't-care detection (neither a hit nor a false positive);
* matching is one-to-one and greedy: ground truths in order, and for each the first unmatched
  care detection (in detection order) whose IoU is strictly above ``iou_constraint``.

Only the three counts are returned per image, so batches and ranks reduce by addition and
``combine`` pools them over the whole set (ICDAR's "method" precision/recall/hmean).
"""
from __future__ import annotations

import numpy as np
import shapely
from shapely.geometry import Polygon

_EMPTY = {"gt_care": 0.0, "det_care": 0.0, "matched": 0.0}


def _valid_polygons(points_list) -> tuple[list[int], list[Polygon]]:
    """Indices and shapely polygons of the entries that form a valid polygon.

    Fewer than three points cannot even be built (upstream would raise there); we treat them as
    invalid so one bad detection cannot stop an evaluation.
    """
    keep, polys = [], []
    for i, pts in enumerate(points_list):
        pts = np.asarray(pts, dtype=np.float64).reshape(-1, 2)
        if pts.shape[0] < 3:
            continue
        poly = Polygon(pts)
        if poly.is_valid:
            keep.append(i)
            polys.append(poly)
    return keep, polys


class DetectionIoUEvaluator:
    """Per-image ICDAR IoU counts; see the module docstring for the rules.

    Args:
        iou_constraint: a pair matches when IoU is strictly greater than this.
        area_precision_constraint: a detection is don't-care when more than this fraction of its
            area lies inside one don't-care ground truth.
    """

    def __init__(self, iou_constraint: float = 0.5, area_precision_constraint: float = 0.5):
        self.iou_constraint = float(iou_constraint)
        self.area_precision_constraint = float(area_precision_constraint)

    def evaluate_image(self, gt_polys, gt_ignore, det_polys) -> dict[str, float]:
        """Counts for one image.

        Args:
            gt_polys: sequence of ground-truth polygons, each ``[M, 2]`` (x, y) points.
            gt_ignore: one truthy flag per ground truth (1 for ``###`` don't-care regions).
            det_polys: sequence of detected polygons, each ``[M, 2]``.

        Returns:
            ``{"gt_care": .., "det_care": .., "matched": ..}`` as floats.
        """
        gt_ignore = np.asarray(gt_ignore).reshape(-1).astype(bool)
        if len(gt_ignore) != len(gt_polys):
            raise ValueError(f"{len(gt_polys)} ground truths but {len(gt_ignore)} ignore flags")
        gt_keep, gts = _valid_polygons(gt_polys)
        _, dets = _valid_polygons(det_polys)
        gt_dont_care = np.array([bool(gt_ignore[i]) for i in gt_keep], dtype=bool)
        det_dont_care = self._det_dont_care(gts, gt_dont_care, dets)

        matched = 0
        if gts and dets:
            iou = self._iou_matrix(gts, dets)
            gt_used = gt_dont_care.copy()  # don't-care entries can never be matched
            det_used = det_dont_care.copy()
            for g in range(len(gts)):
                for d in range(len(dets)):
                    if not gt_used[g] and not det_used[d] and iou[g, d] > self.iou_constraint:
                        gt_used[g] = det_used[d] = True
                        matched += 1
        return {"gt_care": float(len(gts) - gt_dont_care.sum()),
                "det_care": float(len(dets) - det_dont_care.sum()),
                "matched": float(matched)}

    def _det_dont_care(self, gts, gt_dont_care, dets) -> np.ndarray:
        """Flag detections lying mostly (by their own area) inside a don't-care ground truth."""
        flags = np.zeros(len(dets), dtype=bool)
        ignored = [g for g, dc in zip(gts, gt_dont_care) if dc]
        if not ignored or not dets:
            return flags
        for d, det in enumerate(dets):
            area = det.area
            if area == 0:
                continue  # upstream takes 0/0 as precision 0
            for g in ignored:
                if g.intersection(det).area / area > self.area_precision_constraint:
                    flags[d] = True
                    break
        return flags

    @staticmethod
    def _iou_matrix(gts, dets) -> np.ndarray:
        """IoU [G, D] with the union computed as a polygon union, as upstream (not aG + aD - I)."""
        g = np.array(gts, dtype=object)[:, None]
        d = np.array(dets, dtype=object)[None, :]
        inter = shapely.area(shapely.intersection(d, g))
        union = shapely.area(shapely.union(d, g))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)

    @staticmethod
    def combine(sums: dict[str, float]) -> dict[str, float]:
        """Pooled ``{"precision", "recall", "hmean"}`` from summed counts (0 for empty denominators)."""
        gt, det, hit = (float(sums.get(k, 0.0)) for k in ("gt_care", "det_care", "matched"))
        recall = hit / gt if gt > 0 else 0.0
        precision = hit / det if det > 0 else 0.0
        hmean = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
        return {"precision": precision, "recall": recall, "hmean": hmean}


def sum_counts(per_image) -> dict[str, float]:
    """Add per-image count dicts (an empty iterable gives zeros)."""
    out = dict(_EMPTY)
    for counts in per_image:
        for k in out:
            out[k] += float(counts[k])
    return out
