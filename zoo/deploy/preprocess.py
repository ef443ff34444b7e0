"""Image -> the model's feeds, as the client that reads this model folder would make them.

The steps come from the folder's own config when it has one, else from a named preset:

- ``inference.yml`` of PaddleOCR / PaddleX / PaddleClas: ``PreProcess.transform_ops``, a list of
  one-key maps (PaddleOCR ``ppocr/utils/export_model.py`` ``dump_infer_config``; the zoo writes it in
  ``zoo/export/inference.py``);
- ``infer_cfg.yml`` of PaddleDetection (or its ``inference.yml`` for PaddleX): ``Preprocess``, a list
  of maps with a ``type`` (``ppdet/engine/export_utils.py``; ``zoo/export/detection.py``).

Each op does what the upstream deploy code does (zoo/deploy/preprocess_ops.py names the file per op).
The model's feed names decide which arrays go out: the image as ``x`` or ``image``, and
``scale_factor`` / ``im_shape`` for PaddleDetection models.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from zoo.deploy.errors import DeployError
from zoo.deploy.preprocess_ops import DET_OPS, IGNORED_OPS, OCR_OPS, Step

__all__ = ["PRESETS", "TASK_KINDS", "Preprocess", "build_preprocess"]

TASK_KINDS = ("text_det", "text_rec", "text_cls", "det", "cls")
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
HALF = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}

# name -> (task kind, colour order the network expects, op list in the upstream yml's own layout,
# post-processing settings). Each follows the upstream client named in its comment.
PRESETS: dict[str, tuple[str, str, list, dict]] = {
    # PaddleOCR tools/infer/predict_det.py + tools/infer/utility.py defaults
    "paddleocr_det": ("text_det", "BGR", [
        {"DetResizeForTest": {"limit_side_len": 960, "limit_type": "max"}},
        {"NormalizeImage": {"scale": 1 / 255, **IMAGENET, "order": "hwc"}}, {"ToCHWImage": None}],
        {"name": "DBPostProcess", "thresh": 0.3, "box_thresh": 0.6, "max_candidates": 1000, "unclip_ratio": 1.5,
         "use_dilation": False, "score_mode": "fast", "box_type": "quad"}),
    # PaddleOCR tools/infer/predict_rec.py resize_norm_img (rec_image_shape "3, 48, 320")
    "paddleocr_rec": ("text_rec", "BGR", [{"RecResizeImg": {"image_shape": [3, 48, 320]}}],
                      {"name": "CTCLabelDecode", "use_space_char": True}),
    # PaddleOCR tools/infer/predict_cls.py resize_norm_img (cls_image_shape "3, 48, 192")
    "paddleocr_cls": ("text_cls", "BGR", [{"ClsResizeImg": {"image_shape": [3, 48, 192]}}],
                      {"name": "ClsPostProcess", "label_list": ["0", "180"]}),
    # PaddleDetection configs/ppyoloe/_base_/ppyoloe_plus_reader.yml TestReader -> infer_cfg.yml
    "ppyoloe": ("det", "RGB", [
        {"type": "Resize", "target_size": [640, 640], "keep_ratio": False, "interp": 2},
        {"type": "NormalizeImage", **IMAGENET, "is_scale": True, "norm_type": "mean_std"}, {"type": "Permute"}],
        {"draw_threshold": 0.5}),
    # PaddleClas deploy/configs/inference_cls.yaml
    "paddleclas": ("cls", "RGB", [
        {"ResizeImage": {"resize_short": 256}}, {"CropImage": {"size": 224}},
        {"NormalizeImage": {"scale": 1 / 255, **IMAGENET, "order": ""}}, {"ToCHWImage": None}],
        {"Topk": {"topk": 5}}),
}
IMAGE_FEEDS = ("x", "image")
EXTRA_FEEDS = ("scale_factor", "im_shape")


@dataclass
class Preprocess:
    """``steps`` applied in order to an image in ``color`` order; ``feed_names`` the model's inputs.

    ``postprocess`` carries the settings the same config gives the post-processing (DB thresholds,
    ``draw_threshold``, ``label_list``, ``character_dict``): ``zoo.deploy.tasks.build_task`` reads them.
    """
    steps: list[Step]
    color: str = "BGR"
    feed_names: tuple[str, ...] = ("x",)
    postprocess: dict = field(default_factory=dict)

    def for_feeds(self, names: Sequence[str]) -> "Preprocess":
        """A copy feeding the predictor's ``get_input_names()``; a name it cannot make is refused."""
        names = tuple(str(n) for n in names)
        unknown = [n for n in names if n not in IMAGE_FEEDS + EXTRA_FEEDS]
        images = [n for n in names if n in IMAGE_FEEDS]
        if unknown or len(images) != 1:
            raise DeployError(f"model inputs {list(names)}: expected one image input ({' or '.join(IMAGE_FEEDS)}) "
                              f"and optionally {', '.join(EXTRA_FEEDS)}; cannot make {unknown or 'one image'}")
        return replace(self, feed_names=names)

    def __call__(self, bgr: np.ndarray) -> tuple[dict[str, np.ndarray], dict]:
        """``(feeds, meta)``: each feed with batch dim 1; meta holds ``src_hw`` (original size),
        ``ratio_hw`` (resized / original), ``input_hw`` and whatever a step adds."""
        image = np.asarray(bgr)
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise DeployError(f"image: expected BGR uint8 [H, W, 3], got {image.dtype} {list(image.shape)}")
        if self.color == "RGB":
            image = image[:, :, ::-1]
        h, w = image.shape[:2]
        meta = {"src_hw": (h, w), "ratio_hw": (1.0, 1.0), "color": self.color}
        for step in self.steps:
            image, meta = step(image, meta)
        if image.ndim != 3 or image.shape[0] not in (1, 3):  # HWC left over: no ToCHWImage / Permute in the config
            raise DeployError(f"preprocess: the steps end with an array of shape {list(image.shape)}; expected CHW "
                              "(is ToCHWImage / Permute missing from the config?)")
        image = np.ascontiguousarray(image, dtype=np.float32)
        meta["input_hw"] = tuple(image.shape[1:])
        feeds = {}
        for name in self.feed_names:
            if name in IMAGE_FEEDS:
                feeds[name] = image[None]
            elif name == "scale_factor":
                feeds[name] = np.asarray([meta["ratio_hw"]], dtype=np.float32)
            else:  # im_shape: the resized size, before any padding (PaddleDetection's Resize)
                feeds[name] = np.asarray([meta.get("resized_hw", meta["input_hw"])], dtype=np.float32)
        return feeds, meta


