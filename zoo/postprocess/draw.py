"""Box drawings for detection results ("box drawings" PNGs written next to evaluations)."""
from __future__ import annotations

import cv2
import numpy as np

GT_COLOR = (0, 255, 0)        # BGR green: ground truth that counts
IGNORED_COLOR = (0, 0, 255)   # BGR red: don't-care ground truth (### regions)
DET_COLOR = (255, 0, 0)       # BGR blue: detections


def _polylines(image: np.ndarray, polys, color, thickness: int) -> None:
    for poly in polys:
        pts = np.round(np.asarray(poly, dtype=np.float64).reshape(-1, 2)).astype(np.int32)
        if len(pts) >= 2:
            cv2.polylines(image, [pts.reshape(-1, 1, 2)], isClosed=True, color=color, thickness=thickness)


def draw_detections(image_bgr: np.ndarray, det_boxes, gt_boxes=(), gt_ignore=None,
                    thickness: int = 2) -> np.ndarray:
    """Copy of ``image_bgr`` (uint8 HxWx3) with ground truths and detections drawn as closed polylines.

    Args:
        image_bgr: the image, BGR uint8 (grayscale is converted).
        det_boxes: detections, each ``[M, 2]`` (x, y) in the image's pixel coordinates.
        gt_boxes: ground-truth polygons, same convention.
        gt_ignore: per ground truth, truthy for don't-care; ``None`` means none ignored.
        thickness: line width in pixels.

    Ground truths are drawn first so overlapping detections stay visible on top.
    """
    image = _canvas(image_bgr)
    gt_boxes = list(gt_boxes)
    if gt_ignore is None:
        gt_ignore = np.zeros(len(gt_boxes), bool)
    ignore = np.asarray(gt_ignore).reshape(-1).astype(bool)
    _polylines(image, [g for g, i in zip(gt_boxes, ignore) if not i], GT_COLOR, thickness)
    _polylines(image, [g for g, i in zip(gt_boxes, ignore) if i], IGNORED_COLOR, thickness)
    _polylines(image, list(det_boxes), DET_COLOR, thickness)
    return image


def _canvas(image) -> np.ndarray:
    """A uint8 BGR copy of ``image`` to draw on (grey images get three channels)."""
    image = np.ascontiguousarray(image).copy()
    if image.ndim == 2:
        image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    if image.dtype != np.uint8:
        image = np.clip(image, 0, 255).astype(np.uint8)
    return image


def with_legend(image_bgr: np.ndarray, title: str, entries) -> np.ndarray:
    """``image_bgr`` with a strip below it: ``title`` (e.g. the precision the predictions were made
    in) and one colour swatch per ``(BGR colour, text)`` entry. The canvas widens (white) when the
    text is wider than the image."""
    font, size = cv2.FONT_HERSHEY_SIMPLEX, 0.4
    lines = [(None, title)] + [(c, t) for c, t in entries]
    widths = [cv2.getTextSize(t, font, size, 1)[0][0] + (16 if c is not None else 0) for c, t in lines]
    h, w = image_bgr.shape[:2]
    width = max(w, max(widths) + 8)
    strip = np.full((14 * len(lines) + 6, width, 3), 255, np.uint8)
    for k, (color, text) in enumerate(lines):
        y = 14 * k + 14
        x = 4
        if color is not None:
            cv2.rectangle(strip, (x, y - 9), (x + 10, y), tuple(int(v) for v in color), -1)
            x += 16
        cv2.putText(strip, text, (x, y), font, size, (0, 0, 0), 1, cv2.LINE_AA)
    canvas = np.full((h + strip.shape[0], width, 3), 255, np.uint8)
    canvas[:h, :w] = _canvas(image_bgr)
    canvas[h:] = strip
    return canvas


def _class_color(label: int) -> tuple[int, int, int]:
    """A fixed, saturated BGR colour per class (golden-ratio hue steps), never pure green."""
    hue = int((label * 0.618033988749895 % 1.0) * 180)
    if 50 <= hue <= 70:  # keep clear of the ground-truth green
        hue = (hue + 30) % 180
    hsv = np.array([[[hue, 230, 255]]], np.uint8)
    return tuple(int(c) for c in cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0])


def draw_boxes(image_bgr_uint8: np.ndarray, boxes, labels, scores, class_names, gt_boxes=None, gt_labels=None,
               thickness: int = 1) -> np.ndarray:
    """Copy of ``image_bgr_uint8`` with axis-aligned boxes drawn; returns it.

    ``boxes`` [K,4] xyxy pixels with ``labels`` [K] and ``scores`` [K] are drawn in a
    per-class colour with a "name score" tag; ``gt_boxes`` [G,4] (optional
    ``gt_labels`` adds the name) in green, underneath the predictions.
    """
    image = _canvas(image_bgr_uint8)
    names = list(class_names)

    def name(label: int) -> str:
        return names[label] if 0 <= label < len(names) else str(label)

    def one(box, color, text):
        x1, y1, x2, y2 = (int(round(float(v))) for v in np.asarray(box).reshape(4))
        cv2.rectangle(image, (x1, y1), (max(x1, x2 - 1), max(y1, y2 - 1)), color, thickness)
        if text:
            (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.35, 1)
            ty = y1 - 2 if y1 - th - base - 2 >= 0 else y1 + th + 2
            cv2.rectangle(image, (x1, ty - th - 1), (x1 + tw, ty + base - 1), color, -1)
            cv2.putText(image, text, (x1, ty - 1), cv2.FONT_HERSHEY_SIMPLEX, 0.35, (0, 0, 0), 1, cv2.LINE_AA)

    if gt_boxes is not None:
        gt_boxes = np.asarray(gt_boxes, np.float64).reshape(-1, 4)
        gl = None if gt_labels is None else np.asarray(gt_labels).reshape(-1).astype(int)
        for i, box in enumerate(gt_boxes):
            one(box, GT_COLOR, None if gl is None else name(gl[i]))
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    labels = np.asarray(labels).reshape(-1).astype(int)
    scores = np.asarray(scores, np.float64).reshape(-1)
    for box, label, score in zip(boxes, labels, scores):
        one(box, _class_color(label), f"{name(label)} {score:.2f}")
    return image
