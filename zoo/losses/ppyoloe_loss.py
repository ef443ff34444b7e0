"""PP-YOLOE training loss (varifocal classification + GIoU + distribution focal), always in float32.

Follows PaddleDetection ppdet/modeling/heads/ppyoloe_head.py (get_loss, get_loss_from_assign,
_bbox_loss, _df_loss, _varifocal_loss) with configs/ppyoloe/_base_/ppyoloe_crn.yml defaults:
ATSS (topk 9) before ``static_assigner_epoch`` (100), then TAL (topk 13, alpha 1, beta 6);
weights class 1.0 / iou 2.5 / dfl 0.5. Every term is normalised by the sum of the assigned scores,
clipped at >= 1 (averaged over ranks when a process group is running, as upstream).

Differences that keep the numbers the same but make fp16 training safe or the graph static:
- the classification loss takes pre-sigmoid logits (``binary_cross_entropy_with_logits``), which
  equals upstream's BCE on sigmoid scores without its log(0) clamp; the VFL weight
  ``alpha * p^gamma * (1 - label) + q * label`` keeps its gradient, as upstream;
- box terms are masked sums over all anchors instead of ``masked_select`` on the positives, so no
  ``if num_pos > 0`` host synchronisation; with no positives they are exactly 0 (still in the graph);
- the body runs under ``auto_cast(enable=False)`` on float32 copies of the inputs: pixel-box areas
  and the score sum overflow float16 (the reduce_mean/sum overflow of PaddleDetection PR #6787).
"""
from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

from zoo.losses.assigners import ATSSAssigner, TaskAlignedAssigner
from zoo.losses.bbox_utils import bbox2distance, distance2bbox, giou_loss

DEFAULT_LOSS_WEIGHT = {"class": 1.0, "iou": 2.5, "dfl": 0.5}
OUTPUT_KEYS = ("cls_logits", "reg_distri", "anchor_points", "stride_tensor", "anchors", "num_anchors_list")
TARGET_KEYS = ("gt_class", "gt_bbox", "pad_gt_mask")


def varifocal_loss(logits, gt_score, label, alpha: float = 0.75, gamma: float = 2.0):
    """Summed VFL: ``BCE(sigmoid(logits), gt_score) * (alpha * p^gamma * (1 - label) + gt_score * label)``."""
    pred = F.sigmoid(logits)
    weight = alpha * pred.pow(gamma) * (1.0 - label) + gt_score * label
    return (F.binary_cross_entropy_with_logits(logits, gt_score, reduction="none") * weight).sum()


def focal_loss(logits, label, alpha: float = 0.25, gamma: float = 2.0):
    """Summed focal loss with soft labels (upstream ``_focal_loss``); ``alpha <= 0`` disables alpha."""
    weight = (F.sigmoid(logits) - label).abs().pow(gamma)
    if alpha > 0:
        weight = weight * (alpha * label + (1 - alpha) * (1 - label))
    return (F.binary_cross_entropy_with_logits(logits, label, reduction="none") * weight).sum()


def distribution_focal_loss(log_probs, target):
    """DFL per box side: ``-(w_l log p[floor(t)] + w_r log p[floor(t)+1])`` averaged over the 4 sides.

    ``log_probs [..., 4, R+1]`` are log-softmax bins, ``target [..., 4]`` distances in ``[0, R)``;
    ``w_l = floor(t) + 1 - t``, ``w_r = 1 - w_l``. Returns ``[...]``.
    """
    left = target.floor().astype("int64")
    weight_left = (left + 1).astype(target.dtype) - target
    logp_left = paddle.take_along_axis(log_probs, left.unsqueeze(-1), axis=-1).squeeze(-1)
    logp_right = paddle.take_along_axis(log_probs, (left + 1).unsqueeze(-1), axis=-1).squeeze(-1)
    return -(logp_left * weight_left + logp_right * (1.0 - weight_left)).mean(axis=-1)


