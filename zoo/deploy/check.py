"""Would this Paddle inference model keep its predictions deployed in fp16 / bf16? Checked on the
user's own images, without labels (``tools/deploy_check.py``; docs/export.md, "Check a deployed model").

The model is any inference program PaddleOCR, PaddleDetection, PaddleClas, PaddleX or the zoo wrote
(zoo/weights/program.py). It is run op by op by zoo/deploy/interpreter.py, so the deployment emulation
of zoo/export/deployed.py sees every op, with Paddle Inference's conv + BatchNorm fold applied to the
program first, as its GPU passes do. For each precision:

1. **FP32 and the deployment, image by image.** Both runs are recorded op by op
   (zoo/export/layers.py): max |output|, overflow, flush to zero, relative error against FP32, growth,
   and the first op whose low-precision output holds inf/NaN, named by program variable and op type.
2. **A verdict without labels**: the task's post-processing turns each run's outputs into predictions
   (zoo/deploy/tasks.py), and what the low-precision predictions lose against FP32's is counted per
   image in the task's unit (FP32 text boxes or boxes matched at IoU >= 0.9, images with the same
   top-1 or decoded string). The share lost gets a percentile bootstrap interval over the images
   (zoo/deploy/agreement.py) and is read against the margin: ``equivalent`` when the whole interval
   is at most the margin. An image whose low-precision run met inf/NaN in any op where FP32 did not
   makes the precision ``different`` whatever the predictions say.
3. **A keep-list when it is not equivalent**: op types kept fp32, searched as the zoo's export check
   searches (zoo/export/search.py: grow by harm, then drop what is not needed), then narrowed to the
   named ops of those types (TensorRT's ``exp_disable_tensorrt_ops`` takes output variable names).
   No equivalent list within ``max_keep`` / ``max_evaluations``: that precision is refused, and the
   tool exits 1.

What the check cannot know: the images are the user's, so the verdict says how these images fare,
not a population; a GPU's own kernels may round differently in places (``pytest -m gpu`` compares the
emulation with a real GPU where one exists).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import paddle

from zoo.amp.emulation import suspended
from zoo.deploy.agreement import DEFAULT_MARGINS_PCT, agreement_verdict, paired_agreement, resolution_note
from zoo.deploy.errors import DeployError
from zoo.export.compute import compute_share, share_warning
from zoo.export.deployed import DEFAULT_BLACK_LIST, DeployedEmulation, consumer_black_list
from zoo.export.layers import Recorder, compare, first_overflow, harm
from zoo.export.search import candidates, search_keep_list

__all__ = ["CheckSettings", "Inputs", "check_precision", "run_pass"]

DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


@dataclass
class CheckSettings:
    """The check's settings (configs/deploy_check.yaml ``check:``)."""

    margin: float | None = None    # % of units lost; None: the task's default (zoo/deploy/agreement.py)
    level: float = 0.90
    resamples: int = 1000
    max_keep: int = 6              # op types kept fp32 at most
    max_evaluations: int = 14      # passes over the images while searching op types
    named: bool = True             # narrow a type keep-list to named ops
    max_named: int = 8             # named ops kept at most
    max_named_evaluations: int = 12
    warn_fp32_share: float = 0.5
    top: int = 12                  # rows of the worst-op table in the report
    seed: int = 0


@dataclass
class Inputs:
    """The images, prepared once: each image's feeds (by program feed name) and post-processing meta."""

    paths: list
    feeds: list                    # per image: dict feed name -> array (batch 1)
    metas: list
    feed_order: list = field(default_factory=list)

    def tensors(self, i: int) -> list:
        feeds = self.feeds[i]
        missing = [n for n in self.feed_order if n not in feeds]
        if missing:
            raise DeployError(f"the program feeds {self.feed_order}, but the preprocessing gave {sorted(feeds)} "
                              f"(missing {missing}); pass preset= for this model's family or fix its yml")
        return [paddle.to_tensor(np.ascontiguousarray(feeds[n])) for n in self.feed_order]


