"""Agreement of two networks' predictions of the same images, beyond the metric they score.

The export's precision check reports it beside its verdict (each task's ``agreement`` picks its
measure, zoo/tasks):

- detections (boxes or text polygons): the share of FP32 detections matched by a low-precision one
  of the same class at IoU >= 0.9, and the largest score difference over matched pairs;
- classification: the share of images with the same top-1 class, and the largest probability
  difference.
"""
from __future__ import annotations

import numpy as np
import shapely

__all__ = ["MATCH_IOU", "box_agreement", "class_agreement", "polygon_agreement"]

MATCH_IOU = 0.9


def _iou_xyxy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _iou_polygons(a, b) -> np.ndarray:
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)))
    pa = np.array([shapely.make_valid(shapely.Polygon(np.asarray(p, np.float64).reshape(-1, 2))) for p in a],
                  dtype=object)[:, None]
    pb = np.array([shapely.make_valid(shapely.Polygon(np.asarray(p, np.float64).reshape(-1, 2))) for p in b],
                  dtype=object)[None, :]
    inter, union = shapely.area(shapely.intersection(pa, pb)), shapely.area(shapely.union(pa, pb))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _match(iou: np.ndarray, same: np.ndarray, scores_a, scores_b) -> tuple[int, float]:
    """Greedy one-to-one matching at IoU >= MATCH_IOU (best pairs first): (matched, max score diff)."""
    iou = np.where(same, iou, 0.0)
    matched, worst = 0, 0.0
    used_a, used_b = set(), set()
    for flat in np.argsort(-iou, axis=None):
        i, j = np.unravel_index(flat, iou.shape)
        if iou[i, j] < MATCH_IOU:
            break
        if i in used_a or j in used_b:
            continue
        used_a.add(i)
        used_b.add(j)
        matched += 1
        worst = max(worst, abs(float(scores_a[i]) - float(scores_b[j])))
    return matched, worst


def _summary(total: int, matched: int, worst: float, what: str) -> dict:
    return {"fp32_detections": total, "matched": matched,
            "matched_share": matched / total if total else 1.0, "max_score_diff": worst, "what": what}


def box_agreement(fp32_preds, low_preds, min_score: float = 0.0) -> dict:
    """Per image ``(boxes [K, 4] xyxy, scores [K], labels [K])`` lists (PP-YOLOE predictions); only
    detections scoring at least ``min_score`` count (the clients' draw threshold)."""
    total = matched = 0
    worst = 0.0
    for (ba, sa, la), (bb, sb, lb) in zip(fp32_preds, low_preds):
        ka, kb = np.asarray(sa) >= min_score, np.asarray(sb) >= min_score
        ba, sa, la = np.asarray(ba)[ka], np.asarray(sa)[ka], np.asarray(la)[ka]
        bb, sb, lb = np.asarray(bb)[kb], np.asarray(sb)[kb], np.asarray(lb)[kb]
        total += len(sa)
        if len(sa) and len(sb):
            m, w = _match(_iou_xyxy(ba, bb), la[:, None] == lb[None, :], sa, sb)
            matched, worst = matched + m, max(worst, w)
    return _summary(total, matched, worst, f"FP32 boxes scoring >= {min_score:g} matched at IoU >= {MATCH_IOU}")


def polygon_agreement(fp32_preds, low_preds) -> dict:
    """Per image ``(polygons, scores)`` lists (DB predictions)."""
    total = matched = 0
    worst = 0.0
    for (pa, sa), (pb, sb) in zip(fp32_preds, low_preds):
        total += len(pa)
        if len(pa) and len(pb):
            iou = _iou_polygons(pa, pb)
            m, w = _match(iou, np.ones_like(iou, dtype=bool), sa, sb)
            matched, worst = matched + m, max(worst, w)
    return _summary(total, matched, worst, f"FP32 text boxes matched at IoU >= {MATCH_IOU}")


def class_agreement(fp32_probs, low_probs) -> dict:
    """Per image ``[C]`` probability rows, or per batch ``[N, C]`` arrays (the export's softmax output)."""
    a = np.vstack([np.asarray(p, np.float64) for p in fp32_probs])
    b = np.vstack([np.asarray(p, np.float64) for p in low_probs])
    same = a.argmax(axis=1) == b.argmax(axis=1)
    diff = np.abs(a - b)
    worst = float(diff.max()) if np.isfinite(diff).all() else float("inf")
    return {"images": int(len(a)), "same_top1": int(same.sum()), "same_top1_share": float(same.mean()),
            "max_prob_diff": worst, "what": "images whose top-1 class is the same"}
