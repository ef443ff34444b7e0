"""Small helpers shared by the tasks: batch values to NumPy, config kwargs, eval-mode prediction,
and undoing the input normalisation for drawings."""
from __future__ import annotations

from collections.abc import Mapping

import cv2
import numpy as np
import paddle


def as_numpy(x) -> np.ndarray:
    return x.numpy() if isinstance(x, paddle.Tensor) else np.asarray(x)


def task_kwargs(node, key: str) -> dict:
    """Plain dict from None / dict / DictConfig (Hydra passes nested config nodes through)."""
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise TypeError(f"model.task.{key}: expected a mapping of keyword arguments, got {node!r}")
    return {str(k): v for k, v in node.items()}


def predict_in_eval_mode(task, model, batch):
    """``task.predict`` with the model in eval mode, its previous mode restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        return task.predict(model, batch)
    finally:
        if was_training:
            model.train()


class Denormalize:
    """Undo NormalizeImage ``(x / 255 - mean) / std`` of a CHW image: a viewable uint8 HWC BGR image.

    ``rgb``: the network input is RGB (converted to BGR for OpenCV); PaddleOCR's DB input is BGR.
    """

    def __init__(self, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), rgb: bool = False):
        self.mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
        self.rgb = bool(rgb)

    def __call__(self, image_chw: np.ndarray) -> np.ndarray:
        image = (image_chw.astype(np.float32) * self.std + self.mean) * 255.0
        image = np.clip(np.round(image), 0, 255).astype(np.uint8).transpose(1, 2, 0)
        return cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if self.rgb else np.ascontiguousarray(image)
