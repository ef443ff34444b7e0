"""Export to Paddle's inference format with the ``inference.yml`` PaddleOCR/PaddleX predictors read.

Paddle >= 3 ``paddle.jit.save`` writes ``inference.json`` (PIR program) + ``inference.pdiparams``.
A PaddleX predictor (``paddleocr.TextDetection(model_name=..., model_dir=...)``) also needs
``inference.yml``: ``Global.model_name`` (must equal the ``model_name`` the client passes, and be a
name PaddleX knows), ``PreProcess.transform_ops`` and ``PostProcess`` (layout as PaddleOCR's
``ppocr/utils/export_model.py`` ``dump_infer_config``; PaddleClas's ``ppcls/utils/config.py``).

PP-YOLOE goes (zoo/export/detection.py) to PaddleDetection's deploy layout (``model.*`` + ``infer_cfg.yml``,
NMS in the graph) or, with ``export.layout=paddlex``, to ``inference.*`` + ``inference.yml``.
Weights are fp32 unless ``export.precision`` asks for fp16 / bf16 (zoo/export/precision.py).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import paddle
import yaml
from paddle import nn

from zoo.export.common import PRECISION_PLOT, PRECISION_REPORT, ExportError, floats, in_deploy_form
from zoo.data.text_det.transforms import limit_side_shape
from zoo.export.precision import in_precision
from zoo.postprocess import DBPostProcess
from zoo.tasks.classification import ClassifierProbs
from zoo.tasks.text_detection import DBProbabilityMap
from zoo.utils.stderr_filter import PIR_OUT_TENSOR_WARNING, dropping_stderr_lines

__all__ = ["DET_MODEL_NAMES", "DEFAULT_DET_MODEL_NAME", "LAYOUTS", "ExportError", "cls_inference_yml", "db_inference_yml", "det_resize_shape", "export_inference",
           "export_onnx", "paddlex_cls_name", "paddlex_det_name", "save_program"]

# paddlex 3.7.2 paddlex/modules/text_detection/model_list.py: every name a static DB-style
# detector may be served under. The name picks client defaults only (PP-OCRv3/v4/v5 *_det:
# DetResizeForTest limit_type "max", 960; the seal models: "min", 736); the network is ours.
DET_MODEL_NAMES = ("PP-OCRv3_mobile_det", "PP-OCRv3_server_det", "PP-OCRv4_mobile_det", "PP-OCRv4_server_det",
                   "PP-OCRv4_mobile_seal_det", "PP-OCRv4_server_seal_det", "PP-OCRv5_mobile_det",
                   "PP-OCRv5_server_det")
DEFAULT_DET_MODEL_NAME = "PP-OCRv4_mobile_det"
INFERENCE_PREFIX = "inference"   # PaddleX / PaddleOCR / PaddleClas file names (PaddleDetection --for_fd)
DEPLOY_PREFIX = "model"           # PaddleDetection's deploy layout: model.* + infer_cfg.yml
MODEL_EXTS = (".json", ".pdmodel", ".pdiparams", ".pdiparams.info")
ARTEFACTS = tuple(f"{prefix}{ext}" for prefix in (INFERENCE_PREFIX, DEPLOY_PREFIX) for ext in MODEL_EXTS + (".onnx",)) \
    + ("inference.yml", "infer_cfg.yml", "export.json", PRECISION_REPORT, PRECISION_PLOT)
LAYOUTS = {"paddlex": (INFERENCE_PREFIX, "inference.yml"), "paddledetection": (DEPLOY_PREFIX, "infer_cfg.yml")}
YML_HEADER = "# Written by ampzoo (tools/export.py); export.json says from what, and in which precision.\n"
DB_YML_NOTE = ("# PaddleX 3.7 ignores DetResizeForTest's limit_side_len/limit_type here: pass them to the\n"
              "# predictor (TextDetection(limit_side_len=..., limit_type=...)).\n")


def det_resize_shape(h: int, w: int, limit_side_len: int, limit_type: str,
                     max_side_limit: int = 4000) -> tuple[int, int]:
    """Network input (H, W) of DetResizeForTest's limit-side resize as PaddleX 3.7.2's predictor does it
    (``inference/models/text_detection/processors.py`` ``resize_image_type0``): the evaluation's
    :func:`zoo.data.text_det.transforms.limit_side_shape` with the long side capped at ``max_side_limit``."""
    try:
        return limit_side_shape(h, w, limit_side_len, limit_type, max_side_limit)
    except ValueError as e:
        raise ExportError(str(e)) from None


def _normalize_op(mean, std, order: str) -> dict:
    return {"NormalizeImage": {"scale": 1.0 / 255.0, "mean": floats(mean, "mean"), "std": floats(std, "std"),
                               "order": order}}


def db_inference_yml(postprocess: Mapping, model_name: str = DEFAULT_DET_MODEL_NAME,
                     mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), img_mode: str = "BGR",
                     limit_side_len: int = 960, limit_type: str = "max") -> dict:
    """inference.yml content for a DB detector: decode, DetResizeForTest, normalise, CHW; DBPostProcess.

    ``postprocess`` holds ``model.task.postprocess`` (thresh, box_thresh, max_candidates, unclip_ratio,
    use_dilation, score_mode, box_type); all are written, since PaddleX defaults a missing
    unclip_ratio to 2.0 and box_thresh to 0.6.
    """
    if model_name not in DET_MODEL_NAMES:
        raise ExportError(f"export.model_name: {model_name!r} is not a PaddleX text-detection name; "
                          f"known: {', '.join(DET_MODEL_NAMES)}")
    if img_mode not in ("BGR", "RGB"):
        raise ExportError(f"data.builder.channel_order: expected BGR or RGB, got {img_mode!r}")
    post = {"thresh": 0.3, "box_thresh": 0.6, "max_candidates": 1000, "unclip_ratio": 1.5,
            "use_dilation": False, "score_mode": "fast", "box_type": "quad"}
    unknown = sorted(set(postprocess) - set(post))
    if unknown:
        raise ExportError(f"model.task.postprocess: unknown keys {unknown}; known: {sorted(post)}")
    post.update({str(k): v for k, v in postprocess.items()})
    DBPostProcess(**post)  # same validation as our own post-processing
    post = {"thresh": float(post["thresh"]), "box_thresh": float(post["box_thresh"]),
            "max_candidates": int(post["max_candidates"]), "unclip_ratio": float(post["unclip_ratio"]),
            "use_dilation": bool(post["use_dilation"]), "score_mode": str(post["score_mode"]),
            "box_type": str(post["box_type"])}
    det_resize_shape(64, 64, int(limit_side_len), str(limit_type))  # validates limit_type
    ops = [{"DecodeImage": {"img_mode": img_mode, "channel_first": False}},
           {"DetResizeForTest": {"limit_side_len": int(limit_side_len), "limit_type": str(limit_type)}},
           _normalize_op(mean, std, "hwc"),
           {"ToCHWImage": None}]
    return {"Global": {"model_name": model_name}, "PreProcess": {"transform_ops": ops},
            "PostProcess": {"name": "DBPostProcess", **post}}


# The zoo's models that are PaddleOCR's own networks, served under their PaddleX names; every other DB
# gets DEFAULT_DET_MODEL_NAME (the name picks the client's defaults only).
PADDLEX_DET_NAMES = {"ppocrv5_mobile_det": "PP-OCRv5_mobile_det", "ppocrv4_mobile_det": "PP-OCRv4_mobile_det",
                     "ppocrv5_server_det": "PP-OCRv5_server_det"}


def paddlex_det_name(model_name: str) -> str:
    """PaddleX name a DB model of ours is exported under (``ppocrv5_mobile_det`` -> ``PP-OCRv5_mobile_det``)."""
    return PADDLEX_DET_NAMES.get(model_name, DEFAULT_DET_MODEL_NAME)


# PaddleX's ResNet classification models (paddlex/configs/modules/image_classification).
PADDLEX_RESNET_DEPTHS = (18, 34, 50, 101, 152, 200)


def paddlex_cls_name(model_name: str, net=None) -> str | None:
    """PaddleX/PaddleClas name of one of our ResNets (``resnet50_vd`` -> ``ResNet50_vd``), else, for
    another model built as a ResNet (``resnet_tiny``: depth 18, vd), the name of its depth and
    variant (``ResNet18_vd``), else None. The name only selects PaddleX's client (the yml holds the
    preprocessing), so a ResNet's own depth and variant is the natural choice."""
    m = re.fullmatch(r"resnet(\d+)(_vd)?", model_name)
    if m:
        return f"ResNet{m.group(1)}{m.group(2) or ''}"
    depth, variant = getattr(net, "depth", None), getattr(net, "variant", None)
    if depth in PADDLEX_RESNET_DEPTHS and variant in ("b", "vd"):
        return f"ResNet{depth}{'_vd' if variant == 'vd' else ''}"
    return None


