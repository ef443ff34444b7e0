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
    image = np.ascontiguousarray(image_bgr).copy()
    if image.ndim == 2:
        image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
    if image.dtype != np.uint8:
        image = np.clip(image, 0, 255).astype(np.uint8)
    gt_boxes = list(gt_boxes)
    if gt_ignore is None:
        gt_ignore = np.zeros(len(gt_boxes), bool)
    ignore = np.asarray(gt_ignore).reshape(-1).astype(bool)
    _polylines(image, [g for g, i in zip(gt_boxes, ignore) if not i], GT_COLOR, thickness)
    _polylines(image, [g for g, i in zip(gt_boxes, ignore) if i], IGNORED_COLOR, thickness)
    _polylines(image, list(det_boxes), DET_COLOR, thickness)
    return image
