"""Deployment export: Paddle inference format + the inference.yml PaddleOCR/PaddleX read, ONNX optional."""
from zoo.export.inference import (
    DEFAULT_DET_MODEL_NAME,
    DET_MODEL_NAMES,
    ExportError,
    cls_inference_yml,
    db_inference_yml,
    det_resize_shape,
    export_from_config,
    export_inference,
    export_onnx,
)

__all__ = ["DEFAULT_DET_MODEL_NAME", "DET_MODEL_NAMES", "ExportError", "cls_inference_yml", "db_inference_yml",
           "det_resize_shape", "export_from_config", "export_inference", "export_onnx"]
