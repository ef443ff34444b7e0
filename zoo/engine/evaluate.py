"""Evaluation shared by training (periodic and final) and tools/eval.py."""
from __future__ import annotations

import contextlib
import logging

import paddle

from zoo.amp.nonfinite import NonFiniteWatch, describe, merge
from zoo.data import EvalBatchSampler, build_loader
from zoo.utils import distributed as dist
from zoo.utils.progress import progress as with_progress

log = logging.getLogger(__name__)


class EvalResult(dict):
    """The metrics (a plain dict, as before) and ``numerics``: the evaluation's non-finite outputs
    (zoo/amp/nonfinite.py: images, nonfinite_images, image_indices, first_layers), and ``sums``: the
    task's ``eval_stats`` summed over batches and ranks."""

    numerics: dict
    sums: dict


def evaluate(model, task, amp, val_set, batch_size: int, num_workers: int = 0,
             progress: bool = False, stop=None, predictions: list | None = None) -> EvalResult:
    """Run ``task.eval_stats`` over this rank's shard of ``val_set``, pool over ranks, compute metrics.

    A task with a ``begin_eval(val_set)`` method is told first, so it can collect per-image results
    for a metric that is not a sum of batch counts (its ``compute_metrics`` gathers them over ranks).
    Evaluation runs under the same autocast as training, so an AMP run is judged in the precision
    it would be deployed with. The model is left in eval mode; callers switch it back.
    ``stop`` (a :class:`~zoo.engine.signals.StopRequests`) is checked before every batch, so a stop
    signal ends the evaluation within one batch (:class:`~zoo.engine.signals.StopRequested`).

    Every evaluation counts the images whose forward met inf or NaN and the layer where it started
    (:class:`~zoo.amp.nonfinite.NonFiniteWatch`; every layer's output under low precision, the
    model's outputs in FP32), pooled over ranks into ``result.numerics``; callers print and record
    it (:func:`nonfinite_line`). ``result.sums`` holds the pooled ``eval_stats``.

    ``predictions``: a list that receives each image's ``task.predict`` entry, in evaluation order
    (the Task contract's ``eval_stats(..., predictions)``; the export's precision check compares two
    networks' predictions with it). Training passes nothing, and nothing is kept.
    """
    sampler = EvalBatchSampler(len(val_set), batch_size, dist.rank(), dist.world_size())
    loader = build_loader(val_set, sampler, num_workers)
    sums: dict[str, float] = {}
    if hasattr(task, "begin_eval"):  # tasks whose metric is not a sum over batches (COCO mAP)
        task.begin_eval(val_set)
    model.eval()
    batches = with_progress(loader, total=len(sampler), desc="eval", unit="batches", leave=False,
                            disable=not (progress and dist.is_main()))
    low = bool(getattr(amp, "active", False) or getattr(amp, "emulation", None) is not None)
    with paddle.no_grad(), amp.autocast(), NonFiniteWatch(dist.unwrap(model), layers=low) as watch:
        for batch, indices in zip(batches, sampler):  # batches first: its bar ends when it runs out
            if stop is not None:
                stop.check()
            watch.begin_batch(indices)
            stats = task.eval_stats(model, batch) if predictions is None else \
                task.eval_stats(model, batch, predictions=predictions)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
    pooled = dist.all_reduce_sums(sums)
    result = EvalResult(task.compute_metrics(dict(pooled)))
    result.sums = pooled
    numerics = watch.result()
    result.numerics = merge(dist.all_gather_objects(numerics)) if dist.world_size() > 1 else numerics
    return result


def nonfinite_line(result, precision: str) -> str | None:
    """One console line when the evaluation ``result`` had non-finite outputs, else None."""
    said = describe(getattr(result, "numerics", None))
    return f"non-finite outputs in the {precision} evaluation: {said}" if said else None


def draw_samples(task, model, val_set, count: int, out_dir, prefix: str, amp=None, caption: str = "") -> list:
    """Let the task draw its predictions on the first ``count`` validation images (if it can draw),
    computed under ``amp``'s autocast (the precision that was measured; FP32 when None) and titled
    ``caption``.

    Detection tasks write PNGs with predicted and ground-truth boxes and a legend; classification
    draws nothing (``Task.draw``'s default), nor does a task without a ``draw``. Returns the written paths.
    """
    if not hasattr(task, "draw") or count <= 0:
        return []
    sampler = EvalBatchSampler(min(count, len(val_set)), count)
    batch = next(iter(build_loader(val_set, sampler)))
    with paddle.no_grad(), amp.autocast() if amp is not None else contextlib.nullcontext():
        return task.draw(model, batch, out_dir, prefix, caption=caption)
