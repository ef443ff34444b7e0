"""Deployment export: Paddle inference format + the yml PaddleOCR/PaddleX/PaddleDetection read, ONNX optional."""
from zoo.export.common import ExportError
from zoo.export.detection import PPYOLOE_MODEL_NAMES, PPYOLOEDeploy, export_ppyoloe, ppyoloe_infer_cfg
from zoo.export.from_config import export_from_config, saved_dtypes
from zoo.export.inference import (
    DEFAULT_DET_MODEL_NAME,
    DET_MODEL_NAMES,
    cls_inference_yml,
    db_inference_yml,
    det_resize_shape,
    export_inference,
    export_onnx,
    save_program,
)
from zoo.export.precision import PRECISIONS, cast_o2

__all__ = ["DEFAULT_DET_MODEL_NAME", "DET_MODEL_NAMES", "ExportError", "cls_inference_yml", "db_inference_yml",
           "det_resize_shape", "export_from_config", "export_inference", "export_onnx", "export_ppyoloe",
           "save_program", "PPYOLOE_MODEL_NAMES", "PPYOLOEDeploy", "ppyoloe_infer_cfg", "PRECISIONS", "cast_o2", "saved_dtypes"]
