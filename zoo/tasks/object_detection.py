"""PP-YOLOE object detection as a task: VFL + GIoU + DFL for training, COCO mAP for evaluation.

Train batches hold ``image`` [N, 3, S, S], ``gt_bbox`` [N, M, 4] (xyxy, input pixels), ``gt_class``
[N, M, 1], ``pad_gt_mask`` [N, M, 1] and ``epoch`` [N] (the data epoch of each sample, which picks the
assigner: ATSS before ``static_assigner_epoch``, task-aligned after, as PaddleDetection). Eval batches
hold ``image`` (resized), ``im_id``, ``scale_factor`` (scale_y, scale_x) and the padded ground truth
in source pixels. The model returns raw logits in train mode and decoded boxes + sigmoid scores in
eval mode (zoo/models/ppyoloe.py); NMS runs here, on NumPy arrays.

COCO mAP is not a sum over batches: ``begin_eval`` starts a fresh :class:`COCOMetric` on the
validation set's ground truth, ``eval_stats`` adds each image's detections to it, and
``compute_metrics`` gathers the detections of every rank before pycocotools evaluates them.

The export saves :class:`PPYOLOEDeploy`, PaddleDetection's deploy graph with NMS inside
(zoo/export/detection.py writes it). The Task contract: zoo/tasks/base.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import cv2
import numpy as np
import paddle
from paddle import nn

from zoo.losses import PPYOLOELoss
from zoo.metrics.agreement import box_agreement
from zoo.metrics.coco_eval import COCOMetric
from zoo.postprocess import draw_boxes
from zoo.postprocess.draw import GT_COLOR, with_legend
from zoo.postprocess.nms import multiclass_nms
from zoo.tasks.base import Task
from zoo.tasks.common import Denormalize, as_numpy, predict_in_eval_mode, task_kwargs
from zoo.utils import distributed as dist
from zoo.utils.checks import COUNT, COUNT_OR_ZERO, NON_NEGATIVE, PROBABILITY

__all__ = ["NMS_DEFAULTS", "NMS_KEYS", "PPYOLOEDeploy", "PPYOLOETask", "nms_settings"]

MAX_MAP_RESAMPLES = 200
NMS_KEYS = ("score_threshold", "nms_top_k", "keep_top_k", "nms_threshold")
NMS_DEFAULTS = {"score_threshold": 0.01, "nms_top_k": 1000, "keep_top_k": 100, "nms_threshold": 0.7}


def nms_settings(nms: Mapping | None, error: type[Exception] = ValueError) -> dict:
    """``model.task.nms`` with the defaults of :func:`~zoo.postprocess.nms.multiclass_nms` filled in,
    typed; an unknown key raises ``error`` naming it."""
    nms = dict(nms or {})
    unknown = sorted(set(nms) - set(NMS_KEYS))
    if unknown:
        raise error(f"model.task.nms: unknown keys {unknown}; known: {list(NMS_KEYS)}")
    out = {**NMS_DEFAULTS, **nms}
    return {"score_threshold": float(out["score_threshold"]), "nms_top_k": int(out["nms_top_k"]),
            "keep_top_k": int(out["keep_top_k"]), "nms_threshold": float(out["nms_threshold"])}


class PPYOLOEDeploy(nn.Layer):
    """``forward(image, scale_factor) -> (bbox [K, 6], bbox_num [N])``, PaddleDetection's deploy graph.

    ``net`` is a PP-YOLOE in eval mode (``boxes`` [N, A, 4] in input pixels, ``scores`` [N, C, A]);
    boxes are divided by the scale factor, clipped to the original image (H / scale_y, W / scale_x)
    and go through ``multiclass_nms3`` with ``nms`` (score_threshold, nms_top_k, keep_top_k,
    nms_threshold). The output is grouped by class, as Paddle's op gives it.
    """

    def __init__(self, net: nn.Layer, nms: Mapping | None = None):
        super().__init__()
        self.net = net
        self.nms = nms_settings(nms)

    def forward(self, image, scale_factor):
        out = self.net(image)
        boxes, scores = out["boxes"].astype("float32"), out["scores"].astype("float32")
        scale_y, scale_x = paddle.split(scale_factor, 2, axis=-1)
        boxes = boxes / paddle.concat([scale_x, scale_y, scale_x, scale_y], axis=-1).reshape([-1, 1, 4])
        h = paddle.reciprocal(scale_y) * float(image.shape[2])  # original size = input size / scale
        w = paddle.reciprocal(scale_x) * float(image.shape[3])
        upper = paddle.concat([w, h, w, h], axis=-1).reshape([-1, 1, 4])
        boxes = paddle.minimum(paddle.maximum(boxes, paddle.zeros_like(boxes)), upper)
        n = self.nms
        bbox, _index, bbox_num = paddle._C_ops.multiclass_nms3(
            boxes, scores, None, n["score_threshold"], n["nms_top_k"], n["keep_top_k"], n["nms_threshold"],
            True, 1.0, -1)
        return bbox, bbox_num


class PPYOLOETask(Task):
    """PP-YOLOE training losses and COCO evaluation.

    Args:
        num_classes: number of object classes (must equal the model's and the data's).
        loss: keyword arguments of ``zoo.losses.PPYOLOELoss`` (static_assigner_epoch, loss_weight, ...).
        nms: keyword arguments of ``zoo.postprocess.nms.multiclass_nms`` (score_threshold, nms_top_k,
            keep_top_k, nms_threshold).
        mean, std: the normalisation the data applied (on pixel/255); only ``draw`` uses them.
        rgb: the batch images are RGB (PaddleDetection decodes RGB); converted to BGR for drawing.
    """

    kind = "object_detection"
    primary_metric = "mAP"
    max_resamples = MAX_MAP_RESAMPLES
    SETTINGS = {"loss.loss_weight.class": NON_NEGATIVE, "loss.loss_weight.iou": NON_NEGATIVE,
                "loss.loss_weight.dfl": NON_NEGATIVE, "loss.static_assigner_epoch": COUNT_OR_ZERO,
                "loss.atss_topk": COUNT, "loss.tal_topk": COUNT, "loss.tal_alpha": NON_NEGATIVE,
                "loss.tal_beta": NON_NEGATIVE, "nms.score_threshold": PROBABILITY, "nms.nms_threshold": PROBABILITY}

    def __init__(self, num_classes: int, loss: dict | None = None, nms: dict | None = None,
                 mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), rgb: bool = True):
        try:
            self.loss = PPYOLOELoss(num_classes=int(num_classes), **task_kwargs(loss, "loss"))
        except TypeError as e:  # unknown keyword: name the config key it came from
            raise ValueError(f"model.task.loss: {e}") from e
        self.nms = task_kwargs(nms, "nms")
        bad = set(self.nms) - set(NMS_KEYS)
        if bad:
            raise ValueError(f"model.task.nms: unknown keys {sorted(bad)} (expected {', '.join(NMS_KEYS)})")
        self.num_classes = int(num_classes)
        self.viewable = Denormalize(mean, std, rgb)
        self._metric: COCOMetric | None = None
        self.class_names: list[str] = [str(i) for i in range(self.num_classes)]

    # ---- training -----------------------------------------------------------------------------
    def losses(self, model, batch) -> dict[str, paddle.Tensor]:
        """Train-mode forward and the PP-YOLOE loss dict (float32 whatever the autocast state)."""
        epoch = int(as_numpy(batch["epoch"]).reshape(-1)[0])
        return self.loss(model(batch["image"]), batch, epoch)

    # ---- evaluation ---------------------------------------------------------------------------
    def predict(self, model, batch) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Eval-mode forward, boxes to source pixels, NMS: ``(boxes [K, 4], scores [K], labels [K])``."""
        out = model(batch["image"])
        if not isinstance(out, Mapping) or "boxes" not in out:
            raise RuntimeError("PPYOLOETask.predict: the model must be in eval mode (boxes + scores)")
        boxes = out["boxes"].astype("float32").numpy()
        scores = out["scores"].astype("float32").numpy()
        scale = as_numpy(batch["scale_factor"]).astype(np.float32)  # (scale_y, scale_x) per image
        sizes = as_numpy(batch["orig_size"]).astype(np.float32)     # (h, w) per image
        results = []
        for i in range(boxes.shape[0]):
            sy, sx = scale[i]
            b = boxes[i] / np.array([sx, sy, sx, sy], dtype=np.float32)
            h, w = sizes[i]
            b[:, 0::2] = b[:, 0::2].clip(0, w)
            b[:, 1::2] = b[:, 1::2].clip(0, h)
            results.append(multiclass_nms(b, scores[i], **self.nms))
        return results

    def begin_eval(self, val_set) -> None:
        """A fresh COCO metric on ``val_set``'s ground truth (its ``coco`` and ``label_to_cat_id``)."""
        self._metric = COCOMetric(val_set.coco, val_set.label_to_cat_id)
        self.class_names = list(getattr(val_set, "class_names", self.class_names))

    @paddle.no_grad()
    def eval_stats(self, model, batch, predictions: list | None = None) -> dict[str, float]:
        """Add the batch's detections to the metric; count images (the only additive statistic)."""
        if self._metric is None:
            raise RuntimeError("PPYOLOETask.eval_stats before begin_eval(val_set)")
        predicted = self.predict(model, batch)
        if predictions is not None:
            predictions.extend(predicted)
        im_ids = as_numpy(batch["im_id"]).reshape(-1)
        for im_id, (boxes, scores, labels) in zip(im_ids, predicted):
            self._metric.update(int(im_id), boxes, scores, labels)
        return {"num_images": float(len(predicted))}

    def compute_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Gather every rank's detections and run COCOeval: mAP (AP@[.5:.95]), AP50, AP75, by size."""
        if sums.get("num_images", 0.0) <= 0:
            raise ValueError("no images were evaluated (empty validation split?)")
        if self._metric is None:
            raise RuntimeError("PPYOLOETask.compute_metrics before begin_eval(val_set)")
        if dist.world_size() > 1:
            parts = dist.all_gather_objects((self._metric.results(), self._metric.image_ids()))
            self._metric.reset()
            for results, image_ids in parts:
                self._metric.extend(results, image_ids)
        return {**self._metric.accumulate(), "num_images": int(sums["num_images"])}

    def bootstrap_primary(self, n_resamples: int) -> dict:
        """Bootstrap CI over validation images of mAP; COCOeval's accumulate runs once per resample,
        so at most 200 resamples are drawn (see COCOMetric.bootstrap_map for the cost)."""
        if self._metric is None:
            raise RuntimeError("PPYOLOETask.bootstrap_primary before an evaluation")
        return self._metric.bootstrap_map(min(int(n_resamples), MAX_MAP_RESAMPLES))

    def resampled_primary(self, draws: np.ndarray) -> np.ndarray:
        """mAP of the last evaluation's images, each taken ``draws[r, i]`` times (COCOeval's
        accumulate once per row, about 20 ms each on the embedded split)."""
        if self._metric is None:
            raise RuntimeError("PPYOLOETask.resampled_primary before an evaluation")
        return np.array([self._metric.resampled_map(row) for row in np.asarray(draws)])

    def n_evaluated_images(self) -> int:
        if self._metric is None or self._metric._eval is None:
            raise RuntimeError("PPYOLOETask.n_evaluated_images before an evaluation")
        return len(self._metric._eval._paramsEval.imgIds)

    # ---- drawing ------------------------------------------------------------------------------
    @paddle.no_grad()
    def draw(self, model, batch, out_dir, prefix: str = "det", caption: str = "",
             score_threshold: float = 0.3) -> list[Path]:
        """Write ``<out_dir>/<prefix>_<i>.png`` per image: ground truth green, detections with class
        name and score (those above ``score_threshold``), drawn on the resized network input, with a
        legend strip titled ``caption`` (the precision the forward ran in) when given."""
        predictions = predict_in_eval_mode(self, model, batch)
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        images = as_numpy(batch["image"])
        scale = as_numpy(batch["scale_factor"]).astype(np.float64)
        gt_boxes, gt_labels = as_numpy(batch["gt_bbox"]), as_numpy(batch["gt_class"])
        real = as_numpy(batch["pad_gt_mask"]).reshape(gt_boxes.shape[0], -1) > 0
        paths = []
        for i, (boxes, scores, labels) in enumerate(predictions):
            sy, sx = scale[i]
            to_input = np.array([sx, sy, sx, sy])
            keep = scores >= score_threshold
            image = draw_boxes(self.viewable(images[i]), boxes[keep] * to_input, labels[keep], scores[keep],
                               self.class_names, gt_boxes=gt_boxes[i][real[i]] * to_input,
                               gt_labels=gt_labels[i].reshape(-1)[real[i]])
            if caption:
                image = with_legend(image, caption, [(GT_COLOR, "ground truth"),
                                                     ((128, 128, 128), f"detection: class score >= {score_threshold:g},"
                                                      " one colour per class")])
            path = out_dir / f"{prefix}_{i}.png"
            cv2.imwrite(str(path), image)
            paths.append(path)
        return paths

    # ---- export ---------------------------------------------------------------------------------
    def deploy_module(self, net: nn.Layer) -> nn.Layer:
        """PaddleDetection's deploy graph: (image, scale_factor) in, boxes after NMS out."""
        return PPYOLOEDeploy(net, self.nms)

    def checked_module(self, net: nn.Layer) -> nn.Layer:
        """The network itself: the deploy graph takes ``scale_factor`` too, which the evaluation does
        not feed, and :meth:`predict` runs the same clipping and NMS in NumPy (tests/test_export_ppyoloe.py
        holds the two to the same boxes)."""
        return net

    def agreement(self, fp32_predictions, low_predictions, min_score: float = 0.0) -> dict:
        """Share of FP32 boxes scoring at least ``min_score`` (the client's draw threshold) matched by
        a box of the same class at IoU >= 0.9, largest score difference."""
        return box_agreement(fp32_predictions, low_predictions, min_score)

    def metric_unit(self, n_images: int, sums: dict[str, float], val_set) -> tuple[float, str]:
        """One box of the rarest category: ``100 / (C x G_min)`` pp, C the categories with ground truth
        in ``val_set`` and G_min the boxes of the rarest (COCO averages AP over categories; one box
        moves its category's AP by at most 1 / G_c)."""
        coco = val_set.coco
        ids = [int(i) for i in getattr(val_set, "im_ids", coco.getImgIds())]
        per_cat: dict[int, int] = {}
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=ids, iscrowd=False)):
            per_cat[ann["category_id"]] = per_cat.get(ann["category_id"], 0) + 1
        if not per_cat:
            return float("inf"), "no ground-truth boxes"
        rarest = min(per_cat.values())
        return 100.0 / (len(per_cat) * rarest), (f"one box of the rarest of {len(per_cat)} categories "
                                                 f"({rarest} boxes; {sum(per_cat.values())} in all)")
