"""Multi-class greedy NMS in NumPy, with the semantics of Paddle's ``multiclass_nms3`` as PP-YOLOE uses it.

PaddleDetection's ppyoloe head calls ``MultiClassNMS`` (ppdet/modeling/layers.py) with
``normalized=True`` (box width ``x2 - x1``, no +1), ``nms_eta=1`` and no background class. Per class:
keep scores ``> score_threshold``, take the ``nms_top_k`` best, greedily drop any box whose IoU with an
already kept box is ``> nms_threshold``; then keep the ``keep_top_k`` best over all classes.
Unlike the Paddle op, which groups its output by class, results here are sorted by score (descending;
ties keep class order, then input order).
"""
from __future__ import annotations

import numpy as np


def _iou_one_to_many(box, boxes):
    """IoU of ``box [4]`` with ``boxes [K, 4]``; degenerate boxes have zero area, 0/0 gives 0."""
    w = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = w * h
    area = max(box[2] - box[0], 0) * max(box[3] - box[1], 0)
    areas = np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
    union = area + areas - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def greedy_nms(boxes, scores, nms_threshold: float):
    """Indices (into ``boxes``) kept by greedy NMS, in descending score order."""
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        order = rest[_iou_one_to_many(boxes[i], boxes[rest]) <= nms_threshold]
    return np.asarray(keep, dtype=np.int64)


def multiclass_nms(boxes, scores, score_threshold: float = 0.01, nms_top_k: int = 1000, keep_top_k: int = 100,
                   nms_threshold: float = 0.7):
    """``boxes [A, 4]`` xyxy, ``scores [C, A]`` -> ``(boxes [K, 4] float32, scores [K] float32,
    labels [K] int64)`` sorted by score. ``nms_top_k`` / ``keep_top_k`` of -1 mean no limit."""
    boxes = np.asarray(boxes, dtype=np.float32)
    scores = np.asarray(scores, dtype=np.float32)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"multiclass_nms: boxes must have shape [A, 4], got {list(boxes.shape)}")
    if scores.ndim != 2 or scores.shape[1] != boxes.shape[0]:
        raise ValueError(f"multiclass_nms: scores must have shape [C, A] with A = {boxes.shape[0]}, "
                         f"got {list(scores.shape)}")
    labels, idx = np.nonzero(scores > score_threshold)
    cand_scores = scores[labels, idx]
    if nms_top_k > -1 and labels.size:
        by_class = np.lexsort((idx, -cand_scores, labels))  # class, then score descending, then index
        sorted_labels = labels[by_class]
        rank = np.arange(by_class.size) - np.searchsorted(sorted_labels, sorted_labels, side="left")
        chosen = by_class[rank < nms_top_k]
        labels, idx, cand_scores = labels[chosen], idx[chosen], cand_scores[chosen]
    # One pass over all candidates by descending score (ties: class, then index). A candidate's fate
    # depends only on the higher-scored boxes of its own class, so this equals per-class NMS followed
    # by the global keep_top_k cut, and it can stop as soon as keep_top_k boxes are kept.
    order = np.lexsort((idx, labels, -cand_scores))
    limit = order.size if keep_top_k < 0 else min(keep_top_k, order.size)
    per_class = np.bincount(labels, minlength=scores.shape[0])
    class_boxes, class_counts = {}, {}  # kept boxes of each class so far
    kept = np.empty(limit, dtype=np.int64)
    count = 0
    for j in order:
        if count == limit:
            break
        label, box = labels[j], boxes[idx[j]]
        n = class_counts.get(label, 0)
        if n and (_iou_one_to_many(box, class_boxes[label][:n]) > nms_threshold).any():
            continue
        if not n:
            class_boxes[label] = np.empty((per_class[label], 4), dtype=np.float32)
        class_boxes[label][n] = box
        class_counts[label] = n + 1
        kept[count] = j
        count += 1
    kept = kept[:count]
    return boxes[idx[kept]].reshape(-1, 4), cand_scores[kept], labels[kept].astype(np.int64)


def batch_multiclass_nms(boxes, scores, **kwargs):
    """``boxes [N, A, 4]``, ``scores [N, C, A]`` (NumPy or Paddle) -> list of N ``multiclass_nms`` results."""
    boxes = boxes.numpy() if hasattr(boxes, "numpy") else np.asarray(boxes)
    scores = scores.numpy() if hasattr(scores, "numpy") else np.asarray(scores)
    if boxes.ndim != 3 or scores.ndim != 3 or boxes.shape[0] != scores.shape[0]:
        raise ValueError(f"batch_multiclass_nms: expected boxes [N, A, 4] and scores [N, C, A], got "
                         f"{list(boxes.shape)} and {list(scores.shape)}")
    return [multiclass_nms(b, s, **kwargs) for b, s in zip(boxes, scores)]
