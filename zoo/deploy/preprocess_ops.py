"""The preprocessing ops a deploy config may name, each doing what its upstream deploy code does.

PaddleOCR / PaddleClas / PaddleX (``inference.yml`` ``transform_ops``):
- ``DetResizeForTest``: PaddleOCR ``ppocr/data/imaug/operators.py`` (limit-side resize, each side
  rounded to a multiple of 32; images with h + w < 64 zero-padded to 32 first); the size rule is
  ``zoo.export.inference.det_resize_shape``;
- ``NormalizeImage`` / ``ToCHWImage``: the same file and PaddleClas ``deploy/python/preprocess.py``:
  ``(x * scale - mean) / std`` in float32;
- ``ResizeImage`` (``resize_short`` or ``size``), ``CropImage`` (centre): PaddleClas
  ``deploy/python/preprocess.py``, cv2 backend;
- ``RecResizeImg``: PaddleOCR ``tools/infer/predict_rec.py`` ``resize_norm_img`` for a batch of one
  (width ``int(H * max(W0 / H, w / h))``, image resized to height H keeping its ratio, zeros on the
  right, ``(x / 255 - 0.5) / 0.5``); ``ClsResizeImg``: ``tools/infer/predict_cls.py`` (fixed width).

PaddleDetection (``infer_cfg.yml`` ``Preprocess``), ``deploy/python/preprocess.py``: ``Resize``
(``keep_ratio``, ``interp``; gives ``scale_factor``), ``NormalizeImage`` (``is_scale``, ``norm_type``),
``Permute``, ``PadStride``.

Ops that only carry training labels (``KeepKeys``, ``*LabelEncode``) are skipped.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import cv2
import numpy as np

from zoo.export.inference import det_resize_shape

__all__ = ["DET_OPS", "IGNORED_OPS", "OCR_OPS", "Step"]

IGNORED_OPS = frozenset({"KeepKeys", "MultiLabelEncode", "CTCLabelEncode", "ClsLabelEncode", "DetLabelEncode",
                         "NRTRLabelEncode", "SARLabelEncode"})
CV2_INTERP = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA,
              "bicubic": cv2.INTER_CUBIC, "lanczos": cv2.INTER_LANCZOS4}


class Step:
    """One op: ``(image, meta) -> (image, meta)``; ``meta`` gathers what post-processing needs."""
    name = ""

    def __call__(self, image: np.ndarray, meta: dict) -> tuple[np.ndarray, dict]:
        raise NotImplementedError


def _scale(value) -> np.float32:
    """``scale`` as a number; the ymls write it as ``1./255.`` strings too (upstream eval()s them)."""
    if isinstance(value, str):
        parts = value.replace(" ", "").split("/")
        try:
            num = float(Fraction(parts[0].rstrip("."))) if parts[0] else 1.0
            den = float(Fraction(parts[1].rstrip("."))) if len(parts) == 2 else 1.0
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"scale: expected a number or 'a/b', got {value!r}") from None
        if len(parts) > 2:
            raise ValueError(f"scale: expected a number or 'a/b', got {value!r}")
        value = num / den
    return np.float32(1.0 / 255.0 if value is None else value)


def _triple(values, what: str) -> list[float]:
    values = [float(v) for v in values]
    if len(values) != 3:
        raise ValueError(f"{what}: expected 3 values, got {values}")
    return values


class DecodeImage(Step):
    """Colour order only (read once into Preprocess.color); the image is decoded already."""
    name = "DecodeImage"

    def __init__(self, img_mode: str = "BGR", channel_first: bool = False, **_):
        if channel_first:
            raise ValueError("channel_first: true is not supported (expected false, as inference clients use)")

    def __call__(self, image, meta):
        return image, meta


class DetResizeForTest(Step):
    name = "DetResizeForTest"

    def __init__(self, limit_side_len: int = 736, limit_type: str = "min", resize_long: int | None = None,
                 max_side_limit: int = 4000, **extra):
        if "image_shape" in extra:
            raise ValueError("image_shape (fixed-size resize) is not supported; expected limit_side_len/limit_type")
        if resize_long is not None:
            limit_side_len, limit_type = resize_long, "resize_long"
        if limit_type not in ("max", "min", "resize_long"):
            raise ValueError(f"limit_type: expected max, min or resize_long, got {limit_type!r}")
        self.limit_side_len, self.limit_type, self.max_side_limit = int(limit_side_len), limit_type, int(max_side_limit)

    def __call__(self, image, meta):
        h0, w0 = image.shape[:2]
        if h0 + w0 < 64:  # upstream pads tiny images with zeros to at least 32 x 32 first
            padded = np.zeros((max(32, h0), max(32, w0), image.shape[2]), dtype=image.dtype)
            padded[:h0, :w0] = image
            image = padded
        h, w = image.shape[:2]
        rh, rw = det_resize_shape(h, w, self.limit_side_len, self.limit_type, self.max_side_limit)
        image = cv2.resize(image, (rw, rh))
        return image, {**meta, "ratio_hw": (rh / h, rw / w), "resized_hw": (rh, rw)}


class NormalizeImage(Step):
    name = "NormalizeImage"

    def __init__(self, scale=None, mean=None, std=None, order: str = "chw", channel_num: int = 3, **_):
        if int(channel_num) != 3:
            raise ValueError(f"channel_num: expected 3, got {channel_num}")
        shape = (3, 1, 1) if order == "chw" else (1, 1, 3)
        self.scale = _scale(scale)
        self.mean = np.array(_triple(mean or [0.485, 0.456, 0.406], "mean"), dtype=np.float32).reshape(shape)
        self.std = np.array(_triple(std or [0.229, 0.224, 0.225], "std"), dtype=np.float32).reshape(shape)

    def __call__(self, image, meta):
        return (image.astype(np.float32) * self.scale - self.mean) / self.std, meta


class ToCHWImage(Step):
    name = "ToCHWImage"

    def __init__(self, **_):
        pass

    def __call__(self, image, meta):
        return image.transpose(2, 0, 1), meta


def _interp(value) -> int:
    if value is None:
        return cv2.INTER_LINEAR
    if isinstance(value, str):
        if value.lower() not in CV2_INTERP:
            raise ValueError(f"interpolation: expected one of {', '.join(CV2_INTERP)}, got {value!r}")
        return CV2_INTERP[value.lower()]
    return int(value)


class ResizeImage(Step):
    name = "ResizeImage"

    def __init__(self, size=None, resize_short=None, interpolation=None, backend: str = "cv2", **_):
        if str(backend).lower() != "cv2":
            raise ValueError(f"backend: only cv2 is supported, got {backend!r}")
        if resize_short is None and size is None:
            raise ValueError("expected resize_short or size")
        self.resize_short = int(resize_short) if resize_short else None
        self.wh = None if self.resize_short else ((int(size), int(size)) if np.isscalar(size) else
                                                  (int(size[0]), int(size[1])))
        self.interp = _interp(interpolation)

    def __call__(self, image, meta):
        h, w = image.shape[:2]
        if self.resize_short:
            percent = self.resize_short / min(w, h)
            size = (int(round(w * percent)), int(round(h * percent)))
        else:
            size = self.wh
        resized = cv2.resize(image, size, interpolation=self.interp)
        return resized, {**meta, "ratio_hw": (size[1] / h, size[0] / w), "resized_hw": (size[1], size[0])}


class CropImage(Step):
    name = "CropImage"

    def __init__(self, size, **_):
        self.wh = (int(size), int(size)) if np.isscalar(size) else (int(size[0]), int(size[1]))

    def __call__(self, image, meta):
        (w, h), (ih, iw) = self.wh, image.shape[:2]
        if ih < h or iw < w:
            raise ValueError(f"CropImage: the image is {ih}x{iw}, smaller than the {h}x{w} crop")
        top, left = (ih - h) // 2, (iw - w) // 2
        return image[top:top + h, left:left + w], {**meta, "crop_tl": (top, left)}


def _pad_right_norm(image: np.ndarray, shape: Sequence[int], width: int) -> tuple[np.ndarray, int]:
    """Resize to height H keeping the ratio (at most ``width``), ``(x / 255 - 0.5) / 0.5``, zeros right."""
    c, height = int(shape[0]), int(shape[1])
    if c != image.shape[2]:
        raise ValueError(f"image_shape: {c} channels, but the image has {image.shape[2]}")
    h, w = image.shape[:2]
    resized_w = min(width, int(math.ceil(height * w / float(h))))
    resized = cv2.resize(image, (resized_w, height)).astype(np.float32)
    resized = resized.transpose(2, 0, 1) / 255
    resized = (resized - 0.5) / 0.5
    out = np.zeros((c, height, width), dtype=np.float32)
    out[:, :, :resized_w] = resized
    return out, resized_w


class RecResizeImg(Step):
    name = "RecResizeImg"

    def __init__(self, image_shape, **_):
        self.shape = [int(v) for v in image_shape]
        if len(self.shape) != 3:
            raise ValueError(f"image_shape: expected [C, H, W], got {image_shape}")

    def __call__(self, image, meta):
        c, height, width = self.shape
        h, w = image.shape[:2]
        # the batch's widest ratio, never below the configured W/H; one image here
        batch_w = int(height * max(width / height, w / float(h)))
        out, valid = _pad_right_norm(image, self.shape, batch_w)
        return out, {**meta, "ratio_hw": (height / h, valid / w), "valid_width": valid}


class ClsResizeImg(RecResizeImg):
    name = "ClsResizeImg"

    def __call__(self, image, meta):
        h, w = image.shape[:2]
        out, valid = _pad_right_norm(image, self.shape, self.shape[2])
        return out, {**meta, "ratio_hw": (self.shape[1] / h, valid / w), "valid_width": valid}


class Resize(Step):
    """PaddleDetection's Resize: ``scale_factor`` = (resized / original) per axis."""
    name = "Resize"

    def __init__(self, target_size, keep_ratio: bool = True, interp: int = cv2.INTER_LINEAR, **_):
        self.target = [int(target_size)] * 2 if np.isscalar(target_size) else [int(v) for v in target_size]
        if len(self.target) != 2 or min(self.target) <= 0:
            raise ValueError(f"target_size: expected [h, w] > 0, got {target_size}")
        self.keep_ratio, self.interp = bool(keep_ratio), int(interp)

    def __call__(self, image, meta):
        h, w = image.shape[:2]
        if self.keep_ratio:
            scale = min(self.target) / min(h, w)
            if np.round(scale * max(h, w)) > max(self.target):
                scale = max(self.target) / max(h, w)
            sy = sx = scale
        else:
            sy, sx = self.target[0] / h, self.target[1] / w
        image = cv2.resize(image, None, None, fx=sx, fy=sy, interpolation=self.interp)
        ratio = tuple(float(v) for v in np.array([sy, sx], dtype=np.float32))
        return image, {**meta, "ratio_hw": ratio, "resized_hw": image.shape[:2]}


