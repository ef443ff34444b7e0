"""The export-time precision guard: will this network keep its accuracy in fp16 / bf16, and which
ops must stay fp32 for it to?

For ``export.precision=fp16|bf16``, :func:`check_precision_export` does four things:

1. It evaluates the network as exported (DB's shrink map, the classifier's softmax, PP-YOLOE's boxes)
   on the validation split twice: in FP32, and as Paddle Inference would run it in the low format
   (:class:`~zoo.export.deployed.DeployedEmulation`, BatchNorm folded).
2. It compares the primary metric (hmean, mAP, top-1) per image, with the paired bootstrap, against
   ``export.check.margin`` (zoo/export/verdict.py). It also compares the predictions themselves.
3. It records every op call of the first validation batches in both runs (zoo/export/layers.py):
   the table by harm, the plot, and the first non-finite output.
4. When the verdict is not ``equivalent``, it searches for a keep-list (zoo/export/search.py: the
   op types by harm, grown one at a time, then shrunk). It stops at ``export.check.max_keep`` ops or
   ``max_evaluations`` evaluations. If nothing within those limits is equivalent, the export is
   refused (:class:`PrecisionRefused`, exit status 1).

The keep-list is a list of op types, because that is what Paddle Inference
(``exp_disable_mixed_precision_ops``) and TensorRT (``ops_run_float`` / ``disable_ops``) accept.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field

import paddle

from zoo.data import EvalBatchSampler, build_loader
from zoo.engine.evaluate import evaluate
from zoo.export.common import ExportError
from zoo.export.deployed import DEFAULT_BLACK_LIST, VERSION, DeployedEmulation, consumer_black_list, fold_batch_norms
from zoo.export.layers import compare, first_nonfinite, harm, record
from zoo.export.search import candidates, search_keep_list
from zoo.export.verdict import box_agreement, class_agreement, paired_difference, polygon_agreement, verdict
from zoo.utils.checks import COUNT, COUNT_OR_ZERO, POSITIVE, Bound, check

__all__ = ["CheckSettings", "PrecisionRefused", "candidates", "check_precision_export", "search_keep_list"]

DEFAULT_MARGINS = {"top1": 0.2, "hmean": 0.3, "mAP": 0.3}
MAX_MAP_RESAMPLES = 200  # COCOeval's accumulate runs once per replicate


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
    "layer_batches": COUNT,
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
    layer_batches: int = 1
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
    """The network as exported, and how to evaluate it: ``kind`` is db, classification or ppyoloe."""

    net: paddle.nn.Layer           # the exported forward (DBProbabilityMap / ClassifierProbs / the PP-YOLOE)
    kind: str
    make_task: object              # () -> a fresh task
    val_set: object
    batch_size: int
    draw_threshold: float = 0.5

    def forward(self, net, batch):
        return net(batch["image"])


def _evaluate(dep: Deployment, net, emulation=None):
    """Metrics, the task holding the per-image outcomes, and the predictions (for agreement)."""
    task = dep.make_task()
    preds: list = []
    hook = None
    if dep.kind == "classification":
        hook = net.register_forward_post_hook(lambda _l, _i, out: preds.append(out.astype("float32").numpy()))
    else:
        predict = task.predict

        def recording(model, batch):
            out = predict(model, batch)
            preds.extend(out)
            return out
        task.predict = recording
    try:
        metrics = evaluate(net, task, _Precision(emulation), dep.val_set, dep.batch_size)
    finally:
        if hook is not None:
            hook.remove()
    return metrics, task, preds


def _agreement(dep: Deployment, ref_preds, low_preds) -> dict:
    if dep.kind == "classification":
        return class_agreement(ref_preds, low_preds)
    if dep.kind == "db":
        return polygon_agreement(ref_preds, low_preds)
    return box_agreement(ref_preds, low_preds, dep.draw_threshold)


def _layer_batches(dep: Deployment, n: int) -> list:
    sampler = EvalBatchSampler(len(dep.val_set), dep.batch_size)
    out = []
    for batch in build_loader(dep.val_set, sampler, 0):
        out.append(batch)
        if len(out) == n:
            break
    return out


def check_precision_export(dep: Deployment, precision: str, dtype: str, settings: CheckSettings,
                           log=print) -> dict:
    """Run the guard (module docstring); returns the report (``precision_report.json``'s content).
    Raises :class:`PrecisionRefused` (the report attached as ``.report``) when no keep-list works."""
    t0 = time.time()
    batches = _layer_batches(dep, settings.layer_batches)
    folded, n_folded = fold_batch_norms(dep.net, batches[0]["image"], lambda n, x: n(x))
    ref_metrics, ref_task, ref_preds = _evaluate(dep, dep.net)
    metric = ref_task.primary_metric
    margin = settings.margin_for(metric)
    resamples = min(settings.resamples, MAX_MAP_RESAMPLES) if metric == "mAP" else settings.resamples
    log(f"precision check: {metric} of the FP32 export {100 * ref_metrics[metric]:.2f} on "
        f"{ref_task.n_evaluated_images()} images; deployed {precision} emulated (zoo/export/deployed.py)")

    resolution = _resolution_note(metric, ref_task.n_evaluated_images(), margin)
    if resolution:
        log(f"  note: {resolution}")

    def evaluate_keep(keep) -> dict:
        metrics, task, preds = _evaluate(dep, folded, DeployedEmulation(dtype, keep))
        diff = paired_difference(ref_task, task, resamples, settings.level)
        result = {"keep": list(keep), "metrics": metrics, **diff, "verdict": verdict(diff["ci_pp"], margin),
                  "agreement": _agreement(dep, ref_preds, preds)}
        log(f"  keep fp32 {list(keep) or '[]'}: {metric} {diff['delta_pp']:+.2f} pp, "
            f"{100 * settings.level:.0f}% CI [{diff['ci_pp'][0]:+.2f}, {diff['ci_pp'][1]:+.2f}] -> {result['verdict']}")
        return result

    ref_calls = record(folded, dep.forward, batches, dtype)
    rows = compare(ref_calls, record(folded, dep.forward, batches, dtype, DeployedEmulation(dtype)), dtype)
    cands = candidates(rows, exclude=DEFAULT_BLACK_LIST)
    keep, tried = search_keep_list(evaluate_keep, cands, settings.max_keep, settings.max_evaluations)
    final = next(r for r in tried if keep is not None and r["keep"] == list(keep)) if keep is not None else tried[-1]
    final_rows = rows if not keep else compare(
        ref_calls, record(folded, dep.forward, batches, dtype, DeployedEmulation(dtype, keep)), dtype)
    worst = first_nonfinite(rows) or (sorted(rows, key=harm)[0] if rows else None)
    report = {
        "precision": precision, "dtype": dtype, "guard": "on",
        "verdict": "equivalent" if keep is not None else "refused",
        "metric": metric, "margin_pp": margin, "level": settings.level,
        "fp32": ref_metrics, "deployed": final["metrics"], "delta_pp": final["delta_pp"], "ci_pp": final["ci_pp"],
        "n_images": final["n_images"], "n_resamples": final["n_resamples"], "agreement": final["agreement"],
        "without_keep_list": {k: tried[0][k] for k in ("delta_pp", "ci_pp", "verdict", "agreement")},
        "keep_fp32": list(keep) if keep is not None else None,
        "consumer_black_list": consumer_black_list(keep or ()),
        "candidates": cands[:settings.max_keep], "search": [{k: r[k] for k in ("keep", "delta_pp", "ci_pp", "verdict")}
                                                           for r in tried],
        "layers": {"batches": len(batches), "op_calls": len(rows), "batchnorms_folded": n_folded,
                   "first_nonfinite": first_nonfinite(rows)["key"] if first_nonfinite(rows) else None,
                   "worst": worst["key"] if worst else None,
                   "without_keep_list": sorted(rows, key=harm)[:settings.top],
                   "with_keep_list": sorted(final_rows, key=harm)[:settings.top]},
        "emulation": {"rule": "Paddle Inference mixed precision (zoo/export/deployed.py)", "version": VERSION,
                      "paddle": paddle.__version__},
        "settings": asdict(settings), "time_s": round(time.time() - t0, 1),
        "resolution_note": resolution,
    }
    report["_rows"] = (rows, final_rows)  # for the plot; dropped before writing
    if keep is None:
        raise PrecisionRefused(_refusal(report, worst, settings), report)
    return report


def _resolution_note(metric: str, n_images: int, margin_pp: float) -> str | None:
    """A warning when top-1's margin is finer than the split resolves, else None.

    One image whose top-1 changes moves top-1 by 100/n pp, and the paired bootstrap's 90 % interval
    of a single such image reaches 3 images' worth (P(Binomial(n, 1/n) >= 3) is about 8 %). With
    a margin at or below that, one changed image among n makes the verdict "not shown", and the
    search keeps ops fp32 to undo a difference the split cannot tell from none (MODEL_CARDS,
    Deployment precision: resnet18 on 1000 images)."""
    if metric != "top1" or n_images <= 0:
        return None
    one = 100.0 / n_images
    if margin_pp > 3 * one:
        return None
    return (f"margin ±{margin_pp:g} pp is within 3 images' worth on {n_images} images (one changed top-1 "
            f"= {one:.2g} pp): a single changed image cannot be shown equivalent; give more images "
            f"(export.calibration=..., or data.builder.num_val) or a wider export.check.margin.top1")


def _refusal(report: dict, worst: dict | None, settings: CheckSettings) -> str:
    where = (f"; worst layer {worst['key']} ({worst['layer_type']}"
             f"{', first non-finite output' if worst['nonfinite'] > 0 else ''})") if worst else ""
    first = report["without_keep_list"]
    return (f"export.precision={report['precision']}: {first['verdict']} against FP32 ({report['metric']} "
            f"{first['delta_pp']:+.2f} pp, {100 * report['level']:.0f}% CI [{first['ci_pp'][0]:+.2f}, "
            f"{first['ci_pp'][1]:+.2f}], margin ±{report['margin_pp']:g}) and no keep-list of up to "
            f"{settings.max_keep} ops within {settings.max_evaluations} evaluations makes it equivalent{where}")
