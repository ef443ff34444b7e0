"""DB post-processing: probability map -> text boxes in source-image pixels.

Same steps and constants as PaddleOCR's ppocr/postprocess/db_postprocess.py (``DBPostProcess``):
binarize at ``thresh`` (optionally dilate 2x2), find contours (``RETR_LIST``, ``CHAIN_APPROX_SIMPLE``),
keep the first ``max_candidates``, fit a minimum-area rectangle, score it on the probability map,
drop boxes scoring below ``box_thresh`` or whose short side is < 3 px (before unclip) or < 5 px
(after), expand ("unclip") with a pyclipper round offset of ``area * unclip_ratio / perimeter``,
then scale from map size to (src_w, src_h), round and clip to ``[0, src_w] x [0, src_h]``.
"""
from __future__ import annotations

import cv2
import numpy as np
import pyclipper
from shapely.geometry import Polygon

MIN_SIZE = 3  # upstream's self.min_size; the post-unclip check uses MIN_SIZE + 2


def get_mini_boxes(contour) -> tuple[np.ndarray, float]:
    """Minimum-area rectangle as 4 points (top-left, top-right, bottom-right, bottom-left order as
    upstream orders them: the two left-most points, upper first, then the two right-most) and its
    short side."""
    rect = cv2.minAreaRect(np.asarray(contour).reshape(-1, 1, 2))
    points = sorted(cv2.boxPoints(rect), key=lambda p: p[0])
    left = (points[0], points[1]) if points[1][1] > points[0][1] else (points[1], points[0])
    right = (points[2], points[3]) if points[3][1] > points[2][1] else (points[3], points[2])
    # left = (upper-left, lower-left), right = (upper-right, lower-right)
    box = np.array([left[0], right[0], right[1], left[1]], dtype=np.float32)
    return box, float(min(rect[1]))


def box_score_fast(prob: np.ndarray, box: np.ndarray) -> float:
    """Mean probability inside ``box``, rasterised within its integer bounding box."""
    h, w = prob.shape[:2]
    box = np.array(box, dtype=np.float64).reshape(-1, 2)
    xmin = int(np.clip(np.floor(box[:, 0].min()), 0, w - 1))
    xmax = int(np.clip(np.ceil(box[:, 0].max()), 0, w - 1))
    ymin = int(np.clip(np.floor(box[:, 1].min()), 0, h - 1))
    ymax = int(np.clip(np.ceil(box[:, 1].max()), 0, h - 1))
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    # astype(int32) truncates toward zero, as upstream does before fillPoly
    local = (box - np.array([xmin, ymin], dtype=np.float64)).astype(np.int32)
    cv2.fillPoly(mask, local.reshape(1, -1, 2), 1)
    return cv2.mean(prob[ymin:ymax + 1, xmin:xmax + 1], mask)[0]


def box_score_slow(prob: np.ndarray, contour: np.ndarray) -> float:
    """Mean probability inside the contour polygon itself (slower, tighter for curved text)."""
    h, w = prob.shape[:2]
    contour = np.asarray(contour).reshape(-1, 2).astype(np.int64)
    xmin = int(np.clip(contour[:, 0].min(), 0, w - 1))
    xmax = int(np.clip(contour[:, 0].max(), 0, w - 1))
    ymin = int(np.clip(contour[:, 1].min(), 0, h - 1))
    ymax = int(np.clip(contour[:, 1].max(), 0, h - 1))
    mask = np.zeros((ymax - ymin + 1, xmax - xmin + 1), dtype=np.uint8)
    local = (contour - np.array([xmin, ymin])).astype(np.int32)
    cv2.fillPoly(mask, local.reshape(1, -1, 2), 1)
    return cv2.mean(prob[ymin:ymax + 1, xmin:xmax + 1], mask)[0]


