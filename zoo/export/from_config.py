"""``tools/export.py``'s body: from the composed config to the export files and ``export.json``.

Which exporter a model gets follows its task's kind (:data:`EXPORTS`, one row per kind): text detection
and classification -> :func:`~zoo.export.inference.export_inference` (DB's shrink map, softmax
probabilities), object detection -> :func:`~zoo.export.detection.export_ppyoloe` (NMS in the graph);
the layer saved around the network is the task's ``deploy_module`` (zoo/tasks). A network with
re-parameterisable layers (PP-OCRv4/v5 mobile det) is exported in its deploy form, a ``rep()``'d copy,
as PaddleOCR's export does. For fp16 / bf16 the precision check judges that deployment first
(zoo/export/precision_check.py). Options: configs/export.yaml.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paddle

import zoo
from zoo.engine.checkpoint import CheckpointError, check_fits
from zoo.engine.from_run import resolve_weights, run_source
from zoo.engine.run import ConfigError, announce_pretrained_fallback, build, check_numbers, seed_everything
from zoo.engine.runinfo import git_revision, write_json
from zoo.export.checked_export import (
    PLOT,
    YML_KEY,
    check_mode,
    run_precision_check,
    skipped_report,
    write_report,
    yml_block,
)
from zoo.export.common import ExportError, in_deploy_form
from zoo.export.detection import export_ppyoloe, ppyoloe_infer_cfg, ppyoloe_model_name
from zoo.export.inference import (
    INFERENCE_PREFIX,
    LAYOUTS,
    cls_inference_yml,
    db_inference_yml,
    export_inference,
    export_onnx,
    paddlex_cls_name,
    paddlex_det_name,
)
from zoo.export.precision import PRECISIONS, check_precision
from zoo.export.precision_report import check_summary

__all__ = ["export_from_config", "saved_dtypes"]


def _onnx_mode(value) -> str:
    mode = str(value).lower()  # YAML true/false arrive as bools; str(True).lower() == "true"
    if mode not in ("auto", "true", "false"):
        raise ExportError(f"export.onnx: expected auto, true or false, got {value!r}")
    return mode


def _layout(value, allowed: tuple[str, ...], default: str) -> str:
    layout = default if value in (None, "auto") else str(value)
    if layout not in allowed:
        raise ExportError(f"export.layout: expected auto or {' or '.join(allowed)} for this model, got {value!r}")
    return layout


def _ppyoloe_labels(cfg, builder, num_classes: int) -> list[str]:
    """``export.label_list``, else the class names of the data the model was trained on."""
    labels = cfg.export.get("label_list")
    if labels is None:
        try:
            labels = builder.class_names
        except (OSError, ValueError) as e:
            raise ExportError(f"export.label_list: not given, and the class names of data={cfg.data.name} "
                              f"cannot be read ({e}); pass export.label_list=[name, ...]") from None
    labels = [str(name) for name in labels]
    if len(labels) != num_classes:
        raise ExportError(f"export.label_list: {len(labels)} names for a model of {num_classes} classes")
    return labels


@dataclass
class _Plan:
    """What to export: the client yml, and ``write(out_dir, yml, precision)``."""

    yml: dict
    write: Callable
    model_name: str
    shape: list
    output: str
    prefix: str = INFERENCE_PREFIX
    layout: str = "paddlex"


def _normalization(cfg) -> tuple:
    task = cfg.model.task
    return task.get("mean", (0.485, 0.456, 0.406)), task.get("std", (0.229, 0.224, 0.225))


def _inference_plan(model, task, yml: dict, model_name: str, shape: list, output: str) -> _Plan:
    """``inference.*`` + ``inference.yml`` of ``task``'s deploy module (PaddleX / PaddleOCR / PaddleClas)."""
    def write(out_dir, yml, precision):
        return export_inference(model, out_dir, shape, yml, output, precision, deploy=task.deploy_module)
    return _Plan(yml, write, model_name, shape, output)


def _text_detection_plan(cfg, model, task) -> _Plan:
    """DB: the shrink map; the yml holds DetResizeForTest and DBPostProcess (model.task.postprocess)."""
    ex = cfg.export
    _layout(ex.get("layout"), ("paddlex",), "paddlex")
    model_name = ex.model_name or paddlex_det_name(str(cfg.model.name))
    yml = db_inference_yml(cfg.model.task.get("postprocess") or {}, model_name, *_normalization(cfg),
                           str(cfg.data.builder.get("channel_order", "BGR")), ex.limit_side_len, ex.limit_type)
    return _inference_plan(model, task, yml, model_name, list(ex.input_shape or [-1, 3, -1, -1]), "maps")


