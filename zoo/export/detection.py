"""PP-YOLOE export in PaddleDetection's deploy layout: NMS in the graph, ``infer_cfg.yml`` beside it.

What must match upstream, and where upstream says it (PaddleDetection, ``develop``):

- inputs ``image`` [N, 3, S, S] and ``scale_factor`` [N, 2] (scale_y, scale_x = resized / original).
  Upstream exports ``image``, ``im_shape`` and ``scale_factor`` and lets ``paddle.jit.save`` prune the
  unused ones; a PP-YOLOE uses only ``image`` and ``scale_factor`` (``ppdet/engine/trainer.py``
  ``_get_infer_cfg_and_input_spec``; ``ppdet/modeling/heads/ppyoloe_head.py`` ``post_process``).
- outputs ``bbox`` [K, 6] = (class, score, x1, y1, x2, y2) in original-image pixels and
  ``bbox_num`` [N] int32, in that order (``ppdet/modeling/architectures/yolo.py``; clients read
  output 0 and 1: ``deploy/python/infer.py`` ``Detector.predict``).
- NMS is Paddle's ``multiclass_nms3`` (``ppdet/modeling/ops.py``), ``normalized=True``,
  ``nms_eta=1``, no background class (``ppdet/modeling/layers.py`` ``MultiClassNMS``).
- ``infer_cfg.yml`` keys as ``ppdet/engine/export_utils.py`` ``_dump_infer_config``; ``arch: YOLO``
  (upstream's PP-YOLOE configs use ``architecture: YOLOv3``), ``min_subgraph_size: 3``; Preprocess
  from the TestReader (``configs/ppyoloe/_base_/ppyoloe_reader.yml``).

One difference from upstream's graph, on purpose: boxes are clipped to the original image before
NMS, as our evaluation (``zoo.tasks.PPYOLOETask.predict``) does, so that the export gives the boxes
our mAP was measured with. PaddleX and PaddleDetection's clients clip after NMS anyway.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import paddle
from paddle import nn

from zoo.export.common import ExportError, floats, in_deploy_form
from zoo.export.inference import LAYOUTS, fp32_model, save_program
from zoo.export.precision import in_precision
from zoo.tasks.object_detection import PPYOLOEDeploy, nms_settings

__all__ = ["PPYOLOE_MODEL_NAMES", "PPYOLOEDeploy", "export_ppyoloe", "ppyoloe_infer_cfg", "ppyoloe_model_name"]

# paddlex 3.7.2 paddlex/modules/object_detection/model_list.py: the PP-YOLOE names whose predictor
# feeds (image, scale_factor) only (object_detection/predictor.py build_to_batch). The name picks
# client behaviour only; the network is ours.
PPYOLOE_MODEL_NAMES = ("PP-YOLOE_plus-S", "PP-YOLOE_plus-M", "PP-YOLOE_plus-L", "PP-YOLOE_plus-X",
                       "PP-YOLOE-S_human", "PP-YOLOE-L_human", "PP-YOLOE-S_vehicle", "PP-YOLOE-L_vehicle")


def ppyoloe_model_name(model_name: str) -> str:
    """PaddleX name for one of our PP-YOLOEs: ``ppyoloe_m`` -> ``PP-YOLOE_plus-M`` (tiny -> S)."""
    size = {"s": "S", "m": "M", "l": "L", "x": "X"}.get(model_name.rsplit("_", 1)[-1], "S")
    return f"PP-YOLOE_plus-{size}"


def ppyoloe_infer_cfg(eval_size: int, mean: Sequence, std: Sequence, label_list: Sequence[str],
                      nms: Mapping | None = None, draw_threshold: float = 0.5,
                      model_name: str = "PP-YOLOE_plus-S", channel_order: str = "RGB") -> dict:
    """``infer_cfg.yml`` content (PaddleDetection deploy / PaddleX ``inference.yml``) of a PP-YOLOE.

    Preprocess is our eval transform (``zoo.data.coco.transforms.BoxEvalTransform``): Resize to
    [S, S] without keeping the ratio, cubic (interp 2); NormalizeImage on pixel / 255; Permute.
    Both clients decode RGB, as our data does by default; a model trained on BGR is refused.
    ``NMS`` records the settings the graph already applies (the clients do not run it again).
    """
    if channel_order != "RGB":
        raise ExportError(f"data.builder.channel_order: {channel_order!r}, but PaddleDetection's and PaddleX's "
                          "detection clients decode RGB; export a model trained on RGB")
    if model_name not in PPYOLOE_MODEL_NAMES:
        raise ExportError(f"export.model_name: {model_name!r} is not a PaddleX PP-YOLOE name; "
                          f"known: {', '.join(PPYOLOE_MODEL_NAMES)}")
    if int(eval_size) <= 0 or int(eval_size) % 32:
        raise ExportError(f"data.builder.eval_size: PP-YOLOE needs a positive multiple of 32, got {eval_size}")
    if not 0.0 <= float(draw_threshold) <= 1.0:
        raise ExportError(f"export.draw_threshold: expected a score in [0, 1], got {draw_threshold}")
    size = int(eval_size)
    return {
        "mode": "paddle",
        "draw_threshold": float(draw_threshold),
        "metric": "COCO",
        "use_dynamic_shape": False,
        "Global": {"model_name": model_name},
        "arch": "YOLO",
        "min_subgraph_size": 3,
        "Preprocess": [
            {"type": "Resize", "interp": 2, "keep_ratio": False, "target_size": [size, size]},
            {"type": "NormalizeImage", "is_scale": True, "mean": floats(mean, "mean"), "std": floats(std, "std")},
            {"type": "Permute"},
        ],
        "label_list": [str(name) for name in label_list],
        "NMS": {"name": "MultiClassNMS", **nms_settings(nms, ExportError), "nms_eta": 1.0, "background_label": -1,
                "normalized": True, "in_graph": True},
    }


def export_ppyoloe(model: nn.Layer, out_dir, eval_size: int, infer_cfg: Mapping | None = None,
                   nms: Mapping | None = None, layout: str = "paddledetection", precision: str = "fp32",
                   deploy: Callable[[nn.Layer], nn.Layer] | None = None) -> list[Path]:
    """Save a PP-YOLOE with NMS in the graph (:class:`~zoo.tasks.object_detection.PPYOLOEDeploy`) in
    ``layout``:

    ``paddledetection``: ``model.{json,pdiparams}`` + ``infer_cfg.yml`` (``tools/export_model.py``);
    ``paddlex``: ``inference.{json,pdiparams}`` + ``inference.yml`` (upstream's ``--for_fd``), which
    PaddleX's object-detection predictor reads. Inputs ``image`` [-1, 3, S, S], ``scale_factor`` [-1, 2].
    ``deploy`` wraps the network (the task's ``deploy_module``); by default ``PPYOLOEDeploy(net, nms)``.
    """
    if layout not in LAYOUTS:
        raise ExportError(f"export.layout: expected one of {', '.join(LAYOUTS)} for PP-YOLOE, got {layout!r}")
    size = int(eval_size)
    model, _ = in_deploy_form(fp32_model(model))  # re-parameterisable layers fused, as for DB
    layer = (deploy or partial(PPYOLOEDeploy, nms=nms))(in_precision(model, precision))
    specs = [paddle.static.InputSpec([-1, 3, size, size], "float32", "image"),
             paddle.static.InputSpec([-1, 2], "float32", "scale_factor")]
    prefix, yml_name = LAYOUTS[layout]
    return save_program(layer, model, out_dir, specs, prefix, infer_cfg, yml_name, precision)
