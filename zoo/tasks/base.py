"""The Task contract: what the engine, the report and the export ask of a model family's task.

A task is the one object that knows a family's batches and outputs. The loop, the evaluation, the
report's statistics and the export's precision check call only the members below, so none of them
asks which family it runs, and a new family is one task module (plus its export row, when it is
exported: ``zoo/export/from_config.py``).

Why an abstract base class and not a ``typing.Protocol``: the contract has members with a sensible
default (``begin_eval`` and ``draw`` do nothing, ``checked_module`` is the deploy module, no
settings rules), which a Protocol cannot give to its implementers; and a task that misses a required
member fails when it is built, with Python's ``TypeError`` naming the member, instead of halfway
through a training run. The engine still calls tasks by duck typing (the test doubles in
tests/test_engine.py need not subclass), so the base class adds no coupling to the loop.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import paddle

from zoo.utils.checks import Bound

__all__ = ["Task"]


class Task(ABC):
    """What every task provides; see each member for who calls it and why.

    Class attributes:
        kind: what the family computes (``text_detection``, ``object_detection``, ``classification``).
            The export's table is keyed by it (zoo/export/from_config.py); nothing else reads it.
        primary_metric: the metric name ``compute_metrics`` returns that decides everything: the best
            checkpoint (engine), the AMP-vs-FP32 comparison (report), the verdict (export).
        SETTINGS: numeric rules of the task's own config arguments, keyed relative to ``model.task``
            (``{"loss.alpha": NON_NEGATIVE}`` checks ``model.task.loss.alpha``). The engine checks
            them with the rest of the config before anything is built (zoo/engine/run.py
            ``check_numbers``), so a new family's keys are checked without touching the engine.
        max_resamples: the most bootstrap resamples worth drawing, None for no cap. A resample of
            COCO mAP runs COCOeval's accumulate (about 20 ms), so PP-YOLOE caps at 200; its own
            bootstrap and the export's paired interval respect it.
    """

    kind: ClassVar[str]
    primary_metric: ClassVar[str]
    SETTINGS: ClassVar[Mapping[str, Bound]] = {}
    max_resamples: ClassVar[int | None] = None

    # ---- training ------------------------------------------------------------------------------
    @abstractmethod
    def losses(self, model, batch) -> dict[str, paddle.Tensor]:
        """Train-mode forward and the loss dict, float32 whatever the autocast state. The trainer
        backpropagates the sum; the doctor, the memory planner and the conformance tool run it too."""

    # ---- evaluation (engine: periodic, final and tools/eval.py; diagnostics: the eval probe) -----
    def begin_eval(self, val_set) -> None:
        """Called before each evaluation with the split it will see: a task keeping per-image
        outcomes for its bootstrap starts afresh here (COCO mAP also needs the split's ground truth)."""

    @abstractmethod
    def predict(self, model, batch) -> Sequence:
        """Eval-mode forward and post-processing: one entry per image of the batch, in the form the
        task's :meth:`agreement` and :meth:`draw` read (boxes, polygons or class scores)."""

    @abstractmethod
    def eval_stats(self, model, batch, predictions: list | None = None) -> dict[str, float]:
        """Summable statistics of one batch (the evaluation adds them over batches and ranks).

        ``predictions``: when a list is given, each image's :meth:`predict` entry is appended to it,
        in evaluation order. The export's precision check collects both networks' predictions this
        way for :meth:`agreement`; training passes nothing and keeps nothing."""

    @abstractmethod
    def compute_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """The pooled sums (and anything the task collected since ``begin_eval``, gathered over
        ranks) to the metrics, ``primary_metric`` among them."""

    # ---- per-image outcomes of the last evaluation (final evaluation, report, export verdict) ----
    @abstractmethod
    def bootstrap_primary(self, n_resamples: int) -> dict:
        """Bootstrap interval over the validation images of the primary metric (summary.json's ``ci``)."""

    @abstractmethod
    def resampled_primary(self, draws: np.ndarray) -> np.ndarray:
        """The primary metric with image i taken ``draws[r, i]`` times, per row r. Two tasks that saw
        the same images give the paired difference (report: split noise; export: the verdict)."""

    @abstractmethod
    def n_evaluated_images(self) -> int:
        """How many images the last evaluation scored (the width of ``draws``)."""

    def draw(self, model, batch, out_dir, prefix: str = "det", caption: str = "") -> list[Path]:
        """Write a picture of each image's predictions beside its ground truth, titled ``caption``;
        returns the files (``trainer.draw_samples``). Classification has nothing to draw: this default."""
        return []

    # ---- export (zoo/export: what is saved, and how the precision check judges it) ---------------
    def deploy_module(self, net: paddle.nn.Layer) -> paddle.nn.Layer:
        """The layer ``tools/export.py`` saves around the network: the outputs the family's clients
        read (DB's bare shrink map, the classifier's softmax, PP-YOLOE's boxes after in-graph NMS)."""
        raise NotImplementedError(f"{type(self).__name__} ({self.kind}) defines no deploy module, so it "
                                  f"cannot be exported")

    def checked_module(self, net: paddle.nn.Layer) -> paddle.nn.Layer:
        """The network the precision check evaluates with :meth:`eval_stats`: the deploy module, unless
        that module takes other inputs than the evaluation feeds (then the layers it wraps)."""
        return self.deploy_module(net)

    def agreement(self, fp32_predictions: Sequence, low_predictions: Sequence, min_score: float = 0.0) -> dict:
        """How alike two networks' predictions of the same images are, beyond the metric (the
        precision check's report). ``min_score``: detections a client would not show (its draw
        threshold) do not count, where predictions carry scores that a client thresholds."""
        raise NotImplementedError(f"{type(self).__name__} ({self.kind}) defines no agreement measure")

    def metric_unit(self, n_images: int, sums: dict[str, float], val_set) -> tuple[float, str]:
        """``(pp, what)``: the smallest step of the primary metric on this split, in percentage points,
        and what makes it (one image, one box). The precision check's margin is never finer than a
        few of these (zoo/export/resolution.py). ``sums`` are the FP32 evaluation's summed statistics."""
        raise NotImplementedError(f"{type(self).__name__} ({self.kind}) defines no metric unit")