def _classification_plan(cfg, model, task) -> _Plan:
    """A classifier: softmax probabilities; PaddleClas's resize, crop and Topk in the yml."""
    ex = cfg.export
    _layout(ex.get("layout"), ("paddlex",), "paddlex")
    model_name = ex.model_name or paddlex_cls_name(str(cfg.model.name), model)
    if not model_name:
        raise ExportError(f"export.model_name: model {cfg.model.name} is not a ResNet, so no PaddleX "
                          "classification name follows from it; pass the one the client is given (it only "
                          "selects PaddleX's classifier; inference.yml holds the preprocessing), e.g. "
                          "export.model_name=ResNet18 (docs/export.md, Classification)")
    size = int(cfg.data.builder.image_size)
    yml = cls_inference_yml(model_name, size, cfg.data.builder.get("resize_size"), *_normalization(cfg),
                            num_classes=cfg.data.get("num_classes"))
    return _inference_plan(model, task, yml, model_name, list(ex.input_shape or [-1, 3, size, size]), "probs")


def _object_detection_plan(cfg, model, task) -> _Plan:
    """PP-YOLOE: preprocessing read off the data's eval transform, labels, NMS from model.task.nms."""
    ex = cfg.export
    layout = _layout(ex.get("layout"), tuple(LAYOUTS), "paddledetection")
    builder = build(cfg.data.builder, "data.builder")
    evt = builder.eval_transform  # what our evaluation feeds the network (BoxEvalTransform)
    model_name = ex.model_name or ppyoloe_model_name(str(cfg.model.name))
    labels = _ppyoloe_labels(cfg, builder, int(cfg.model.task.num_classes))
    nms = dict(cfg.model.task.get("nms") or {})
    infer_cfg = ppyoloe_infer_cfg(evt.eval_size, evt.mean, evt.std, labels, nms, ex.get("draw_threshold", 0.5),
                                  model_name, "BGR" if evt.bgr else "RGB")
    if ex.input_shape is not None:
        raise ExportError(f"export.input_shape: PP-YOLOE's is [-1, 3, S, S] with S = data.builder.eval_size "
                          f"({evt.eval_size}), got {list(ex.input_shape)}; set data.builder.eval_size instead")

    def write(out_dir, yml, precision):
        return export_ppyoloe(model, out_dir, evt.eval_size, yml, nms, layout, precision, deploy=task.deploy_module)
    return _Plan(infer_cfg, write, model_name, [-1, 3, evt.eval_size, evt.eval_size], "bbox, bbox_num",
                 LAYOUTS[layout][0], layout)


# How a model is exported for its clients, by its task's kind (the Task contract, zoo/tasks/base.py):
# the client yml, the input shape and the writer. What is saved around the network is the task's own
# ``deploy_module``. A new task family that is exported adds its row here.
EXPORTS: dict[str, Callable[..., _Plan]] = {
    "text_detection": _text_detection_plan,
    "classification": _classification_plan,
    "object_detection": _object_detection_plan,
}


def _task(cfg):
    """The task ``model.task`` builds, once its class is known to have an export row."""
    target = cfg.model.task.get("_target_")
    known = f"known kinds: {', '.join(sorted(EXPORTS))} (the rows of EXPORTS in zoo/export/from_config.py)"
    try:  # located through Hydra (its target policy applies), not called: an unknown kind builds nothing
        cls = build(cfg.model.task, "model.task", _partial_=True, _recursive_=False).func
    except ConfigError as e:
        reason = str(e).splitlines()[0]
        raise ExportError(f"model.task._target_: cannot locate {target!r} ({reason}); {known}") from None
    kind = getattr(cls, "kind", None)
    if kind not in EXPORTS:
        said = f"a task of kind {kind!r}" if kind else "a task that declares no kind (zoo/tasks/base.py)"
        raise ExportError(f"model.task._target_: {target!r} is {said}, which export does not know; {known}")
    return build(cfg.model.task, "model.task")


def saved_dtypes(prefix_path: Path) -> dict[str, int]:
    """How many saved tensors (parameters and BatchNorm statistics) of each dtype ``<prefix>.*`` holds."""
    state = paddle.jit.load(str(prefix_path)).state_dict()
    counts: dict[str, int] = {}
    for v in state.values():
        name = str(v.dtype).replace("paddle.", "")
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def _store(value, precision: str) -> str:
    store = str(value).lower()
    if store not in ("fp32", "low"):
        raise ExportError(f"export.store: expected fp32 or low, got {value!r}")
    return "fp32" if precision == "fp32" else store


def _onnx(ex, out_dir: Path, stored: str, prefix: str) -> tuple[Path | None, str]:
    mode = _onnx_mode(ex.onnx)
    if mode == "false":
        return None, "ONNX not requested (export.onnx=false)"
    if stored == "bf16":  # paddle2onnx 2.1.0 writes one, but ONNX's Conv has no bf16 type
        if mode == "true":
            raise ExportError("export.onnx=true: no ONNX for export.precision=bf16 (ONNX's Conv takes no "
                              "bfloat16; onnxruntime rejects the model paddle2onnx writes)")
        return None, "ONNX skipped: ONNX's Conv takes no bfloat16 (export.precision=bf16)"
    return export_onnx(out_dir, int(ex.opset), required=mode == "true", prefix=prefix)


