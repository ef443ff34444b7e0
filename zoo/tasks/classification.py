"""Image classification as a task: loss dict for training, summable statistics for evaluation,
and the softmax the export adds (the Task contract: zoo/tasks/base.py).
"""
from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from zoo.metrics import accuracy_from_counts, topk_correct
from zoo.metrics.agreement import class_agreement
from zoo.metrics.bootstrap import bootstrap_mean
from zoo.tasks.base import Task
from zoo.utils import distributed as dist
from zoo.utils.checks import FRACTION

__all__ = ["ClassificationTask", "ClassifierProbs"]


class ClassifierProbs(nn.Layer):
    """Logits -> softmax probabilities, as PaddleClas's ExportModel (``infer_add_softmax`` default)."""

    def __init__(self, net: nn.Layer):
        super().__init__()
        self.net = net

    def forward(self, x):
        return nn.functional.softmax(self.net(x), axis=-1)


class ClassificationTask(Task):
    """Cross-entropy training (optional label smoothing) and top-k evaluation."""

    kind = "classification"
    primary_metric = "top1"
    SETTINGS = {"label_smoothing": FRACTION}

    def __init__(self, label_smoothing: float = 0.0, topk=(1, 5)):
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"model.task.label_smoothing: expected [0, 1), got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)
        self.topk = tuple(int(k) for k in topk)
        self._hits: list[np.ndarray] = []  # per-image top-1 hits of the current evaluation

    def losses(self, model, batch) -> dict[str, paddle.Tensor]:
        """Forward and loss; the loss is computed in fp32 whatever the autocast state.

        A Mixup batch (``mix_label``, ``mix_lam``: zoo/data/classification/mixup.py) is trained on
        the soft target ``lam * onehot(label) + (1 - lam) * onehot(mix_label)``, label-smoothed
        like a hard one, as PaddleClas's ``CELoss`` treats a mixed target.
        """
        logits = model(batch["image"])
        labels = batch["label"].reshape([-1])
        with paddle.amp.auto_cast(enable=False):  # softmax + log in fp32 even under O2
            logits = logits.astype("float32")
            if "mix_lam" in batch:
                loss = self.mixed_loss(logits, labels, batch["mix_label"].reshape([-1]), batch["mix_lam"])
            else:
                loss = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
        return {"loss": loss}

    def mixed_loss(self, logits, labels, partners, lam) -> paddle.Tensor:
        """Mean cross-entropy of fp32 ``logits`` against the smoothed Mixup target of each image."""
        k = logits.shape[-1]
        lam = lam.astype("float32").reshape([-1, 1])
        target = lam * F.one_hot(labels, k) + (1.0 - lam) * F.one_hot(partners, k)
        target = (1.0 - self.label_smoothing) * target + self.label_smoothing / k
        return -(target * F.log_softmax(logits, axis=-1)).sum(axis=-1).mean()

    def begin_eval(self, val_set) -> None:
        """Start collecting per-image top-1 hits (for the bootstrap CI over images)."""
        self._hits = []

    def predict(self, model, batch) -> np.ndarray:
        """The model's class scores ``[N, C]`` as float32: logits of the network, probabilities of its
        deploy module (the ranking, and so top-k, is the same)."""
        return model(batch["image"]).astype("float32").numpy()

    @paddle.no_grad()
    def eval_stats(self, model, batch, predictions: list | None = None) -> dict[str, float]:
        """Top-k hit counts for one batch (per-image top-1 hits are kept too)."""
        logits = self.predict(model, batch)
        if predictions is not None:
            predictions.extend(logits)  # one [C] row per image
        labels = batch["label"].numpy().reshape(-1)
        # argmax takes the lowest index among ties, as topk_correct's stable sort does
        self._hits.append((logits.argmax(axis=1) == labels).astype(np.int8))
        return topk_correct(logits, labels, self.topk)

    def compute_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """Pooled counts (over batches and ranks) to accuracies; per-image hits gathered over ranks."""
        if dist.world_size() > 1:
            self._hits = [h for part in dist.all_gather_objects(self._hits) for h in part]
        return {**accuracy_from_counts(sums, self.topk), "num_samples": int(sums["count"])}

    def bootstrap_primary(self, n_resamples: int) -> dict:
        """Bootstrap CI over validation images of top-1, from the last evaluation's per-image hits."""
        return bootstrap_mean(np.concatenate(self._hits), n_resamples)

    def resampled_primary(self, draws: np.ndarray) -> np.ndarray:
        """Top-1 of the last evaluation's images, each taken ``draws[r, i]`` times, per row r."""
        hits = np.concatenate(self._hits).astype(np.float64)
        return np.asarray(draws, dtype=np.float64) @ hits / hits.size

    def n_evaluated_images(self) -> int:
        return int(sum(h.size for h in self._hits))

    # ---- export ---------------------------------------------------------------------------------
    def deploy_module(self, net: nn.Layer) -> nn.Layer:
        """The network with a softmax: PaddleClas's clients read probabilities."""
        return ClassifierProbs(net)

    def agreement(self, fp32_predictions, low_predictions, min_score: float = 0.0) -> dict:
        """Share of images with the same top-1 class, largest probability difference (every image
        counts: a classifier's client shows its top-k whatever the score)."""
        return class_agreement(fp32_predictions, low_predictions)

    def metric_unit(self, n_images: int, sums: dict[str, float], val_set) -> tuple[float, str]:
        """One image's top-1 class: ``100 / n`` pp."""
        return 100.0 / max(n_images, 1), "one image's top-1 class"
