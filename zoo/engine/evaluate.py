"""Evaluation shared by training (periodic and final) and tools/eval.py."""
from __future__ import annotations

import paddle

from zoo.data import EvalBatchSampler, build_loader
from zoo.utils import distributed as dist
from zoo.utils.progress import progress as with_progress


def evaluate(model, task, amp, val_set, batch_size: int, num_workers: int = 0,
             progress: bool = False, stop=None) -> dict[str, float]:
    """Run ``task.eval_stats`` over this rank's shard of ``val_set``, pool over ranks, compute metrics.

    A task with a ``begin_eval(val_set)`` method is told first, so it can collect per-image results
    for a metric that is not a sum of batch counts (its ``compute_metrics`` gathers them over ranks).
    Evaluation runs under the same autocast as training, so an AMP run is judged in the precision
    it would be deployed with. The model is left in eval mode; callers switch it back.
    ``stop`` (a :class:`~zoo.engine.signals.StopRequests`) is checked before every batch, so a stop
    signal ends the evaluation within one batch (:class:`~zoo.engine.signals.StopRequested`).
    """
    sampler = EvalBatchSampler(len(val_set), batch_size, dist.rank(), dist.world_size())
    loader = build_loader(val_set, sampler, num_workers)
    sums: dict[str, float] = {}
    if hasattr(task, "begin_eval"):  # tasks whose metric is not a sum over batches (COCO mAP)
        task.begin_eval(val_set)
    model.eval()
    with paddle.no_grad(), amp.autocast():
        for batch in with_progress(loader, total=len(sampler), desc="eval", unit="batches", leave=False,
                                   disable=not (progress and dist.is_main())):
            if stop is not None:
                stop.check()
            for k, v in task.eval_stats(model, batch).items():
                sums[k] = sums.get(k, 0.0) + v
    return task.compute_metrics(dist.all_reduce_sums(sums))


def draw_samples(task, model, val_set, count: int, out_dir, prefix: str) -> list:
    """Let the task draw its predictions on the first ``count`` validation images (if it can draw).

    Detection tasks write PNGs with predicted and ground-truth boxes; tasks without a ``draw``
    method (classification) write nothing. Returns the written paths.
    """
    if not hasattr(task, "draw") or count <= 0:
        return []
    sampler = EvalBatchSampler(min(count, len(val_set)), count)
    batch = next(iter(build_loader(val_set, sampler)))
    with paddle.no_grad():
        return task.draw(model, batch, out_dir, prefix)
