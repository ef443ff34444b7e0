"""Top-k accuracy as summable counts, so ranks and batches reduce by addition."""
from __future__ import annotations

import numpy as np


def topk_correct(logits: np.ndarray, labels: np.ndarray, ks=(1, 5)) -> dict[str, float]:
    """Counts ``{"top1_correct": c1, "top5_correct": c5, "count": n}`` for one batch.

    A sample counts for top-k when its label is among the k largest logits; k larger than the
    number of classes counts every sample. Ties are broken by the lower class index (stable sort).
    """
    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels).reshape(-1)
    if logits.ndim != 2 or logits.shape[0] != labels.shape[0]:
        raise ValueError(f"logits {logits.shape} and labels {labels.shape} do not match")
    order = np.argsort(-logits, axis=1, kind="stable")
    out = {"count": float(labels.shape[0])}
    for k in ks:
        hit = (order[:, :k] == labels[:, None]).any(axis=1)
        out[f"top{k}_correct"] = float(hit.sum())
    return out


def accuracy_from_counts(sums: dict[str, float], ks=(1, 5)) -> dict[str, float]:
    """Turn pooled counts into ``{"top1": ..., "top5": ...}`` fractions in [0, 1]."""
    n = sums.get("count", 0.0)
    if n <= 0:
        raise ValueError("no samples were evaluated (empty validation split?)")
    return {f"top{k}": sums[f"top{k}_correct"] / n for k in ks}