def _steps(ops, path: str, table: Mapping, key_of) -> list[Step]:
    if not isinstance(ops, list):
        raise DeployError(f"{path}: expected a list of preprocessing ops, got {type(ops).__name__}")
    steps = []
    for op in ops:
        name, params = key_of(op)
        if name in IGNORED_OPS:
            continue
        if name not in table:
            raise DeployError(f"{path}: preprocessing op {name!r} is not supported; supported: "
                              f"{', '.join(sorted(table))} (ignored: {', '.join(sorted(IGNORED_OPS))})")
        try:
            steps.append(table[name](**(params or {})))
        except (TypeError, ValueError) as e:
            raise DeployError(f"{path}: op {name}: {e}") from None
    return steps


def _ocr_key(op):
    if not isinstance(op, Mapping) or len(op) != 1:
        raise DeployError(f"transform_ops: expected one-key maps like {{NormalizeImage: {{...}}}}, got {op!r}")
    name, params = next(iter(op.items()))
    return str(name), dict(params or {})


def _det_key(op):
    if not isinstance(op, Mapping) or "type" not in op:
        raise DeployError(f"Preprocess: expected maps with a 'type' key, got {op!r}")
    params = dict(op)
    return str(params.pop("type")), params


def _ocr_kind(cfg: Mapping, path: str) -> str:
    post = cfg.get("PostProcess") or {}
    name = str(post.get("name", "")) if isinstance(post, Mapping) else ""
    model = str((cfg.get("Global") or {}).get("model_name", ""))
    if name.startswith("DB") or model.endswith("_det"):
        return "text_det"
    if "CTC" in name or model.endswith("_rec"):
        return "text_rec"
    if name == "ClsPostProcess" or "textline_ori" in model or model.endswith("_cls"):
        return "text_cls"
    if isinstance(post, Mapping) and "Topk" in post:
        return "cls"
    raise DeployError(f"{path}: cannot tell the task from Global.model_name={model!r} and PostProcess "
                      f"{name or list(post)}; pass task= (one of {', '.join(TASK_KINDS)})")


