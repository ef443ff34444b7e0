"""Label assigners of PP-YOLOE: ATSS (static, early epochs) and task-aligned (TAL, later epochs).

Both follow PaddleDetection ppdet/modeling/assigners/atss_assigner.py, task_aligned_assigner.py and
utils.py, vectorised over the batch with no host synchronisation. Both return
``(assigned_labels [N, A] int64 (num_classes = background), assigned_bboxes [N, A, 4],
assigned_scores [N, A, C])``. Inputs: ``gt_labels [N, M, 1]``, ``gt_bboxes [N, M, 4]`` xyxy pixels,
``pad_gt_mask [N, M, 1]`` (1 real, 0 padding). Call them with float32 tensors.

One deliberate difference from upstream: an anchor claimed by several GTs goes to the claimant with
the highest IoU. Upstream takes the arg-max over *all* GTs of the image, which can hand the anchor to
a GT that did not select it (and whose box may not even contain the anchor centre); upstream's own
small-object variant (``sm_use``) restricts it to claimants, as here.
"""
from __future__ import annotations

import paddle
import paddle.nn.functional as F

from zoo.losses.bbox_utils import batch_iou, bbox_center


def points_inside_boxes(points, boxes, eps: float = 1e-9):
    """``[N, M, A]`` float mask: point ``a`` ([A, 2], xy) strictly inside box ``m`` ([N, M, 4])."""
    x = points[:, 0].reshape([1, 1, -1])
    y = points[:, 1].reshape([1, 1, -1])
    deltas = paddle.stack([x - boxes[..., 0:1], y - boxes[..., 1:2],
                           boxes[..., 2:3] - x, boxes[..., 3:4] - y], axis=-1)
    return (deltas.min(axis=-1) > eps).astype(boxes.dtype)


def topk_mask(metrics, k: int, largest: bool = True):
    """``[..., A]`` float mask of the ``k`` largest (or smallest) entries along the last axis."""
    _, idx = paddle.topk(metrics, k, axis=-1, largest=largest)
    ones = paddle.ones(idx.shape, dtype=metrics.dtype)
    return paddle.put_along_axis(paddle.zeros_like(metrics), idx, ones, axis=-1), idx


def _resolve_multiple_gts(mask_positive, ious):
    """Anchors claimed by more than one GT keep only the claimant with the highest IoU."""
    num_gts = mask_positive.shape[-2]
    claimed_twice = mask_positive.sum(axis=-2, keepdim=True) > 1  # [N, 1, A]
    claimant_ious = paddle.where(mask_positive > 0, ious, paddle.full_like(ious, -1.0))
    best = claimant_ious.argmax(axis=-2)  # [N, A]
    is_best = F.one_hot(best, num_gts).transpose([0, 2, 1]).astype(mask_positive.dtype)
    return paddle.where(claimed_twice.expand(mask_positive.shape), is_best, mask_positive)


def _gather_targets(mask_positive, gt_labels, gt_bboxes, num_classes: int):
    """Labels, boxes and one-hot scores of the GT each anchor is assigned to (background if none)."""
    n, _, a = mask_positive.shape
    gt_index = mask_positive.argmax(axis=-2)  # [N, A]; 0 for unassigned anchors, masked below
    labels = paddle.take_along_axis(gt_labels.squeeze(-1).astype("int64"), gt_index, axis=1)
    is_positive = mask_positive.sum(axis=-2) > 0
    labels = paddle.where(is_positive, labels, paddle.full_like(labels, num_classes))
    bboxes = paddle.take_along_axis(gt_bboxes, gt_index.unsqueeze(-1).tile([1, 1, 4]), axis=1)
    scores = F.one_hot(labels, num_classes + 1)[..., :num_classes].astype(gt_bboxes.dtype)
    return labels.reshape([n, a]), bboxes, scores


def _all_background(n: int, a: int, num_classes: int, dtype):
    return (paddle.full([n, a], num_classes, dtype="int64"), paddle.zeros([n, a, 4], dtype=dtype),
            paddle.zeros([n, a, num_classes], dtype=dtype))