def _load(cfg):
    """The model of ``cfg.model.net`` with ``cfg.run`` (or its older name ``cfg.weights``) loaded,
    and where its weights came from."""
    if cfg.model.net.get("name") not in zoo.list_models():
        raise ExportError(f"model.net.name: unknown model {cfg.model.net.get('name')!r}; "
                          f"known: {', '.join(zoo.list_models())}")
    seed_everything(cfg.seed)
    model = build(cfg.model.net, "model.net")
    fallback = (getattr(model, "pretrained_report", None) or {}).get("fallback_reason")
    source = "model initialisation" + (
        f" (pretrained_fallback={cfg.model.net.pretrained_fallback}: pretrained={cfg.model.net.pretrained} "
        "could not be downloaded)" if fallback
        else f" (pretrained={cfg.model.net.pretrained})" if cfg.model.net.get("pretrained") else " (random)")
    given = run_source(cfg, "weights")
    if given is None:  # the initialisation is what is exported
        announce_pretrained_fallback(model)
    else:
        key, value = given
        if not Path(value).exists():
            raise ExportError(f"{key}: {value} does not exist (a run folder, .pdckpt or .pdparams)")
        weights, source = resolve_weights(value, key)
        model = _fitting(cfg, model, weights, source)
        model.set_state_dict(weights)
    return model, source


def _fitting(cfg, model, weights: dict, source):
    """``model``, or the same network built without ``model.net.pretrained`` when only that one fits
    ``weights``: deploy-form pretrained weights switch a re-parameterisable network to its fused form
    (ppocrv5_mobile_det's default), and the given weights, which replace the initialisation anyway, may
    be of the training form."""
    try:
        check_fits(model, weights, source, f"model {cfg.model.name}")
        return model
    except CheckpointError:
        if not cfg.model.net.get("pretrained"):
            raise
        bare_cfg = cfg.model.net.copy()
        bare_cfg.pretrained = None
        bare = build(bare_cfg, "model.net")
        try:
            check_fits(bare, weights, source, f"model {cfg.model.name}")
        except CheckpointError:
            pass
        else:
            return bare
        raise


def export_from_config(cfg, out_dir, log=print, report_dir=None) -> dict:
    """tools/export.py's body: build ``cfg.model``, load ``cfg.weights``, check a low precision, export;
    returns the export record.

    ``cfg.run`` (older name ``cfg.weights``): a run folder, ``.pdckpt`` or ``.pdparams`` (as
    tools/eval.py; zoo/engine/from_run.py), or null for the
    model's own initialisation (``model.net.pretrained`` when set). ``cfg.export`` holds out_dir,
    input_shape, precision, store, guard, check, layout, onnx (auto|true|false), opset, model_name,
    limit_side_len, limit_type, label_list, draw_threshold (configs/export.yaml). For fp16 / bf16 the
    precision check runs first (zoo/export/checked_export.py); a refusal raises
    :class:`~zoo.export.precision_check.PrecisionRefused`, writes its report into ``report_dir`` (default: beside
    ``out_dir``) and leaves ``out_dir`` as it was.
    """
    check_numbers(cfg)  # the model's, amp's, ... numbers, as training checks them; export.check.*: CheckSettings
    ex = cfg.export
    _onnx_mode(ex.onnx)
    precision = check_precision(ex.get("precision", "fp32"))
    stored = _store(ex.get("store", "fp32"), precision)
    check = check_mode(ex.get("guard", "on"))
    model, source = _load(cfg)
    # The deploy form, before the precision check, so the check judges the network that is saved.
    model, fused = in_deploy_form(model)
    task = _task(cfg)
    plan = EXPORTS[task.kind](cfg, model, task)
    out_dir = Path(out_dir)
    report = None
    if precision != "fp32":
        refused_dir = Path(report_dir) if report_dir else out_dir.parent / "precision_refused"
        report = (run_precision_check(cfg, model, task, precision, refused_dir, log) if check
                  else skipped_report(precision))
        if stored == "low" and report.get("keep_fp32"):
            raise ExportError(f"export.store=low: the check keeps {report['keep_fp32']} fp32, which a file of "
                              "O2-cast weights cannot; use export.store=fp32 (the client converts at load)")
        report["stored_weights"] = PRECISIONS[precision if stored == "low" else "fp32"]
        plan.yml[YML_KEY] = yml_block(report)
    files = plan.write(out_dir, plan.yml, precision if stored == "low" else "fp32")
    if report is not None:
        files.append(write_report(report, out_dir))
        if (out_dir / PLOT).is_file():
            files.append(out_dir / PLOT)
    onnx_path, onnx_msg = _onnx(ex, out_dir, precision if stored == "low" else "fp32", plan.prefix)
    record = {"model": str(cfg.model.name), "paddlex_model_name": plan.model_name, "weights": source,
              "layout": plan.layout, "reparameterised_layers": fused,
              "input_shape": [int(d) for d in plan.shape], "output": plan.output,
              "precision": precision, "stored_weights": "float32" if stored == "fp32" else PRECISIONS[precision],
              "saved_dtypes": saved_dtypes(out_dir / plan.prefix),
              "files": [p.name for p in files] + ([onnx_path.name] if onnx_path else []), "onnx": onnx_msg,
              "precision_check": check_summary(report),
              "paddle_version": paddle.__version__, "git_revision": git_revision()}
    write_json(out_dir / "export.json", record)
    return record
