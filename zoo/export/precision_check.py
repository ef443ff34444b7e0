"""The export-time precision check: will this network keep its accuracy in fp16 / bf16, and which
ops must stay fp32 for it to?

For ``export.precision=fp16|bf16``, :func:`check_precision_export`:

1. evaluates the network as exported (DB's shrink map, the classifier's softmax, PP-YOLOE's boxes)
   on the validation split twice: in FP32, and as Paddle Inference would run it in the low format
   (:class:`~zoo.export.deployed.DeployedEmulation`, BatchNorm folded). Both evaluations record
   every op call of every image (zoo/export/layers.py; ``export.check.layer_batches`` caps it): the
   table by harm, the plot, where the format first overflows, and how much compute runs fp32;
2. judges the low-precision run (``_Trial``): ``different`` when any image has a non-finite output,
   whatever the metric says; otherwise the paired bootstrap interval of the primary metric (hmean,
   mAP, top-1) against the margin, widened to what the split resolves (zoo/export/resolution.py);
3. when that is not ``equivalent``, searches for a keep-list (zoo/export/search.py) among the op
   types ordered by harm, within ``export.check.max_keep`` ops and ``max_evaluations`` evaluations.
   If nothing is equivalent, the export is refused (:class:`PrecisionRefused`, exit status 1).

Nothing here depends on the family: the task says what differs (the Task contract, zoo/tasks/base.py):
which network is evaluated (``checked_module``), its predictions (``eval_stats(..., predictions)``),
how alike two sets of them are (``agreement``) and the metric's smallest step (``metric_unit``).

The keep-list is a list of op types, because that is what Paddle Inference
(``exp_disable_mixed_precision_ops``) and TensorRT (``ops_run_float`` / ``disable_ops``) accept.
The report's content is assembled in zoo/export/precision_report.py.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import paddle

from zoo.amp.nonfinite import describe
from zoo.data import EvalBatchSampler, build_loader
from zoo.engine.evaluate import evaluate
from zoo.export.common import ExportError
from zoo.export.compute import WARN_SHARE, compute_share
from zoo.export.deployed import DEFAULT_BLACK_LIST, DeployedEmulation, fold_batch_norms
from zoo.export.layers import Recorder, compare
from zoo.export.precision_report import build_report, refusal
from zoo.export.resolution import margin_rule
from zoo.export.search import candidates, search_keep_list
from zoo.export.verdict import paired_difference, verdict
from zoo.utils.checks import COUNT, COUNT_OR_ZERO, POSITIVE, PROBABILITY, Bound, check

__all__ = ["CheckSettings", "Deployment", "PrecisionRefused", "candidates", "check_precision_export",
           "search_keep_list"]

DEFAULT_MARGINS = {"top1": 0.2, "hmean": 0.3, "mAP": 0.3}


class PrecisionRefused(RuntimeError):
    """No keep-list within the limits makes the low-precision export equivalent to FP32 (exit 1)."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


# export.check.* numbers (configs/export.yaml); margin.* is the rule of every metric's margin.
CHECK_SETTINGS = {
    "margin.*": POSITIVE.but(note="percentage points"),
    "level": Bound(0.5, 1),
    "resamples": Bound(10, integer=True),
    "max_keep": COUNT_OR_ZERO,
    "max_evaluations": Bound(2, integer=True),
    "layer_batches": COUNT.but(nullable=True, note="null = every batch"),
    "warn_fp32_share": PROBABILITY,
    "top": COUNT,
}


@dataclass
class CheckSettings:
    """``export.check.*`` (configs/export.yaml)."""

    margin: dict = field(default_factory=lambda: dict(DEFAULT_MARGINS))  # pp, per primary metric
    level: float = 0.90
    resamples: int = 1000
    max_keep: int = 6
    max_evaluations: int = 14
    layer_batches: int | None = None     # batches the per-layer scan records; None: all of them
    warn_fp32_share: float = WARN_SHARE  # warn when a keep-list leaves more compute than this fp32
    top: int = 12

    def __post_init__(self):
        values = {**{f"margin.{name}": m for name, m in dict(self.margin).items()},
                  **{key: getattr(self, key) for key in CHECK_SETTINGS if key != "margin.*"}}
        for key, value in values.items():
            check(f"export.check.{key}", value, CHECK_SETTINGS["margin.*" if key.startswith("margin.") else key],
                  ExportError)

    def margin_for(self, metric: str) -> float:
        if metric not in self.margin:
            raise ExportError(f"export.check.margin: no margin for metric {metric!r}; "
                              f"set export.check.margin.{metric}=<pp>")
        return float(self.margin[metric])


class _Precision:
    """What zoo.engine.evaluate calls ``amp``: the emulation's context, or none (FP32)."""

    def __init__(self, emulation=None):
        self.emulation = emulation

    def autocast(self):
        return self.emulation() if self.emulation is not None else contextlib.nullcontext()


@dataclass
class Deployment:
    """The network the check evaluates (the task's ``checked_module``) and how to evaluate it."""

    net: paddle.nn.Layer           # DB's shrink map, the classifier's softmax, the PP-YOLOE before its in-graph NMS
    make_task: object              # () -> a fresh task (each evaluation keeps its own per-image outcomes)
    val_set: object
    batch_size: int
    draw_threshold: float = 0.5    # detections below it do not count in the agreement (the client hides them)
    more_images_key: str | None = None  # the data key a note names for a larger split (data.builder.num_val)

    def forward(self, net, batch):
        return net(batch["image"])


@dataclass
class _Evaluation:
    metrics: dict
    task: object        # holds the per-image outcomes (paired_difference)
    preds: list         # each image's prediction (the task's predict), for agreement
    sums: dict          # the task's summed eval_stats (DB: gt_care, det_care, matched)
    numerics: dict      # images with non-finite outputs (zoo/amp/nonfinite.py)
    recorder: Recorder


