"""Deterministic box-detection transforms for PP-YOLOE training and evaluation.

Follows PaddleDetection ``configs/ppyoloe/_base_/ppyoloe_reader.yml``: train
``RandomDistort -> RandomExpand (fill = mean * 255) -> RandomCrop -> RandomFlip``
then one resize and ``NormalizeImage`` + ``Permute``. With multi-scale that one resize is
``BatchRandomResize``'s, from the crop straight to the batch's size with the batch's interpolation
(``COCODetDataset.collate_fn``; upstream has no fixed-size resize before it); without, it is to the
fixed ``image_size``, bilinear. Eval ``Resize`` to a fixed
size with ``keep_ratio`` False.  Operator semantics are read from
``ppdet/data/transform/operators.py`` and ``batch_operators.py``.  Every random
draw comes from an explicit ``numpy.random.Generator``.

Boxes are ``[K,4]`` float ``(x1, y1, x2, y2)`` in continuous pixel coordinates
(a box covering pixel columns 0..9 is x1=0, x2=10), as COCO's ``[x, y, w, h]``,
so a flip is ``x -> W - x`` and a resize multiplies by the size ratio.
Images are HWC uint8 RGB until :func:`normalize_chw`.

Differences from upstream: the photometric ops run in float32 with OpenCV
instead of Pillow (same blend formulas); the crop position draw includes the
full-size crop (upstream's ``randint(0, 0)`` would raise there); boxes smaller
than ``min_box_size`` pixels after the crop are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from zoo.data.transforms import normalize_chw

__all__ = ["BoxEvalTransform", "BoxTrainTransform", "INTERPOLATIONS", "flip_boxes", "pad_targets",
           "random_crop", "random_distort", "random_expand", "resize_with_boxes"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# BatchRandomResize's random_interp choices (batch_operators.py).
INTERPOLATIONS = (cv2.INTER_NEAREST, cv2.INTER_LINEAR, cv2.INTER_AREA, cv2.INTER_CUBIC, cv2.INTER_LANCZOS4)
_GRAY = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R 601 luma, as Pillow's "L" conversion


def random_distort(img: np.ndarray, rng: np.random.Generator, prob: float = 0.5,
                   brightness=(0.5, 1.5), contrast=(0.5, 1.5), saturation=(0.5, 1.5), hue: float = 18) -> np.ndarray:
    """``RandomDistort`` (random_apply order): brightness, contrast, saturation and
    hue (shift in 1/256 turns, Pillow's HSV scale) in random order, each applied
    with probability ``prob``.  All draws are made every call."""
    order = rng.permutation(4)
    apply = rng.random(4) < prob
    factors = (rng.uniform(*brightness), rng.uniform(*contrast), rng.uniform(*saturation), rng.uniform(-hue, hue))
    if not apply.any():
        return img
    out = img.astype(np.float32)
    for op in order:
        if not apply[op]:
            continue
        f = np.float32(factors[op])
        if op == 0:  # ImageEnhance.Brightness: blend with black
            out = out * f
        elif op == 1:  # ImageEnhance.Contrast: blend with the mean grey level
            out = out * f + np.float32((out @ _GRAY).mean()) * (1 - f)
        elif op == 2:  # ImageEnhance.Color: blend with the greyscale image
            out = out * f + (out @ _GRAY)[..., None] * (1 - f)
        else:
            hsv = cv2.cvtColor(np.clip(out, 0, 255).astype(np.uint8), cv2.COLOR_RGB2HSV_FULL)
            hsv[..., 0] = ((hsv[..., 0].astype(np.int32) + int(round(float(f)))) % 256).astype(np.uint8)
            out = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL).astype(np.float32)
        out = np.clip(out, 0, 255)  # Pillow clips after every enhancement
    return np.round(out).astype(np.uint8)


def random_expand(img: np.ndarray, boxes: np.ndarray, rng: np.random.Generator, prob: float = 0.5,
                  ratio: float = 4.0, fill=(123.675, 116.28, 103.53)):
    """``RandomExpand``: with probability ``prob`` place the image at a random
    offset on a canvas up to ``ratio`` times larger filled with ``fill``."""
    do = rng.random() < prob
    r = rng.uniform(1.0, ratio)
    u = rng.random(2)
    h, w = img.shape[:2]
    nh, nw = int(h * r), int(w * r)
    if not do or nh <= h or nw <= w:
        return img, boxes
    y, x = int(u[0] * (nh - h)), int(u[1] * (nw - w))
    canvas = np.empty((nh, nw, img.shape[2]), img.dtype)
    canvas[:] = np.round(np.asarray(fill, np.float32)).astype(img.dtype)
    canvas[y:y + h, x:x + w] = img
    return canvas, boxes + np.array([x, y, x, y], boxes.dtype)


def _iou_with(boxes: np.ndarray, crop: np.ndarray) -> np.ndarray:
    lt, rb = np.maximum(boxes[:, :2], crop[:2]), np.minimum(boxes[:, 2:], crop[2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=1)
    union = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1) + np.prod(crop[2:] - crop[:2]) - inter
    return inter / np.maximum(union, 1e-10)


def random_crop(img: np.ndarray, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator,
                prob: float = 1.0, thresholds=(0.0, 0.1, 0.3, 0.5, 0.7, 0.9), scaling=(0.3, 1.0),
                aspect_ratio=(0.5, 2.0), num_attempts: int = 50, allow_no_crop: bool = True,
                min_box_size: float = 1.0):
    """``RandomCrop`` (IoU mode): try IoU thresholds in random order (plus
    "no crop"); a crop is valid when some box has IoU >= threshold with it and
    at least one box centre lies inside.  Kept boxes are those with their
    centre inside, clipped to the crop; ones under ``min_box_size`` px are dropped.
    Images without boxes are returned unchanged."""
    if rng.random() >= prob or len(boxes) == 0:
        return img, boxes, labels
    h, w = img.shape[:2]
    choices = list(thresholds) + ([None] if allow_no_crop else [])
    for i in rng.permutation(len(choices)):
        thresh = choices[i]
        if thresh is None:
            return img, boxes, labels
        for _ in range(num_attempts):
            scale = rng.uniform(*scaling)
            ar = rng.uniform(max(aspect_ratio[0], scale ** 2), min(aspect_ratio[1], scale ** -2))
            ch, cw = int(h * scale / np.sqrt(ar)), int(w * scale * np.sqrt(ar))
            if ch < 1 or cw < 1:
                continue
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            crop = np.array([x, y, x + cw, y + ch], np.float64)
            if _iou_with(boxes.astype(np.float64), crop).max() < thresh:
                continue
            centres = (boxes[:, :2] + boxes[:, 2:]) / 2
            keep = ((centres >= crop[:2]) & (centres < crop[2:])).all(axis=1)
            cut = np.concatenate([np.maximum(boxes[:, :2], crop[:2]), np.minimum(boxes[:, 2:], crop[2:])], axis=1)
            cut -= np.tile(crop[:2], 2)
            keep &= ((cut[:, 2:] - cut[:, :2]) >= min_box_size).all(axis=1)
            if keep.any():
                return img[y:y + ch, x:x + cw], cut[keep].astype(boxes.dtype), labels[keep]
    return img, boxes, labels


def flip_boxes(boxes: np.ndarray, width: float) -> np.ndarray:
    """Horizontal flip of xyxy boxes in an image ``width`` pixels wide: x1' = W - x2, x2' = W - x1."""
    out = boxes.copy()
    out[:, 0], out[:, 2] = width - boxes[:, 2], width - boxes[:, 0]
    return out


def resize_with_boxes(img: np.ndarray, boxes: np.ndarray, size: Sequence[int], interp: int = cv2.INTER_LINEAR):
    """``Resize`` with ``keep_ratio`` False to ``size`` = (h, w); boxes scaled and clipped.
    Returns ``(image, boxes, (scale_y, scale_x))``."""
    oh, ow = int(size[0]), int(size[1])
    sy, sx = oh / img.shape[0], ow / img.shape[1]
    out = cv2.resize(img, (ow, oh), interpolation=interp)
    if out.ndim == 2:
        out = out[..., None]
    boxes = np.clip(boxes * np.array([sx, sy, sx, sy], boxes.dtype), 0, np.array([ow, oh, ow, oh], boxes.dtype))
    return out, boxes, (sy, sx)


def pad_targets(boxes: np.ndarray, labels: np.ndarray, max_boxes: int) -> dict:
    """``PadGT`` to a fixed ``max_boxes`` (extra boxes are cut off): ``gt_bbox``
    [M,4] float32, ``gt_class`` [M,1] int32, ``pad_gt_mask`` [M,1] float32."""
    k = min(len(boxes), max_boxes)
    out = {"gt_bbox": np.zeros((max_boxes, 4), np.float32), "gt_class": np.zeros((max_boxes, 1), np.int32),
           "pad_gt_mask": np.zeros((max_boxes, 1), np.float32)}
    out["gt_bbox"][:k] = boxes[:k]
    out["gt_class"][:k, 0] = labels[:k]
    out["pad_gt_mask"][:k] = 1
    return out


class BoxTrainTransform:
    """Train pipeline ``(img, boxes, labels, rng) -> (image [3,S,S] float32, boxes, labels)``.

    ``distort``, ``expand``, ``crop``, ``flip`` are probabilities; channel order
    is swapped to BGR before normalising when ``bgr``.
    """

    def __init__(self, size: int = 640, flip: float = 0.5, distort: float = 0.5, expand: float = 0.5,
                 expand_ratio: float = 4.0, crop: float = 1.0, min_box_size: float = 1.0,
                 mean=MEAN, std=STD, bgr: bool = False):
        for name, p in (("flip", flip), ("distort", distort), ("expand", expand), ("crop", crop)):
            if not 0 <= p <= 1:
                raise ValueError(f"data.builder.{name}: expected a probability in [0, 1], got {p}")
        if size < 8 or expand_ratio < 1.01 or min_box_size < 0:
            raise ValueError(f"need image_size >= 8, expand_ratio >= 1.01, min_box_size >= 0; got "
                             f"{size}, {expand_ratio}, {min_box_size}")
        self.size, self.flip, self.distort, self.expand = int(size), float(flip), float(distort), float(expand)
        self.expand_ratio, self.crop, self.min_box_size = float(expand_ratio), float(crop), float(min_box_size)
        self.mean, self.std, self.bgr = tuple(mean), tuple(std), bool(bgr)

    def __call__(self, img: np.ndarray, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator):
        """The whole pipeline at the fixed ``size`` (bilinear): training without multi-scale."""
        img, boxes, labels = self.augment(img, boxes, labels, rng)
        img, boxes = self.finish(img, boxes, self.size)
        return img, boxes, labels

    def augment(self, img: np.ndarray, boxes: np.ndarray, labels: np.ndarray, rng: np.random.Generator):
        """The per-image ops (``sample_transforms``: distort, expand, crop, flip), no resize: the
        crop HWC uint8 at its own size, its boxes in its pixels, and the labels. Multi-scale training
        resizes this crop once, to the batch's size (:meth:`finish` from ``collate_fn``)."""
        boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
        labels = np.asarray(labels).reshape(-1)
        img = random_distort(img, rng, self.distort)
        fill = tuple(255.0 * m for m in self.mean)
        img, boxes = random_expand(img, boxes, rng, self.expand, self.expand_ratio, fill)
        img, boxes, labels = random_crop(img, boxes, labels, rng, self.crop, min_box_size=self.min_box_size)
        if rng.random() < self.flip:
            img = np.ascontiguousarray(img[:, ::-1])
            boxes = flip_boxes(boxes, img.shape[1])
        return img, boxes, labels

    def finish(self, img: np.ndarray, boxes: np.ndarray, size: int, interp: int = cv2.INTER_LINEAR):
        """The one resize (``Resize`` with ``keep_ratio`` False to ``size`` x ``size``, boxes scaled
        and clipped; padding boxes of zeros stay zeros), then BGR if asked, ``NormalizeImage`` and
        ``Permute``: ``(image [3,size,size] float32, boxes)``."""
        img, boxes, _ = resize_with_boxes(img, boxes, (size, size), interp)
        if self.bgr:
            img = np.ascontiguousarray(img[..., ::-1])
        return normalize_chw(img, self.mean, self.std), boxes

    def __repr__(self) -> str:
        return (f"BoxTrainTransform(size={self.size}, distort={self.distort}, expand={self.expand}"
                f"x{self.expand_ratio}, crop={self.crop}, flip={self.flip})")


class BoxEvalTransform:
    """Eval pipeline ``img -> (image [3,E,E], scale_factor (scale_y, scale_x))``:
    ``Resize`` to ``eval_size`` with ``keep_ratio`` False, ``interp`` 2 (cubic)."""

    def __init__(self, eval_size: int = 640, mean=MEAN, std=STD, bgr: bool = False):
        if eval_size < 8:
            raise ValueError(f"data.builder.eval_size must be >= 8, got {eval_size}")
        self.eval_size, self.mean, self.std, self.bgr = int(eval_size), tuple(mean), tuple(std), bool(bgr)

    def __call__(self, img: np.ndarray):
        e = self.eval_size
        out, _, (sy, sx) = resize_with_boxes(img, np.zeros((0, 4), np.float32), (e, e), cv2.INTER_CUBIC)
        if self.bgr:
            out = np.ascontiguousarray(out[..., ::-1])
        return normalize_chw(out, self.mean, self.std), np.array([sy, sx], np.float32)

    def __repr__(self) -> str:
        return f"BoxEvalTransform(eval_size={self.eval_size})"