@dataclass
class Pass:
    """One run over every image: predictions, outputs' health and what the recorder saw."""

    preds: list
    nonfinite: list                # per image: {call key: count of non-finite values it output}
    recorder: Recorder
    seconds: float


def run_pass(net, task, inputs: Inputs, dtype: str, emulation=None, keep_named=(), values: bool = True) -> Pass:
    """``net`` over every image (FP32 when ``emulation`` is None), each op recorded; ``keep_named``
    are op layers (by ``zoo_name``) run fp32 inside the emulation, with their fused bias and
    activation (:func:`fused_groups`)."""
    t0 = time.time()
    rec = Recorder(net, dtype, values=values)
    preds, bad = [], []
    hooks = _keep_hooks(net, keep_named) if keep_named else []
    try:
        with rec, paddle.no_grad():
            for i in range(len(inputs.feeds)):
                before = {k: c.nonfinite for k, c in rec.calls.items()}
                with emulation() if emulation is not None else contextlib.nullcontext():
                    outs = net(*inputs.tensors(i))
                arrays = [o.numpy() for o in (outs if isinstance(outs, (list, tuple)) else [outs])]
                grew = {k: c.nonfinite - before.get(k, 0) for k, c in rec.calls.items()
                        if c.nonfinite > before.get(k, 0)}
                for j, a in enumerate(arrays):  # outputs count even with values=False
                    if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
                        grew[f"output {j}"] = int((~np.isfinite(a)).sum())
                bad.append(grew)
                preds.append(task.predict(arrays, inputs.metas[i]))
    finally:
        for h in hooks:
            h.remove()
    return Pass(preds, bad, rec, time.time() - t0)


def _keep_hooks(net, names) -> list:
    """Forward hooks that run the op layers named ``names`` with the emulation suspended (fp32)."""
    wanted = set(names)
    hooks = []
    for layer in net.sublayers():
        if getattr(layer, "zoo_name", None) in wanted:
            stack = contextlib.ExitStack()

            def pre(_layer, _inputs, stack=stack):
                stack.enter_context(suspended())

            def post(_layer, _inputs, _outputs, stack=stack):
                stack.close()

            hooks += [layer.register_forward_pre_hook(pre), layer.register_forward_post_hook(post)]
    return hooks


def fused_groups(program) -> dict[str, list[str]]:
    """Each conv / matmul's output variable -> the variables of the op group Paddle Inference fuses
    with it (``conv2d_add_act_fuse``, ``matmul_add_act_fuse``): the bias add and the activation that
    follow it as their only consumers. Keeping a named conv fp32 keeps its group, as the fused kernel
    runs whole in one precision."""
    from zoo.export.deployed import GROUP_ACTS

    consumers: dict[str, list] = {}
    for op in program.ops:
        for names in op.inputs.values():
            for n in names:
                consumers.setdefault(n, []).append(op)
    heads = {"conv2d", "depthwise_conv2d", "matmul_v2", "matmul", "fc"}
    acts = GROUP_ACTS | {"hard_swish", "hard_sigmoid"}
    groups = {}
    for op in program.ops:
        if op.type not in heads:
            continue
        out = _first_output(op)
        group, cur = [out], out
        for allowed in ({"elementwise_add"}, acts):
            nxt = consumers.get(cur, [])
            if len(nxt) != 1 or nxt[0].type not in allowed:
                continue
            cur = _first_output(nxt[0])
            group.append(cur)
        groups[out] = group
    return groups


def _first_output(op) -> str:
    for names in op.outputs.values():
        if names:
            return names[0]
    return ""


def _nonfinite_images(low: Pass, ref: Pass) -> list[int]:
    """Images whose low-precision run met inf/NaN in an op (or output) where FP32 did not."""
    return [i for i, (lo, fp) in enumerate(zip(low.nonfinite, ref.nonfinite))
            if any(n > fp.get(k, 0) for k, n in lo.items())]