def _tensor(value, name: str, where: str):
    if isinstance(value, paddle.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return paddle.to_tensor(value)
    raise TypeError(f"PPYOLOELoss: {where}[{name!r}] must be a paddle.Tensor or numpy array, "
                    f"got {type(value).__name__}")


def _check_shape(t, name: str, where: str, expected: list):
    """``expected`` holds ints or None (any size)."""
    ok = len(t.shape) == len(expected) and all(e is None or e == s for e, s in zip(expected, t.shape))
    if not ok:
        shown = [("?" if e is None else e) for e in expected]
        raise ValueError(f"PPYOLOELoss: {where}[{name!r}] has shape {list(t.shape)}, expected {shown}")


class PPYOLOELoss:
    """PP-YOLOE loss. ``__call__(outputs, targets, epoch)`` returns float32 scalars ``loss``, ``loss_cls``,
    ``loss_iou``, ``loss_dfl`` (each unweighted, as upstream; ``loss`` is their weighted sum) and the
    logged-only ``loss_l1`` (detached).

    ``outputs``: ``cls_logits [N, A, C]`` pre-sigmoid, ``reg_distri [N, A, 4*(R+1)]`` ltrb bin logits,
    ``anchor_points [A, 2]`` and ``anchors [A, 4]`` in input pixels, ``stride_tensor [A, 1]``,
    ``num_anchors_list``. ``targets``: ``gt_class [N, M, 1]``, ``gt_bbox [N, M, 4]`` xyxy pixels,
    ``pad_gt_mask [N, M, 1]``.
    """

    def __init__(self, num_classes: int, reg_max: int = 16, static_assigner_epoch: int = 100,
                 loss_weight: dict | None = None, use_varifocal_loss: bool = True, atss_topk: int = 9,
                 tal_topk: int = 13, tal_alpha: float = 1.0, tal_beta: float = 6.0, eps: float = 1e-9):
        self.num_classes = int(num_classes)
        self.reg_max = int(reg_max)
        self.static_assigner_epoch = int(static_assigner_epoch)
        weights = dict(DEFAULT_LOSS_WEIGHT)
        unknown = set(loss_weight or {}) - set(weights)
        if unknown:
            raise ValueError(f"PPYOLOELoss: loss_weight has unknown keys {sorted(unknown)}; "
                             f"expected a subset of {sorted(weights)}")
        weights.update({k: float(v) for k, v in (loss_weight or {}).items()})
        self.loss_weight = weights
        self.use_varifocal_loss = bool(use_varifocal_loss)
        self.static_assigner = ATSSAssigner(topk=atss_topk, num_classes=self.num_classes, eps=eps)
        self.assigner = TaskAlignedAssigner(topk=tal_topk, alpha=tal_alpha, beta=tal_beta, eps=eps)
        self.eps = eps

    def _inputs(self, outputs, targets):
        for key in OUTPUT_KEYS:
            if key not in outputs:
                raise KeyError(f"PPYOLOELoss: outputs lack {key!r}; expected keys {list(OUTPUT_KEYS)}")
        for key in TARGET_KEYS:
            if key not in targets:
                raise KeyError(f"PPYOLOELoss: targets lack {key!r}; expected keys {list(TARGET_KEYS)}")
        o = {k: _tensor(outputs[k], k, "outputs") for k in OUTPUT_KEYS if k != "num_anchors_list"}
        t = {k: _tensor(targets[k], k, "targets") for k in TARGET_KEYS}
        n, a = o["cls_logits"].shape[0], o["cls_logits"].shape[1]
        _check_shape(o["cls_logits"], "cls_logits", "outputs", [n, a, self.num_classes])
        _check_shape(o["reg_distri"], "reg_distri", "outputs", [n, a, 4 * (self.reg_max + 1)])
        _check_shape(o["anchor_points"], "anchor_points", "outputs", [a, 2])
        _check_shape(o["stride_tensor"], "stride_tensor", "outputs", [a, 1])
        _check_shape(o["anchors"], "anchors", "outputs", [a, 4])
        m = t["gt_bbox"].shape[1] if len(t["gt_bbox"].shape) == 3 else None
        _check_shape(t["gt_bbox"], "gt_bbox", "targets", [n, m, 4])
        _check_shape(t["gt_class"], "gt_class", "targets", [n, m, 1])
        _check_shape(t["pad_gt_mask"], "pad_gt_mask", "targets", [n, m, 1])
        num_anchors_list = [int(c) for c in outputs["num_anchors_list"]]
        if sum(num_anchors_list) != a:
            raise ValueError(f"PPYOLOELoss: outputs['num_anchors_list'] {num_anchors_list} sums to "
                             f"{sum(num_anchors_list)}, expected A = {a} anchors")
        o = {k: v.astype("float32") for k, v in o.items()}
        t["gt_bbox"] = t["gt_bbox"].astype("float32")
        t["pad_gt_mask"] = t["pad_gt_mask"].astype("float32")
        t["gt_class"] = t["gt_class"].astype("int64")
        if m:
            real = paddle.where(t["pad_gt_mask"] > 0, t["gt_class"], paddle.zeros_like(t["gt_class"]))
            if int(real.min()) < 0 or int(real.max()) >= self.num_classes:
                labels = real.numpy()[..., 0]
                img, box = np.argwhere((labels < 0) | (labels >= self.num_classes))[0]
                raise ValueError(f"PPYOLOELoss: targets['gt_class'][{img}, {box}] = {labels[img, box]} on a real "
                                 f"box (pad_gt_mask 1); expected a label in 0..{self.num_classes - 1}")
        return o, t, num_anchors_list

    def __call__(self, outputs: dict, targets: dict, epoch: int) -> dict:
        with paddle.amp.auto_cast(enable=False):
            o, t, num_anchors_list = self._inputs(outputs, targets)
            return self._loss(o, t, num_anchors_list, int(epoch))

    def _loss(self, o, t, num_anchors_list, epoch: int) -> dict:
        logits, stride = o["cls_logits"], o["stride_tensor"]
        n, a, _ = logits.shape
        anchor_points_s = o["anchor_points"] / stride
        log_probs = F.log_softmax(o["reg_distri"].reshape([n, a, 4, self.reg_max + 1]), axis=-1)
        bins = paddle.arange(self.reg_max + 1, dtype="float32")
        pred_bboxes = distance2bbox(anchor_points_s, (log_probs.exp() * bins).sum(-1))  # stride units

        if epoch < self.static_assigner_epoch:
            labels, bboxes, scores = self.static_assigner(
                o["anchors"], num_anchors_list, t["gt_class"], t["gt_bbox"], t["pad_gt_mask"],
                pred_bboxes=pred_bboxes.detach() * stride)
            focal_alpha = 0.25
        else:
            labels, bboxes, scores = self.assigner(
                F.sigmoid(logits).detach(), pred_bboxes.detach() * stride, o["anchor_points"],
                num_anchors_list, t["gt_class"], t["gt_bbox"], t["pad_gt_mask"])
            focal_alpha = -1.0
        bboxes = bboxes / stride

        if self.use_varifocal_loss:
            one_hot = F.one_hot(labels, self.num_classes + 1)[..., :self.num_classes].astype("float32")
            loss_cls = varifocal_loss(logits, scores, one_hot)
        else:
            loss_cls = focal_loss(logits, scores, focal_alpha)

        scores_sum = scores.sum()
        if paddle.distributed.is_initialized() and paddle.distributed.get_world_size() > 1:
            paddle.distributed.all_reduce(scores_sum)
            scores_sum = scores_sum / paddle.distributed.get_world_size()
        scores_sum = scores_sum.clip(min=1.0)

        positive = (labels != self.num_classes).astype("float32")  # [N, A]
        box_weight = scores.sum(-1) * positive
        loss_iou = (giou_loss(pred_bboxes, bboxes) * box_weight).sum() / scores_sum
        target_ltrb = bbox2distance(anchor_points_s, bboxes, max_dis=self.reg_max)
        loss_dfl = (distribution_focal_loss(log_probs, target_ltrb) * box_weight).sum() / scores_sum
        loss_l1 = ((pred_bboxes - bboxes).abs().sum(-1) * positive).sum() / (positive.sum() * 4).clip(min=1.0)
        loss_cls = loss_cls / scores_sum

        w = self.loss_weight
        loss = w["class"] * loss_cls + w["iou"] * loss_iou + w["dfl"] * loss_dfl
        return {"loss": loss, "loss_cls": loss_cls, "loss_iou": loss_iou, "loss_dfl": loss_dfl,
                "loss_l1": loss_l1.detach()}
