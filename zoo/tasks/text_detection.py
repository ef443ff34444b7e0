"""DB text detection as a task: DB loss for training, ICDAR IoU counts for evaluation.

Train batches hold ``image`` and the four DB label maps; eval batches hold ``image`` (resized; with
a limit-side resize padded to the batch's largest, each image's own size in ``valid_hw`` [N, 2]),
``shape`` (src_h, src_w, ratio_h, ratio_w), ``polys`` [N, P, 4, 2] in source pixels (zero-padded),
``ignore`` [N, P] and ``num_polys`` [N]. The model returns ``{"maps": [N, 3, H, W]}`` in train
mode (PFHeadLocal adds ``cbn_maps``, which the loss reads) and ``{"maps": [N, 1, H, W]}`` in eval
mode; the engine switches the mode. The export saves the bare shrink map (:class:`DBProbabilityMap`).
The Task contract: zoo/tasks/base.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import cv2
import numpy as np
import paddle
from paddle import nn

from zoo.losses import DBLoss
from zoo.metrics.agreement import polygon_agreement
from zoo.metrics.bootstrap import bootstrap_hmean, hmean_from_sums
from zoo.metrics.det_iou import DetectionIoUEvaluator, sum_counts
from zoo.postprocess import DBPostProcess, draw_detections
from zoo.postprocess.draw import DET_COLOR, GT_COLOR, IGNORED_COLOR, with_legend
from zoo.tasks.base import Task
from zoo.tasks.common import Denormalize, as_numpy, predict_in_eval_mode, task_kwargs
from zoo.utils import distributed as dist
from zoo.utils.checks import COUNT, NON_NEGATIVE, POSITIVE, PROBABILITY

__all__ = ["DBProbabilityMap", "DBTask"]


class DBProbabilityMap(nn.Layer):
    """A DB net in eval mode returning the bare ``[N, 1, H, W]`` shrink map (PaddleX reads output 0)."""

    def __init__(self, net: nn.Layer):
        super().__init__()
        self.net = net

    def forward(self, x):
        out = self.net(x)
        return out["maps"] if isinstance(out, Mapping) else out


class DBTask(Task):
    """Differentiable Binarization training and ICDAR-IoU evaluation.

    Args:
        loss: keyword arguments of ``zoo.losses.DBLoss`` (balance_loss, main_loss_type, alpha, ...).
        postprocess: keyword arguments of ``zoo.postprocess.DBPostProcess`` (thresh, box_thresh, ...).
        iou_constraint, area_precision_constraint: ``DetectionIoUEvaluator`` thresholds.
        mean, std: the normalisation the data applied (PaddleOCR's NormalizeImage defaults, on
            pixel/255); only ``draw`` uses them, to recover a viewable image.
        rgb: the batch images are RGB (they are converted to BGR for drawing); PaddleOCR decodes BGR.
    """

    kind = "text_detection"
    primary_metric = "hmean"
    SETTINGS = {"loss.alpha": NON_NEGATIVE, "loss.beta": NON_NEGATIVE, "loss.ohem_ratio": POSITIVE,
                "postprocess.thresh": PROBABILITY, "postprocess.box_thresh": PROBABILITY,
                "postprocess.unclip_ratio": POSITIVE, "postprocess.max_candidates": COUNT}

    def __init__(self, loss: dict | None = None, postprocess: dict | None = None,
                 iou_constraint: float = 0.5, area_precision_constraint: float = 0.5,
                 mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), rgb: bool = False):
        try:
            self.loss = DBLoss(**task_kwargs(loss, "loss"))
            self.postprocess = DBPostProcess(**task_kwargs(postprocess, "postprocess"))
        except TypeError as e:  # unknown keyword: name the config key it came from
            raise ValueError(f"model.task: {e}") from e
        self.evaluator = DetectionIoUEvaluator(iou_constraint, area_precision_constraint)
        self.viewable = Denormalize(mean, std, rgb)
        self._counts: list[tuple[float, float, float]] = []  # per image: gt_care, det_care, matched

    @staticmethod
    def _maps(out) -> paddle.Tensor:
        return out["maps"] if isinstance(out, Mapping) else out

    def losses(self, model, batch) -> dict[str, paddle.Tensor]:
        """Train-mode forward and the DB loss dict (float32 whatever the autocast state). The whole
        output goes to the loss: PFHeadLocal's ``cbn_maps`` adds a term (zoo/losses/db_loss.py)."""
        out = model(batch["image"])
        if isinstance(out, Mapping) and "cbn_maps" in out:
            return self.loss(dict(out), batch)
        return self.loss(self._maps(out), batch)  # the bare maps, as before PFHeadLocal (trainer.compile traces this)

    def predict(self, model, batch) -> list[tuple]:
        """Eval-mode forward and post-processing: ``(boxes, scores)`` per image, source pixels. A batch
        padded to one size (``valid_hw``: a limit-side resize, zoo/data/text_det) has each map cropped
        to its image's own size first, so the post-processing scales boxes as for that image alone."""
        maps = self._maps(model(batch["image"])).astype("float32").numpy()
        shapes = as_numpy(batch["shape"])
        valid = batch.get("valid_hw") if isinstance(batch, Mapping) else None
        if valid is None:
            return self.postprocess(maps, shapes)
        return [self.postprocess(m[None, :, :h, :w], s[None])[0]
                for m, s, (h, w) in zip(maps, shapes, as_numpy(valid).astype(np.int64))]

    @staticmethod
    def _ground_truth(batch):
        """Per image: (polygons [P_i, 4, 2], ignore flags [P_i]) with the zero padding removed."""
        polys, ignore = as_numpy(batch["polys"]), as_numpy(batch["ignore"])
        counts = as_numpy(batch["num_polys"]).reshape(-1).astype(np.int64)
        return [(polys[i, :n], ignore[i, :n].astype(bool)) for i, n in enumerate(counts)]

    @paddle.no_grad()
    def eval_stats(self, model, batch, predictions: list | None = None) -> dict[str, float]:
        """Summed ``gt_care``, ``det_care``, ``matched`` and ``num_images`` for one batch."""
        predicted = self.predict(model, batch)
        if predictions is not None:
            predictions.extend(predicted)
        gts = self._ground_truth(batch)
        per_image = [self.evaluator.evaluate_image(gt, ign, boxes)
                     for (gt, ign), (boxes, _) in zip(gts, predicted)]
        self._counts.extend((c["gt_care"], c["det_care"], c["matched"]) for c in per_image)
        return {**sum_counts(per_image), "num_images": float(len(gts))}

    def begin_eval(self, val_set) -> None:
        """Start collecting per-image counts (for the bootstrap CI over images)."""
        self._counts = []

    def compute_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Pooled counts (over batches and ranks) to precision, recall, hmean."""
        if sums.get("num_images", 0.0) <= 0:
            raise ValueError("no images were evaluated (empty validation split?)")
        if dist.world_size() > 1:
            self._counts = [c for part in dist.all_gather_objects(self._counts) for c in part]
        return {**self.evaluator.combine(sums), "num_images": int(sums["num_images"])}

    def bootstrap_primary(self, n_resamples: int) -> dict:
        """Bootstrap CI over validation images of hmean: per-image (gt_care, det_care, matched)
        rows are resampled and hmean recomputed from their sums."""
        return bootstrap_hmean(self._counts, n_resamples)

    def resampled_primary(self, draws: np.ndarray) -> np.ndarray:
        """hmean of the last evaluation's images, each taken ``draws[r, i]`` times, per row r."""
        sums = np.asarray(draws, dtype=np.float64) @ np.asarray(self._counts, dtype=np.float64).reshape(-1, 3)
        return hmean_from_sums(sums[:, 0], sums[:, 1], sums[:, 2])

    def n_evaluated_images(self) -> int:
        return len(self._counts)

    @paddle.no_grad()
    def draw(self, model, batch, out_dir, prefix: str = "det", caption: str = "") -> list[Path]:
        """Write ``<out_dir>/<prefix>_<i>.png`` per image: GT green, ignored GT red, detections blue,
        with a legend strip titled ``caption`` (the precision the forward ran in) when given.

        Drawn on the resized network input, so boxes (source pixels) are scaled by (ratio_w, ratio_h).
        The model is put in eval mode for the forward and restored afterwards.
        """
        predictions = predict_in_eval_mode(self, model, batch)
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        images, shapes = as_numpy(batch["image"]), as_numpy(batch["shape"]).astype(np.float64)
        paths = []
        for i, ((gt, ign), (boxes, _)) in enumerate(zip(self._ground_truth(batch), predictions)):
            scale = np.array([shapes[i, 3], shapes[i, 2]])  # (ratio_w, ratio_h) for (x, y)
            dets = [np.asarray(b, np.float64).reshape(-1, 2) * scale for b in boxes]
            gts = [np.asarray(g, np.float64).reshape(-1, 2) * scale for g in gt]
            path = out_dir / f"{prefix}_{i}.png"
            image = draw_detections(self.viewable(images[i]), dets, gts, ign)
            if caption:
                image = with_legend(image, caption, [(DET_COLOR, "detection"), (GT_COLOR, "ground truth"),
                                                     (IGNORED_COLOR, "ignored (###)")])
            cv2.imwrite(str(path), image)
            paths.append(path)
        return paths

    # ---- export ---------------------------------------------------------------------------------
    def deploy_module(self, net: nn.Layer) -> nn.Layer:
        """The bare shrink map: PaddleOCR's and PaddleX's clients run DBPostProcess themselves."""
        return DBProbabilityMap(net)

    def agreement(self, fp32_predictions, low_predictions, min_score: float = 0.0) -> dict:
        """Share of FP32 text boxes matched at IoU >= 0.9, largest box-score difference. Every box
        counts: the post-processing's ``box_thresh`` has already dropped what a client would not show."""
        return polygon_agreement(fp32_predictions, low_predictions)

    def metric_unit(self, n_images: int, sums: dict[str, float], val_set) -> tuple[float, str]:
        """One text box: ``200 / (G + D)`` pp, G the ground-truth and D the detected boxes (``sums``'
        gt_care and det_care): hmean = 2 M / (G + D), and one box matched or not moves M by one."""
        g, d = float(sums.get("gt_care", 0)), float(sums.get("det_care", 0))
        if g + d <= 0:
            return float("inf"), "no text boxes"
        return 200.0 / (g + d), f"one text box ({g:.0f} in the ground truth, {d:.0f} detected in FP32)"