def _first_bad(low: Pass, ref: Pass, order: list[str]) -> str | None:
    """The first call (execution order) whose output met inf/NaN only in the low-precision run."""
    seen = set()
    for lo, fp in zip(low.nonfinite, ref.nonfinite):
        seen |= {k for k, n in lo.items() if n > fp.get(k, 0)}
    return next((k for k in order if k in seen), None) or (sorted(seen)[0] if seen else None)


class _Trial:
    """One keep-list evaluated on every image and judged (``evaluate_keep`` of the search)."""

    def __init__(self, net, task, inputs, dtype, ref: Pass, margin, settings: CheckSettings, groups, log):
        self.net, self.task, self.inputs, self.dtype, self.ref = net, task, inputs, dtype, ref
        self.margin, self.settings, self.groups, self.log = margin, settings, groups, log

    def __call__(self, keep=(), named=(), values: bool = True) -> dict:
        names = [v for n in named for v in self.groups.get(n, [n])]
        low = run_pass(self.net, self.task, self.inputs, self.dtype, DeployedEmulation(self.dtype, keep),
                       keep_named=names, values=values)
        per_image = [self.task.agree(a, b) for a, b in zip(self.ref.preds, low.preds)]
        raw = paired_agreement(per_image, self.settings.resamples, self.settings.level, self.settings.seed)
        stats = {"lost_pct": raw["disagreement_pct"], "ci_pct": [raw["ci_low_pct"], raw["ci_high_pct"]],
                 "units": raw["n_units"], "images": raw["n_images"], "_raw": raw}
        bad = _nonfinite_images(low, self.ref)
        share = compute_share(low.recorder.calls)
        result = {"keep": list(named) if named else list(keep), "keep_types": list(keep), "keep_named": list(named),
                  **stats, "nonfinite_images": bad,
                  "verdict": agreement_verdict(raw, self.margin, bool(bad)),
                  "fp32_share": share["fp32_share"], "compute": share, "seconds": low.seconds,
                  "per_image": per_image, "_pass": low}
        what = f"{list(named)} (named)" if named else (list(keep) or "[]")
        self.log(f"  keep fp32 {what}: {lost_text(stats, self.task.unit, self.settings.level)}"
                 f"{f'; {len(bad)} image(s) met inf/NaN' if bad else ''}; {100 * share['fp32_share']:.0f} % of "
                 f"compute fp32 -> {result['verdict']} ({low.seconds:.0f} s)")
        return result


def lost_text(step: dict, unit: str, level: float) -> str:
    """``1.23 % of 19 FP32 text boxes lost (90% CI [0.00, 5.26])``, or that there was nothing to lose."""
    if step["lost_pct"] is None:
        return f"no {unit} on any image: nothing to compare"
    lo, hi = step["ci_pct"]
    return f"{step['lost_pct']:.2f} % of {step['units']} {plural(unit)} lost ({100 * level:.0f}% CI [{lo:.2f}, {hi:.2f}])"


def plural(unit: str) -> str:
    """``FP32 text box`` -> ``FP32 text boxes``, ``image`` -> ``images``."""
    return unit + ("es" if unit.endswith(("x", "s")) else "s")


def _named_candidates(rows: list[dict], keep_types, limit: int) -> list[str]:
    """Named ops of the kept types, most harmful first (their program variable)."""
    types = set(keep_types)
    mine = sorted((r for r in rows if r["op"] in types and r["precision"] != "fp32"), key=harm)
    return list(dict.fromkeys(r["layer"] for r in mine))[:limit]


# Ops whose output is a selection (which boxes, in which order): compared element by element with FP32's,
# a changed order or count reads as a large "relative error" though every box may match. Their effect
# is what the agreement measures; the worst-op ranking leaves them out.
SELECTION_OPS = frozenset({"multiclass_nms3", "multiclass_nms", "matrix_nms", "top_k", "top_k_v2", "topk",
                           "argsort", "argmax", "arg_max", "nonzero", "where_index"})


def worst_ops(rows: list[dict], top: int) -> list[dict]:
    """The ``top`` most harmful op calls (zoo/export/layers.py ``harm``), selections left out unless
    their output is not finite."""
    ranked = [r for r in rows if r["op"] not in SELECTION_OPS or r["nonfinite"]]
    return sorted(ranked, key=harm)[:top]