def cls_inference_yml(model_name: str, image_size: int, resize_size: int | None = None,
                      mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), topk: int = 5,
                      num_classes: int | None = None) -> dict:
    """PaddleClas-style inference.yml: resize short side, centre crop, normalise (RGB), CHW; Topk."""
    resize_size = int(resize_size or image_size)
    if int(image_size) <= 0 or resize_size < int(image_size):
        raise ExportError(f"data.builder: need 0 < image_size <= resize_size, got {image_size}, {resize_size}")
    normalize = _normalize_op(mean, std, "")
    normalize["NormalizeImage"]["channel_num"] = 3
    ops = [{"ResizeImage": {"resize_short": resize_size}}, {"CropImage": {"size": int(image_size)}},
           normalize, {"ToCHWImage": None}]
    topk = min(int(topk), int(num_classes)) if num_classes else int(topk)
    return {"Global": {"model_name": model_name}, "PreProcess": {"transform_ops": ops},
            "PostProcess": {"Topk": {"topk": topk}}}


def _check_shape(input_shape: Sequence) -> list[int]:
    try:
        shape = [int(d) for d in input_shape]
    except (TypeError, ValueError):
        raise ExportError(f"export.input_shape: expected a list of ints like [-1, 3, -1, -1], "
                          f"got {input_shape!r}") from None
    if len(shape) != 4 or shape[1] <= 0 or any(d == 0 or d < -1 for d in shape):
        raise ExportError(f"export.input_shape: expected [N, C, H, W] with C > 0 and -1 for a free size, "
                          f"got {shape}")
    return shape