def _evaluate(dep: Deployment, net, emulation, recorder: Recorder) -> _Evaluation:
    """One evaluation of the split, every forward recorded by ``recorder``; the task hands over its
    predictions through the evaluation (the Task contract's ``eval_stats(..., predictions)``)."""
    task = dep.make_task()
    preds: list = []
    with recorder:
        result = evaluate(net, task, _Precision(emulation), dep.val_set, dep.batch_size, predictions=preds)
    return _Evaluation(dict(result), task, preds, result.sums, result.numerics, recorder)


class _Trial:
    """``evaluate_keep`` of the search: the deployment with a keep-list, evaluated and judged."""

    def __init__(self, dep, folded, dtype, ref: _Evaluation, margin, resamples, level, log):
        self.dep, self.folded, self.dtype, self.ref = dep, folded, dtype, ref
        self.margin, self.resamples, self.level, self.log = margin, resamples, level, log

    def __call__(self, keep, values: bool = False, max_forwards: int | None = None) -> dict:
        rec = Recorder(self.folded, self.dtype, max_forwards if values else None, values=values)
        ev = _evaluate(self.dep, self.folded, DeployedEmulation(self.dtype, keep), rec)
        diff = paired_difference(self.ref.task, ev.task, self.resamples, self.level)
        on_metric = verdict(diff["ci_pp"], self.margin)
        bad = describe(ev.numerics)
        share = compute_share(rec.calls)
        result = {"keep": list(keep), "metrics": ev.metrics, **diff, "metric_verdict": on_metric,
                  "verdict": "different" if bad else on_metric, "nonfinite": ev.numerics,
                  "agreement": self.ref.task.agreement(self.ref.preds, ev.preds, self.dep.draw_threshold),
                  "compute": share, "fp32_share": share["fp32_share"], "_recorder": rec if values else None}
        self.log(f"  keep fp32 {list(keep) or '[]'}: {self.ref.task.primary_metric} {diff['delta_pp']:+.2f} pp, "
                 f"{100 * self.level:.0f}% CI [{diff['ci_pp'][0]:+.2f}, {diff['ci_pp'][1]:+.2f}]"
                 f"{'; ' + bad if bad else ''}; {100 * share['fp32_share']:.0f} % of compute fp32 -> {result['verdict']}")
        return result


def _batches(dep: Deployment, limit: int | None = None):
    """The validation batches in evaluation order (streamed), the first ``limit`` when given."""
    sampler = EvalBatchSampler(len(dep.val_set), dep.batch_size)
    for i, batch in enumerate(build_loader(dep.val_set, sampler, 0)):
        if limit is not None and i >= limit:
            return
        yield batch


def _require_finite_fp32(ref: _Evaluation, precision: str) -> None:
    said = describe(ref.numerics)
    if said:
        raise ExportError(f"export.precision={precision}: the FP32 network itself outputs inf/NaN ({said}), so "
                          "there is nothing to compare the low-precision deployment with; check the weights "
                          "(run=), or skip the check with export.guard=off")


def check_precision_export(dep: Deployment, precision: str, dtype: str, settings: CheckSettings,
                           log=print) -> dict:
    """Run the check (module docstring); returns the report (``precision_report.json``'s content).
    Raises :class:`PrecisionRefused` (the report attached as ``.report``) when no keep-list works."""
    t0 = time.time()
    folded, n_folded = fold_batch_norms(dep.net, next(_batches(dep, 1))["image"], lambda n, x: n(x))
    cap = settings.layer_batches
    ref = _evaluate(dep, folded, None, Recorder(folded, dtype, cap))
    _require_finite_fp32(ref, precision)
    metric, n = ref.task.primary_metric, ref.task.n_evaluated_images()
    rule = margin_rule(metric, settings.margin_for(metric), *ref.task.metric_unit(n, ref.sums, dep.val_set), n,
                       settings.level, dep.more_images_key)
    resamples = min(settings.resamples, getattr(ref.task, "max_resamples", None) or settings.resamples)
    log(f"precision check: {metric} of the FP32 export {100 * ref.metrics[metric]:.2f} on {n} images; "
        f"deployed {precision} emulated (zoo/export/deployed.py)")
    if rule["note"]:
        log(f"  note: {rule['note']}")

    trial = _Trial(dep, folded, dtype, ref, rule["margin_pp"], resamples, settings.level, log)
    first = trial((), values=True, max_forwards=cap)
    low_rec = first.pop("_recorder")
    rows = compare(ref.recorder.calls, low_rec.calls, dtype)
    cands = candidates(rows, exclude=DEFAULT_BLACK_LIST)
    keep, tried = search_keep_list(trial, cands, settings.max_keep, settings.max_evaluations, known={(): first})
    final = next(r for r in tried if r["keep"] == list(keep)) if keep is not None else tried[-1]
    final_rows = rows
    if keep:
        kept = Recorder(folded, dtype)
        with kept, paddle.no_grad(), DeployedEmulation(dtype, keep)():
            for batch in _batches(dep, cap):
                dep.forward(folded, batch)
        final_rows = compare(ref.recorder.calls, kept.calls, dtype)
    report = build_report(precision=precision, dtype=dtype, metric=metric, rule=rule, settings=settings,
                          ref_metrics=ref.metrics, tried=tried, final=final, keep=keep, cands=cands,
                          rows=rows, final_rows=final_rows, scan=low_rec, n_images=n, n_folded=n_folded,
                          seconds=time.time() - t0)
    if keep is None:
        raise PrecisionRefused(refusal(report), report)
    return report