def unclip(box: np.ndarray, unclip_ratio: float) -> list:
    """Offset the polygon outward by ``area * unclip_ratio / perimeter`` (the DB paper's D')."""
    poly = Polygon(box)
    distance = poly.area * unclip_ratio / poly.length
    offset = pyclipper.PyclipperOffset()
    # pyclipper works on integer coordinates: float points are truncated, as upstream passes them
    offset.AddPath(np.asarray(box).tolist(), pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return offset.Execute(distance)


class DBPostProcess:
    """Probability maps to boxes; see the module docstring for the algorithm.

    Args (defaults are configs/det/det_mv3_db.yml's PostProcess section):
        thresh: binarisation threshold on the probability map.
        box_thresh: minimum mean probability of a kept box.
        max_candidates: contours considered per image (the first ones cv2 returns).
        unclip_ratio: expansion factor of the shrunk text kernel.
        use_dilation: dilate the binary map with a 2x2 kernel first.
        score_mode: "fast" (mean in the box's bounding-box mask) or "slow" (mean in the contour).
        box_type: "quad" (rotated rectangles) or "poly" (polygons; scored "fast" as upstream does).
    """

    def __init__(self, thresh: float = 0.3, box_thresh: float = 0.6, max_candidates: int = 1000,
                 unclip_ratio: float = 1.5, use_dilation: bool = False, score_mode: str = "fast",
                 box_type: str = "quad"):
        if score_mode not in ("fast", "slow"):
            raise ValueError(f"score_mode must be one of ['fast', 'slow'], got {score_mode!r}")
        if box_type not in ("quad", "poly"):
            raise ValueError(f"box_type must be one of ['quad', 'poly'], got {box_type!r}")
        self.thresh = float(thresh)
        self.box_thresh = float(box_thresh)
        self.max_candidates = int(max_candidates)
        self.unclip_ratio = float(unclip_ratio)
        self.score_mode = score_mode
        self.box_type = box_type
        self.dilation_kernel = np.ones((2, 2), dtype=np.uint8) if use_dilation else None

    def __call__(self, prob_maps, shapes) -> list[tuple]:
        """Boxes per image.

        Args:
            prob_maps: ``[N, 1, H, W]`` or ``[N, H, W]`` shrink probabilities (numpy or Paddle).
            shapes: ``[N, 4]`` rows ``(src_h, src_w, ratio_h, ratio_w)``; only src_h/src_w are used,
                the map size gives the scale (as upstream).

        Returns:
            One ``(boxes, scores)`` per image: for "quad" ``boxes`` is float32 ``[K, 4, 2]``
            (x, y in source pixels, rounded); for "poly" a list of ``[M_k, 2]`` float32 arrays.
            ``scores`` is float32 ``[K]``.
        """
        prob_maps = np.asarray(prob_maps.numpy() if hasattr(prob_maps, "numpy") else prob_maps)
        shapes = np.asarray(shapes.numpy() if hasattr(shapes, "numpy") else shapes, dtype=np.float64)
        if prob_maps.ndim == 4:
            prob_maps = prob_maps[:, 0]
        if prob_maps.ndim != 3 or shapes.shape != (prob_maps.shape[0], 4):
            raise ValueError(f"expected maps [N,1,H,W] or [N,H,W] and shapes [N,4], got "
                             f"{prob_maps.shape} and {shapes.shape}")
        prob_maps = prob_maps.astype(np.float32, copy=False)
        results = []
        for prob, (src_h, src_w, _, _) in zip(prob_maps, shapes):
            bitmap = (prob > self.thresh).astype(np.uint8)
            if self.dilation_kernel is not None:
                bitmap = cv2.dilate(bitmap, self.dilation_kernel)
            if self.box_type == "quad":
                results.append(self.boxes_from_bitmap(prob, bitmap, src_w, src_h))
            else:
                results.append(self.polygons_from_bitmap(prob, bitmap, src_w, src_h))
        return results

    def _to_source(self, box: np.ndarray, map_hw, dest_w: float, dest_h: float) -> np.ndarray:
        """Scale map coordinates to source pixels, round, clip to [0, dest]."""
        box = np.array(box, dtype=np.float64).reshape(-1, 2)
        box[:, 0] = np.clip(np.round(box[:, 0] / map_hw[1] * dest_w), 0, dest_w)
        box[:, 1] = np.clip(np.round(box[:, 1] / map_hw[0] * dest_h), 0, dest_h)
        return box.astype(np.float32)

    def _contours(self, bitmap):
        contours, _ = cv2.findContours(bitmap * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
        return contours[: self.max_candidates]

    def boxes_from_bitmap(self, prob, bitmap, dest_w, dest_h):
        """Quad mode: one rotated rectangle per contour (upstream ``boxes_from_bitmap``)."""
        boxes, scores = [], []
        for contour in self._contours(bitmap):
            points, sside = get_mini_boxes(contour)
            if sside < MIN_SIZE:
                continue
            if self.score_mode == "fast":
                score = box_score_fast(prob, points)
            else:
                score = box_score_slow(prob, contour)
            if self.box_thresh > score:
                continue
            expanded = unclip(points, self.unclip_ratio)
            if len(expanded) != 1:  # split or vanished by the offset: upstream skips it
                continue
            box, sside = get_mini_boxes(np.array(expanded[0]))
            if sside < MIN_SIZE + 2:
                continue
            boxes.append(self._to_source(box, prob.shape, dest_w, dest_h))
            scores.append(score)
        boxes = np.stack(boxes) if boxes else np.zeros((0, 4, 2), dtype=np.float32)
        return boxes, np.asarray(scores, dtype=np.float32)

    def polygons_from_bitmap(self, prob, bitmap, dest_w, dest_h):
        """Poly mode: the contour simplified by Douglas-Peucker (upstream ``polygons_from_bitmap``)."""
        boxes, scores = [], []
        for contour in self._contours(bitmap):
            approx = cv2.approxPolyDP(contour, 0.002 * cv2.arcLength(contour, True), True)
            points = approx.reshape(-1, 2)
            if points.shape[0] < 4:
                continue
            score = box_score_fast(prob, points)
            if self.box_thresh > score:
                continue
            expanded = unclip(points, self.unclip_ratio)
            if len(expanded) != 1:
                continue
            poly = np.array(expanded[0]).reshape(-1, 2)
            if get_mini_boxes(poly)[1] < MIN_SIZE + 2:
                continue
            boxes.append(self._to_source(poly, prob.shape, dest_w, dest_h))
            scores.append(score)
        return boxes, np.asarray(scores, dtype=np.float32)