def _clear(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ARTEFACTS:  # a stale file of an earlier export must not sit beside this one
        (out_dir / name).unlink(missing_ok=True)


def _low_precision_error(precision: str, err: Exception) -> ExportError:
    """One line saying which op this Paddle build cannot build in ``precision``."""
    found = re.search(r"Check data type error for op: (\w+), input: (\w+), \w+\.dtype: (\w+), and expected_dtype: "
                      r"([\w, ]+?),?\s*\(", str(err))
    what = (f"op {found.group(1)} has no {found.group(3)} kernel in this Paddle {paddle.__version__} build "
            f"(its {found.group(2)} accepts {found.group(4).strip()})") if found else str(err).strip().splitlines()[-1]
    return ExportError(f"export.precision={precision}: Paddle cannot build the program: {what}; a CPU build has "
                       f"no fp16 kernels and few bf16 ones, so build this export with a GPU build of Paddle "
                       f"(docs/export.md)")


def save_program(layer: nn.Layer, model: nn.Layer, out_dir, specs: Sequence, prefix: str = INFERENCE_PREFIX,
                 yml: Mapping | None = None, yml_name: str = "inference.yml", precision: str = "fp32") -> list[Path]:
    """``paddle.jit.save(layer)`` as ``out_dir/<prefix>.{json,pdiparams}`` plus the client yml.

    ``layer`` wraps ``model`` (built by the callers below); ``model`` is switched to eval mode for the
    export and its training flag restored. ``precision`` is ``fp32``, ``fp16`` or ``bf16``: for the
    low ones ``layer`` must already hold :func:`zoo.export.precision.cast_o2`'s copy.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    # Saved beside, then moved in: a failed export leaves an earlier one in out_dir untouched.
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".export-") as tmp:
        try:
            # Paddle's own `x + y` in PIR mode makes glog warn about an `out` tensor (zoo/utils/stderr_filter.py)
            with dropping_stderr_lines([PIR_OUT_TENSOR_WARNING]):
                paddle.jit.save(layer, str(Path(tmp) / prefix), input_spec=list(specs))
        except (TypeError, ValueError) as e:
            if precision != "fp32" and "Check data type error" in str(e):
                raise _low_precision_error(precision, e) from None
            raise
        finally:
            if was_training:
                model.train()
        _clear(out_dir)
        for name in os.listdir(tmp):
            os.replace(Path(tmp) / name, out_dir / name)
    written = [out_dir / f"{prefix}{ext}" for ext in MODEL_EXTS if (out_dir / f"{prefix}{ext}").is_file()]
    if yml is not None:
        path = out_dir / yml_name
        note = DB_YML_NOTE if "PreProcess" in yml and "DetResizeForTest" in str(yml["PreProcess"]) else ""
        path.write_text(YML_HEADER + note + yaml.safe_dump(dict(yml), sort_keys=False), encoding="utf-8")
        written.append(path)
    return written


def fp32_model(model: nn.Layer) -> nn.Layer:
    if any(p.is_floating_point() and p.dtype != paddle.float32 for p in model.parameters()):
        model.to(dtype="float32")  # a decorated O2 model: cast in place, export from fp32 weights
    return model


# What a direct caller names by ``output``; tools/export.py passes the task's deploy module instead.
_OUTPUT_WRAPPERS = {"maps": DBProbabilityMap, "probs": ClassifierProbs, "raw": lambda net: net}


def export_inference(model: nn.Layer, out_dir, input_shape: Sequence, infer_yml: Mapping | None = None,
                     output: str = "maps", precision: str = "fp32",
                     deploy: Callable[[nn.Layer], nn.Layer] | None = None) -> list[Path]:
    """Save ``model`` (eval mode) as ``out_dir/inference.{json,pdiparams}`` plus ``inference.yml``.

    ``deploy`` wraps the network in what is saved (a task's ``deploy_module``, zoo/tasks). Without it
    ``output`` picks the wrapper: ``"maps"`` (DB: the shrink map tensor), ``"probs"`` (classifier +
    softmax) or ``"raw"``.
    ``precision``: ``fp32``, ``fp16`` or ``bf16`` weights (zoo/export/precision.py); inputs and
    outputs stay float32. A network with re-parameterisable layers (PP-OCRv4/v5's PPLCNetV3) is saved
    in its deploy form, from a ``rep()``'d copy (:func:`~zoo.export.common.in_deploy_form`); ``model``
    itself keeps its form. Earlier export files in ``out_dir`` (:data:`ARTEFACTS`) are removed first.
    The model's training flag is restored afterwards. Returns the written files.
    """
    if deploy is None and output not in _OUTPUT_WRAPPERS:
        raise ExportError(f"output: expected one of {sorted(_OUTPUT_WRAPPERS)}, got {output!r}")
    shape = _check_shape(input_shape)
    model, _ = in_deploy_form(fp32_model(model))  # PP-OCRv4/v5: a rep()'d copy, as PaddleOCR exports
    spec = paddle.static.InputSpec(shape=shape, dtype="float32", name="x")
    wrap = deploy or _OUTPUT_WRAPPERS[output]
    layer = wrap(in_precision(model, precision))  # a low-precision copy is in eval mode
    return save_program(layer, model, out_dir, [spec], INFERENCE_PREFIX, infer_yml, "inference.yml", precision)


def export_onnx(out_dir, opset: int = 11, required: bool = False,
                prefix: str = INFERENCE_PREFIX) -> tuple[Path | None, str]:
    """Convert ``out_dir/<prefix>.*`` to ``out_dir/<prefix>.onnx`` with paddle2onnx, if installed.

    Returns ``(path or None, message)``. Without paddle2onnx, or when the conversion fails,
    ``required`` raises; otherwise the message says why there is no ONNX file. paddle2onnx runs in
    a child process because it calls ``sys.exit`` on a failed conversion.
    """
    try:
        import paddle2onnx
    except ImportError:
        msg = "ONNX skipped: paddle2onnx is not installed (pip install paddle2onnx)"
        if required:
            raise ExportError(f"export.onnx=true: {msg}") from None
        return None, msg
    out_dir = Path(out_dir)
    model_file = next((out_dir / f"{prefix}{ext}" for ext in (".json", ".pdmodel")
                       if (out_dir / f"{prefix}{ext}").is_file()), None)
    if model_file is None:
        raise ExportError(f"{out_dir}: no {prefix}.json / {prefix}.pdmodel to convert")
    target = out_dir / f"{prefix}.onnx"
    version = getattr(paddle2onnx, "__version__", "?")
    code = ("import sys, paddle2onnx; "
            "paddle2onnx.export(sys.argv[1], sys.argv[2], sys.argv[3], opset_version=int(sys.argv[4]))")
    proc = subprocess.run([sys.executable, "-c", code, str(model_file), str(out_dir / f"{prefix}.pdiparams"),
                           str(target), str(int(opset))], capture_output=True, text=True,
                          # paddle2onnx's optimiser (Polygraphy) may otherwise pip-install packages itself
                          env={**os.environ, "POLYGRAPHY_AUTOINSTALL_DEPS": "0"})
    if proc.returncode == 0 and target.is_file():
        return target, f"ONNX written: {target} (paddle2onnx {version}, opset {opset})"
    lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr).splitlines() if ln.strip()]
    reason = next((ln for ln in lines if "ERROR" in ln or "Error" in ln), lines[-1] if lines else "no output")
    msg = f"ONNX conversion failed (paddle2onnx {version}, exit {proc.returncode}): {reason}"
    if required:
        raise ExportError(f"export.onnx=true: {msg}")
    return None, msg + "; the Paddle inference files are complete"