def _row(r: dict) -> dict:
    keys = ("key", "layer", "op", "precision", "max_abs", "overflow", "flush", "rel_err", "growth", "nonfinite",
            "nonfinite_images", "images")
    return {k: r[k] for k in keys}


def _step(result: dict) -> dict:
    keys = ("keep_types", "keep_named", "lost_pct", "ci_pct", "units", "images", "verdict", "fp32_share", "seconds")
    return {**{k: result[k] for k in keys}, "nonfinite_images": len(result["nonfinite_images"])}


def check_precision(net, program, task, inputs: Inputs, precision: str, settings: CheckSettings,
                    ref: Pass | None = None, log=print) -> dict:
    """The check of one precision (module docstring); returns its report section, with ``_rows``
    (the per-op rows without a keep-list, for the plot) to drop before writing JSON."""
    if precision not in DTYPES:
        raise DeployError(f"precision: expected fp16 or bf16 (comma-separated for several), got {precision!r}")
    t0 = time.time()
    dtype = DTYPES[precision]
    ref = ref or run_pass(net, task, inputs, dtype)
    margin = settings.margin if settings.margin is not None else DEFAULT_MARGINS_PCT[task.kind]
    trial = _Trial(net, task, inputs, dtype, ref, margin, settings, fused_groups(program), log)
    first = trial(())
    low = first.pop("_pass")
    rows = compare(ref.recorder.calls, low.recorder.calls, dtype)
    bad_first = _first_bad(low, ref, [r["key"] for r in rows]) if first["nonfinite_images"] else None
    cands = candidates(rows, exclude=DEFAULT_BLACK_LIST)
    if not first["units"]:  # nothing to lose: no keep-list can change that, so none is searched
        cands = []
    keep, tried = search_keep_list(lambda k: _drop_pass(trial(k)), cands, settings.max_keep,
                                   settings.max_evaluations, known={(): first})
    named, named_tried = None, []
    if keep and settings.named:
        ncands = _named_candidates(rows, keep, settings.max_named)
        found, named_tried = search_keep_list(lambda n: _drop_pass(trial((), named=n)), ncands, settings.max_named,
                                              settings.max_named_evaluations)
        named = list(found) if found else None
    final = next(r for r in tried if r["keep"] == list(keep)) if keep is not None else first
    warn = share_warning(final["fp32_share"], keep or (), precision, settings.warn_fp32_share,
                         key="check.warn_fp32_share")
    where = first_overflow(rows)
    section = {
        "precision": precision, "dtype": dtype, "task": task.kind, "unit": task.unit,
        # what was computed: the deployment's numbers emulated in FP32 arithmetic, never a real fp16 run
        "effective": f"emulated-{precision} deployment (zoo/export/deployed.py) on {paddle.device.get_device()}",
        "verdict": ("nothing to compare" if not first["units"] else
                    "equivalent" if keep == () else "equivalent with a keep-list" if keep else "refused"),
        "margin_pct": margin, "level": settings.level,
        "note": resolution_note(first["_raw"], margin, task.unit),
        "without_keep_list": {**_step(first), "first_nonfinite": bad_first},
        "keep_fp32": list(keep) if keep is not None else None,
        "keep_fp32_named": named,
        "consumer_black_list": consumer_black_list(keep) if keep is not None else None,
        "tensorrt_disable_ops": (named or list(keep)) if keep else [],
        "final": _step(final), "fp32_share_warning": warn,
        "first_overflow": _row(where) if where else None,
        "worst_ops": [_row(r) for r in worst_ops(rows, settings.top)],
        "tried": [_step(r) for r in tried], "tried_named": [_step(r) for r in named_tried],
        "per_image": [{"image": str(p), **a} for p, a in zip(inputs.paths, first["per_image"])],
        "seconds": time.time() - t0, "_rows": rows,
    }
    return section


def _drop_pass(result: dict) -> dict:
    result.pop("_pass", None)
    return result