def _from_yml(path: Path) -> tuple[str, str, list[Step], dict]:
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise DeployError(f"{path}: cannot read it as YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(cfg, Mapping):
        raise DeployError(f"{path}: expected a mapping at the top level")
    if "Preprocess" in cfg:  # PaddleDetection layout: decode to RGB (deploy/python/preprocess.py decode_image)
        post = {"draw_threshold": float(cfg.get("draw_threshold", 0.5)),
                "label_list": list(cfg.get("label_list") or []), "arch": cfg.get("arch")}
        return "det", "RGB", _steps(cfg["Preprocess"], f"{path}: Preprocess", DET_OPS, _det_key), post
    ops = (cfg.get("PreProcess") or {}).get("transform_ops")
    if ops is None:
        raise DeployError(f"{path}: expected PreProcess.transform_ops (PaddleOCR/PaddleX/PaddleClas) or "
                          "Preprocess (PaddleDetection)")
    kind = _ocr_kind(cfg, str(path))
    # PaddleOCR decodes BGR unless DecodeImage says RGB; PaddleClas's clients hand the network RGB
    color = "RGB" if kind == "cls" else "BGR"
    for op in ops:
        name, params = _ocr_key(op)
        if name == "DecodeImage":
            mode = params.get("img_mode", "RGB" if params.get("to_rgb", kind == "cls") else "BGR")
            if str(mode).upper() not in ("BGR", "RGB"):
                raise DeployError(f"{path}: DecodeImage.img_mode: expected BGR or RGB, got {mode!r}")
            color = str(mode).upper()
    steps = _steps(ops, f"{path}: PreProcess.transform_ops", OCR_OPS, _ocr_key)
    post = dict(cfg.get("PostProcess") or {})
    return kind, color, steps, post


def build_preprocess(model_dir, preset: str | None = None,
                     task: str | None = None) -> tuple[Preprocess, str, str]:
    """``(Preprocess, task_kind, source)`` for ``model_dir``: from ``preset`` when given, else from the
    folder's ``inference.yml`` / ``infer_cfg.yml``. ``task`` overrides the kind the config implies.
    ``source`` says in words where the steps came from."""
    model_dir = Path(model_dir)
    if preset is not None:
        if preset not in PRESETS:
            raise DeployError(f"preset={preset}: unknown; known: {', '.join(PRESETS)}")
        kind, color, ops, post = PRESETS[preset]
        table, key_of = (DET_OPS, _det_key) if kind == "det" else (OCR_OPS, _ocr_key)
        steps = _steps(ops, f"preset {preset}", table, key_of)
        source = f"preset {preset}"
        post = dict(post)
    else:
        found = [model_dir / n for n in ("inference.yml", "infer_cfg.yml") if (model_dir / n).is_file()]
        if not found:
            raise DeployError(f"{model_dir}: no inference.yml or infer_cfg.yml; pass preset= "
                              f"(one of {', '.join(PRESETS)})")
        kind, color, steps, post = _from_yml(found[0])
        source = str(found[0])
    if task is not None:
        if task not in TASK_KINDS:
            raise DeployError(f"task={task}: expected one of {', '.join(TASK_KINDS)}")
        source += f" (task={task} given, the config implies {kind})" if task != kind else ""
        kind = task
    feeds = ("image", "scale_factor") if kind == "det" else ("x",)
    return Preprocess(steps, color, feeds, post), kind, source