class ATSSAssigner:
    """Adaptive Training Sample Selection (Zhang et al. 2020) as PaddleDetection's ATSSAssigner.

    Per GT: on each level take the ``topk`` anchors whose centres are closest to the GT centre;
    the IoU threshold is mean + std (unbiased) of those candidates' IoUs; a candidate is positive if
    its IoU exceeds the threshold and its centre lies inside the GT.
    """

    def __init__(self, topk: int = 9, num_classes: int = 80, eps: float = 1e-9):
        self.topk = int(topk)
        self.num_classes = int(num_classes)
        self.eps = eps

    def __call__(self, anchor_bboxes, num_anchors_list, gt_labels, gt_bboxes, pad_gt_mask,
                 pred_bboxes=None):
        """Assign ``anchor_bboxes [A, 4]`` (levels in order, ``num_anchors_list`` per level).

        With ``pred_bboxes [N, A, 4]`` (pixels) the positive scores are the IoU of the prediction
        with its GT (as upstream's PP-YOLOE), otherwise 1.
        """
        with paddle.no_grad():
            return self._assign(anchor_bboxes, list(num_anchors_list), gt_labels, gt_bboxes,
                                pad_gt_mask, pred_bboxes)

    def _assign(self, anchor_bboxes, num_anchors_list, gt_labels, gt_bboxes, pad_gt_mask, pred_bboxes):
        num_anchors = anchor_bboxes.shape[0]
        n, m, _ = gt_bboxes.shape
        if sum(num_anchors_list) != num_anchors:
            raise ValueError(f"ATSSAssigner: num_anchors_list {num_anchors_list} sums to "
                             f"{sum(num_anchors_list)}, but anchor_bboxes has {num_anchors} rows")
        if m == 0:
            return _all_background(n, num_anchors, self.num_classes, gt_bboxes.dtype)

        ious = batch_iou(gt_bboxes, anchor_bboxes.unsqueeze(0))  # [N, M, A]
        anchor_centers = bbox_center(anchor_bboxes)
        gt_centers = bbox_center(gt_bboxes)  # [N, M, 2]
        distances = (gt_centers.unsqueeze(2) - anchor_centers.reshape([1, 1, -1, 2])).norm(p=2, axis=-1)

        in_topk_list, candidate_ious = [], []
        start = 0
        for count in num_anchors_list:
            level_distances = distances[:, :, start:start + count]
            level_mask, idx = topk_mask(level_distances, min(self.topk, count), largest=False)
            in_topk_list.append(level_mask)
            candidate_ious.append(paddle.take_along_axis(ious[:, :, start:start + count], idx, axis=-1))
            start += count
        is_in_topk = paddle.concat(in_topk_list, axis=-1)  # padding rows are masked out below
        candidate_ious = paddle.concat(candidate_ious, axis=-1)  # [N, M, K]
        # mean + unbiased std, written out: paddle's std() logs a dtype-promotion warning per call
        num_candidates = candidate_ious.shape[-1]
        mean = candidate_ious.mean(axis=-1, keepdim=True)
        variance = (candidate_ious - mean).square().sum(axis=-1, keepdim=True) / max(num_candidates - 1, 1)
        threshold = mean + variance.sqrt()
        is_in_topk = paddle.where(ious * is_in_topk > threshold, is_in_topk, paddle.zeros_like(is_in_topk))

        is_in_gts = points_inside_boxes(anchor_centers, gt_bboxes, self.eps)
        mask_positive = _resolve_multiple_gts(is_in_topk * is_in_gts * pad_gt_mask, ious)
        labels, bboxes, scores = _gather_targets(mask_positive, gt_labels, gt_bboxes, self.num_classes)
        if pred_bboxes is not None:
            pred_ious = (batch_iou(gt_bboxes, pred_bboxes) * mask_positive).max(axis=-2).unsqueeze(-1)
            scores = scores * pred_ious
        return labels, bboxes, scores


class TaskAlignedAssigner:
    """Task-aligned assignment (TOOD, Feng et al. 2021) as PaddleDetection's TaskAlignedAssigner.

    Alignment metric ``t = s^alpha * iou^beta`` (``s`` the predicted probability of the GT class,
    ``iou`` of the predicted box with the GT); per GT the ``topk`` largest ``t`` among anchors whose
    centre lies inside the GT are positive. A positive's score is ``t / max_t(GT) * max_iou(GT)``
    (maxima over that GT's positives), so each GT's best positive scores its best IoU.
    """

    def __init__(self, topk: int = 13, alpha: float = 1.0, beta: float = 6.0, eps: float = 1e-9):
        self.topk = int(topk)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.eps = eps

    def __call__(self, pred_scores, pred_bboxes, anchor_points, num_anchors_list, gt_labels, gt_bboxes,
                 pad_gt_mask):
        """``pred_scores [N, A, C]`` probabilities, ``pred_bboxes [N, A, 4]`` and ``anchor_points [A, 2]``
        in pixels. ``num_anchors_list`` is accepted for interface parity and not used."""
        with paddle.no_grad():
            return self._assign(pred_scores, pred_bboxes, anchor_points, gt_labels, gt_bboxes, pad_gt_mask)

    def _assign(self, pred_scores, pred_bboxes, anchor_points, gt_labels, gt_bboxes, pad_gt_mask):
        n, num_anchors, num_classes = pred_scores.shape
        m = gt_bboxes.shape[1]
        if m == 0:
            return _all_background(n, num_anchors, num_classes, gt_bboxes.dtype)

        ious = batch_iou(gt_bboxes, pred_bboxes)  # [N, M, A]
        labels = gt_labels.astype("int64").clip(0, num_classes - 1)  # padding rows may hold anything
        class_scores = paddle.take_along_axis(pred_scores.transpose([0, 2, 1]),
                                              labels.tile([1, 1, num_anchors]), axis=1)  # [N, M, A]
        metrics = class_scores.pow(self.alpha) * ious.pow(self.beta)

        is_in_gts = points_inside_boxes(anchor_points, gt_bboxes, self.eps)
        is_in_topk, _ = topk_mask(metrics * is_in_gts, min(self.topk, num_anchors), largest=True)
        mask_positive = _resolve_multiple_gts(is_in_topk * is_in_gts * pad_gt_mask, ious)
        assigned_labels, bboxes, scores = _gather_targets(mask_positive, gt_labels, gt_bboxes, num_classes)

        metrics = metrics * mask_positive
        max_metrics = metrics.max(axis=-1, keepdim=True)
        max_ious = (ious * mask_positive).max(axis=-1, keepdim=True)
        normalized = (metrics / (max_metrics + self.eps) * max_ious).max(axis=-2).unsqueeze(-1)
        return assigned_labels, bboxes, scores * normalized
