"""Differentiable Binarization (DB) loss, always computed in float32.

Follows PaddleOCR's ppocr/losses/det_db_loss.py and ppocr/losses/det_basic_loss.py:

    loss = alpha * Balance(shrink) + beta * MaskL1(threshold) + Dice(binary)

The shrink (probability) map gets the balanced loss with OHEM: every positive pixel and the
hardest ``ohem_ratio`` x (#positives) negative pixels inside the training mask. The loss sums over
many pixels and takes logs/ratios of probabilities, which is exactly what fp16 handles badly, so
the maps are cast to float32 and the loss runs with autocast disabled whatever the caller's state.
"""
from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

MAIN_LOSS_TYPES = ("DiceLoss", "BCELoss", "MaskL1Loss", "Euclidean")


class DiceLoss(nn.Layer):
    """``1 - 2 * sum(p*g*m) / (sum(p*m) + sum(g*m) + eps)`` over the whole batch (a scalar)."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, pred, gt, mask, weights=None):
        if pred.shape != gt.shape or pred.shape != mask.shape:
            raise ValueError(f"DiceLoss: shapes differ: pred {pred.shape}, gt {gt.shape}, mask {mask.shape}")
        if weights is not None:
            mask = weights * mask
        intersection = paddle.sum(pred * gt * mask)
        union = paddle.sum(pred * mask) + paddle.sum(gt * mask) + self.eps
        return 1 - 2.0 * intersection / union


class MaskL1Loss(nn.Layer):
    """Mean absolute error over the pixels where ``mask`` is set (a scalar)."""

    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, pred, gt, mask):
        return (paddle.abs(pred - gt) * mask).sum() / (mask.sum() + self.eps)


class _PixelBCE(nn.Layer):
    """Per-pixel binary cross-entropy on probabilities (upstream ``BCELoss(reduction="none")``)."""

    def forward(self, pred, gt, mask=None):
        return F.binary_cross_entropy(pred, gt, reduction="none")


class _PixelSquaredError(nn.Layer):
    """Per-pixel squared error. Upstream's "Euclidean" wraps ``nn.MSELoss``, which cannot take the
    ``mask`` argument BalanceLoss passes (it raises); a per-pixel square is what OHEM can rank."""

    def forward(self, pred, gt, mask=None):
        return paddle.square(pred - gt)


class BalanceLoss(nn.Layer):
    """Positive/negative balanced loss with online hard negative mining (OHEM).

    ``positive = gt * mask``, ``negative = (1 - gt) * mask``; with ``k = min(#negative,
    floor(#positive) * negative_ratio)`` (floored, as upstream's ``int()``) the result is
    ``(sum(positive * L) + sum(top-k of negative * L)) / (#positive + k + eps)``.

    With a scalar main loss (DiceLoss, MaskL1Loss) this reduces to that scalar times
    ``(P + k) / (P + k + eps)``, as upstream. The top-k is taken from a descending sort with a
    tensor-valued cut-off, so no host synchronisation is needed for ``k``.

    Args:
        balance_loss: when False, the main loss is returned unbalanced; per-pixel losses are then
            averaged over ``mask`` (upstream would return the raw map, which cannot be backpropagated
            as a loss).
        main_loss_type: one of ``MAIN_LOSS_TYPES``.
        negative_ratio: negatives kept per positive.
    """

    def __init__(self, balance_loss: bool = True, main_loss_type: str = "DiceLoss",
                 negative_ratio: float = 3, eps: float = 1e-6):
        super().__init__()
        if main_loss_type not in MAIN_LOSS_TYPES:
            raise ValueError(f"main_loss_type must be one of {list(MAIN_LOSS_TYPES)}, got {main_loss_type!r}")
        self.balance_loss = bool(balance_loss)
        self.main_loss_type = main_loss_type
        self.negative_ratio = float(negative_ratio)
        self.eps = eps
        self.loss = {"DiceLoss": lambda: DiceLoss(eps), "MaskL1Loss": lambda: MaskL1Loss(eps),
                     "BCELoss": _PixelBCE, "Euclidean": _PixelSquaredError}[main_loss_type]()

    def forward(self, pred, gt, mask):
        loss = self.loss(pred, gt, mask=mask)
        if not self.balance_loss:
            if loss.ndim == 0:
                return loss
            return (loss * mask).sum() / (mask.sum() + self.eps)
        positive = gt * mask
        negative = (1 - gt) * mask
        positive_count = paddle.floor(positive.sum())
        negative_count = paddle.floor(paddle.minimum(negative.sum(), positive_count * self.negative_ratio))
        positive_loss = (positive * loss).sum()
        negative_loss = paddle.sort((negative * loss).reshape([-1]), descending=True)
        # int64 positions: a float32 arange stops counting exactly past 2**24 pixels
        keep = paddle.arange(negative_loss.shape[0], dtype="int64") < negative_count.astype("int64")
        negative_loss = (negative_loss * keep.astype("float32")).sum()
        return (positive_loss + negative_loss) / (positive_count + negative_count + self.eps)


class DBLoss(nn.Layer):
    """DB loss on the train-mode maps ``[N, 3, H, W]`` = (shrink, threshold, binary).

    Args mirror PaddleOCR's ``DBLoss`` (configs/det/det_mv3_db.yml uses these defaults):
        balance_loss, main_loss_type: the shrink-map loss (see ``BalanceLoss``).
        alpha: weight of the shrink-map loss.
        beta: weight of the threshold-map L1 loss.
        ohem_ratio: negatives per positive kept by OHEM.
        eps: added to every denominator.

    ``forward(predicts, batch)`` takes the model output (``{"maps": ...}`` or the maps tensor)
    and a batch dict with ``shrink_map``, ``shrink_mask``, ``threshold_map``, ``threshold_mask``
    (``[N, H, W]``); it returns float32 ``loss``, ``loss_shrink_maps`` (already times alpha),
    ``loss_threshold_maps`` (times beta) and ``loss_binary_maps``. An output that also carries
    ``cbn_maps`` ([N, 1, H, W], PFHeadLocal's binary map) adds ``loss_cbn``, the balanced shrink-map
    loss of that map (unweighted), to ``loss``, as upstream's DBLoss does for PFHeadLocal.
    """

    def __init__(self, balance_loss: bool = True, main_loss_type: str = "DiceLoss", alpha: float = 5,
                 beta: float = 10, ohem_ratio: float = 3, eps: float = 1e-6):
        super().__init__()
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.dice_loss = DiceLoss(eps=eps)
        self.l1_loss = MaskL1Loss(eps=eps)
        self.bce_loss = BalanceLoss(balance_loss=balance_loss, main_loss_type=main_loss_type,
                                    negative_ratio=ohem_ratio, eps=eps)

    def forward(self, predicts, batch) -> dict[str, paddle.Tensor]:
        maps = predicts["maps"] if isinstance(predicts, dict) else predicts
        cbn = predicts.get("cbn_maps") if isinstance(predicts, dict) else None
        if maps.ndim != 4 or maps.shape[1] < 3:
            raise ValueError(f"DBLoss: expected train-mode maps [N, 3, H, W], got {list(maps.shape)}")
        with paddle.amp.auto_cast(enable=False):
            maps = maps.astype("float32")
            shrink_map, shrink_mask, threshold_map, threshold_mask = (
                batch[k].astype("float32")
                for k in ("shrink_map", "shrink_mask", "threshold_map", "threshold_mask"))
            loss_shrink = self.alpha * self.bce_loss(maps[:, 0], shrink_map, shrink_mask)
            loss_threshold = self.beta * self.l1_loss(maps[:, 1], threshold_map, threshold_mask)
            loss_binary = self.dice_loss(maps[:, 2], shrink_map, shrink_mask)
            total = loss_shrink + loss_threshold + loss_binary
            extra = {}
            if cbn is not None:
                extra["loss_cbn"] = self.bce_loss(cbn.astype("float32")[:, 0], shrink_map, shrink_mask)
                total = total + extra["loss_cbn"]
        return {"loss": total, "loss_shrink_maps": loss_shrink,
                "loss_threshold_maps": loss_threshold, "loss_binary_maps": loss_binary, **extra}
