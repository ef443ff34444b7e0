"""Box helpers for the PP-YOLOE loss and assigners (xyxy boxes, ltrb distances, Paddle tensors).

Formulas follow PaddleDetection ppdet/modeling/bbox_utils.py (batch_iou_similarity,
batch_distance2bbox, bbox2distance, bbox_center) and ppdet/modeling/losses/iou_loss.py (GIoULoss).
Areas of pixel boxes exceed the float16 range (640 x 640 > 65504), so callers run these in float32.
"""
from __future__ import annotations

import paddle


def bbox_center(boxes):
    """Centres ``[..., 2]`` (cx, cy) of xyxy boxes ``[..., 4]``."""
    return (boxes[..., 0:2] + boxes[..., 2:4]) * 0.5


def batch_iou(boxes1, boxes2, eps: float = 1e-9):
    """IoU of every pair: ``boxes1 [N, M, 4]`` x ``boxes2 [N, A, 4]`` -> ``[N, M, A]``.

    Widths/heights are ``x2 - x1`` (continuous coordinates); inverted boxes count as empty.
    """
    b1 = boxes1.unsqueeze(2)  # [N, M, 1, 4]
    b2 = boxes2.unsqueeze(1)  # [N, 1, A, 4]
    lt = paddle.maximum(b1[..., 0:2], b2[..., 0:2])
    rb = paddle.minimum(b1[..., 2:4], b2[..., 2:4])
    overlap = (rb - lt).clip(min=0).prod(-1)
    area1 = (b1[..., 2:4] - b1[..., 0:2]).clip(min=0).prod(-1)
    area2 = (b2[..., 2:4] - b2[..., 0:2]).clip(min=0).prod(-1)
    return overlap / (area1 + area2 - overlap + eps)


def giou_loss(pred, target, eps: float = 1e-10):
    """Element-wise ``1 - GIoU`` of matching boxes ``[..., 4]`` -> ``[...]`` (no reduction).

    ``GIoU = IoU - (C - U) / C`` with ``C`` the enclosing box area, as GIoULoss upstream.
    """
    px1, py1, px2, py2 = (pred[..., i] for i in range(4))
    gx1, gy1, gx2, gy2 = (target[..., i] for i in range(4))
    w_inter = (paddle.minimum(px2, gx2) - paddle.maximum(px1, gx1)).clip(min=0)
    h_inter = (paddle.minimum(py2, gy2) - paddle.maximum(py1, gy1)).clip(min=0)
    overlap = w_inter * h_inter
    union = (px2 - px1) * (py2 - py1) + (gx2 - gx1) * (gy2 - gy1) - overlap + eps
    iou = overlap / union
    enclose = (paddle.maximum(px2, gx2) - paddle.minimum(px1, gx1)) * \
        (paddle.maximum(py2, gy2) - paddle.minimum(py1, gy1)) + eps
    return 1.0 - (iou - (enclose - union) / enclose)


def distance2bbox(points, distance):
    """Boxes from anchor points ``[..., 2]`` and ltrb distances ``[..., 4]`` (broadcasting) -> xyxy."""
    return paddle.concat([points - distance[..., 0:2], points + distance[..., 2:4]], axis=-1)


def bbox2distance(points, bbox, max_dis: float | None = None, eps: float = 0.01):
    """ltrb distances from points ``[..., 2]`` to xyxy boxes ``[..., 4]``.

    With ``max_dis`` the distances are clipped to ``[0, max_dis - eps]`` so that the DFL target's
    right bin ``floor(d) + 1`` stays inside ``0..max_dis`` (upstream head: ``reg_max - 0.01``).
    """
    dist = paddle.concat([points - bbox[..., 0:2], bbox[..., 2:4] - points], axis=-1)
    if max_dis is not None:
        dist = dist.clip(min=0.0, max=float(max_dis) - eps)
    return dist