class DetNormalizeImage(Step):
    """PaddleDetection's NormalizeImage: optional /255, then mean/std unless ``norm_type: none``."""
    name = "NormalizeImage"

    def __init__(self, mean=None, std=None, is_scale: bool = True, norm_type: str = "mean_std", **_):
        if norm_type not in ("mean_std", "none"):
            raise ValueError(f"norm_type: expected mean_std or none, got {norm_type!r}")
        self.mean = np.array(_triple(mean or [0.485, 0.456, 0.406], "mean"))[None, None, :]
        self.std = np.array(_triple(std or [0.229, 0.224, 0.225], "std"))[None, None, :]
        self.is_scale, self.norm_type = bool(is_scale), norm_type

    def __call__(self, image, meta):
        image = image.astype(np.float32)
        if self.is_scale:
            image *= np.float32(1.0 / 255.0)
        if self.norm_type == "mean_std":
            image -= self.mean   # float64 constants into a float32 array, as upstream
            image /= self.std
        return image, meta


class Permute(Step):
    name = "Permute"

    def __init__(self, **_):
        pass

    def __call__(self, image, meta):
        return image.transpose(2, 0, 1).copy(), meta


class PadStride(Step):
    name = "PadStride"

    def __init__(self, stride: int = 0, **_):
        self.stride = int(stride)

    def __call__(self, image, meta):
        if self.stride <= 0:
            return image, meta
        c, h, w = image.shape
        ph, pw = (int(math.ceil(v / self.stride) * self.stride) for v in (h, w))
        out = np.zeros((c, ph, pw), dtype=np.float32)
        out[:, :h, :w] = image
        return out, meta


OCR_OPS = {op.name: op for op in (DecodeImage, DetResizeForTest, NormalizeImage, ToCHWImage, ResizeImage,
                                  CropImage, RecResizeImg, ClsResizeImg)}
DET_OPS = {op.name: op for op in (Resize, DetNormalizeImage, Permute, PadStride)}
