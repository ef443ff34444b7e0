"""DB post-processing on synthetic probability maps with known rectangles."""
from __future__ import annotations

import numpy as np
import pytest

from zoo.postprocess import DBPostProcess, draw_detections

H, W = 64, 96              # probability map size
SRC_H, SRC_W = 160, 288    # source image: 2.5x taller, 3x wider than the map
SHAPES = np.array([[SRC_H, SRC_W, H / SRC_H, W / SRC_W]], np.float32)
# (x0, y0, x1, y1) pixel ranges, inclusive, of two text kernels on the map
RECT_A, RECT_B = (10, 8, 40, 18), (50, 36, 80, 53)


def prob_map(values=(0.9, 0.9), rects=(RECT_A, RECT_B)):
    prob = np.zeros((1, 1, H, W), np.float32)
    for (x0, y0, x1, y1), v in zip(rects, values):
        prob[0, 0, y0:y1 + 1, x0:x1 + 1] = v
    return prob


def expected_box(rect, ratio=1.5):
    """Where the unclipped box should land in source pixels: the contour runs through the pixel
    centres, so the kernel is (x1-x0) x (y1-y0); unclip grows each side by area*ratio/perimeter."""
    x0, y0, x1, y1 = rect
    w, h = x1 - x0, y1 - y0
    d = w * h * ratio / (2 * (w + h))
    sx, sy = SRC_W / W, SRC_H / H
    return np.array([(x0 - d) * sx, (y0 - d) * sy, (x1 + d) * sx, (y1 + d) * sy])


def as_xyxy(box):
    return np.array([box[:, 0].min(), box[:, 1].min(), box[:, 0].max(), box[:, 1].max()])


def sort_by_x(boxes):
    return sorted(boxes, key=lambda b: b[:, 0].min())


@pytest.mark.parametrize("score_mode", ["fast", "slow"])
def test_two_rectangles_map_back_to_source(score_mode):
    (boxes, scores), = DBPostProcess(score_mode=score_mode)(prob_map(), SHAPES)
    assert boxes.shape == (2, 4, 2) and boxes.dtype == np.float32
    np.testing.assert_allclose(scores, [0.9, 0.9], rtol=1e-5)
    for box, rect in zip(sort_by_x(boxes), (RECT_A, RECT_B)):
        # the offset is integer-rounded by pyclipper and the result rounded to source pixels
        np.testing.assert_allclose(as_xyxy(box), expected_box(rect), atol=1.5 * SRC_W / W)
        # corner order: top-left, top-right, bottom-right, bottom-left
        assert box[0, 0] < box[1, 0] and box[1, 1] < box[2, 1] and box[3, 0] < box[2, 0]


def test_box_thresh_drops_low_scoring_box():
    (boxes, scores), = DBPostProcess(box_thresh=0.6)(prob_map(values=(0.9, 0.5)), SHAPES)
    assert len(boxes) == 1 and scores[0] == pytest.approx(0.9)
    np.testing.assert_allclose(as_xyxy(boxes[0]), expected_box(RECT_A), atol=5)
    (boxes, _), = DBPostProcess(box_thresh=0.4)(prob_map(values=(0.9, 0.5)), SHAPES)
    assert len(boxes) == 2


def test_max_candidates_limits_contours():
    (boxes, _), = DBPostProcess(max_candidates=1)(prob_map(), SHAPES)
    assert len(boxes) == 1


def test_small_and_empty_regions():
    prob = prob_map(rects=((10, 10, 11, 11), RECT_B))  # a 2x2 blob: short side < 3, dropped
    (boxes, _), = DBPostProcess()(prob[:, 0], SHAPES)  # [N, H, W] input is accepted too
    assert len(boxes) == 1
    (boxes, scores), = DBPostProcess()(np.zeros((1, 1, H, W), np.float32), SHAPES)
    assert boxes.shape == (0, 4, 2) and scores.shape == (0,)


def test_boxes_clipped_to_source_image():
    (boxes, _), = DBPostProcess()(prob_map(rects=((0, 0, 30, 10), (60, 50, 95, 63))), SHAPES)
    assert len(boxes) == 2
    assert boxes[..., 0].min() == 0 and boxes[..., 0].max() == SRC_W
    assert boxes[..., 1].min() == 0 and boxes[..., 1].max() == SRC_H


def test_batch_with_different_sources():
    prob = np.concatenate([prob_map(), prob_map(rects=(RECT_A,))])
    shapes = np.array([SHAPES[0], [H, W, 1.0, 1.0]], np.float32)
    (b0, _), (b1, _) = DBPostProcess()(prob, shapes)
    assert len(b0) == 2 and len(b1) == 1
    np.testing.assert_allclose(as_xyxy(b1[0]) * np.tile([SRC_W / W, SRC_H / H], 2),
                               as_xyxy(sort_by_x(b0)[0]), atol=4)


def test_poly_mode_and_dilation():
    (polys, _), = DBPostProcess(box_type="poly")(prob_map(), SHAPES)
    assert len(polys) == 2 and all(p.ndim == 2 and p.shape[1] == 2 for p in polys)
    for poly, rect in zip(sort_by_x(polys), (RECT_A, RECT_B)):
        np.testing.assert_allclose(as_xyxy(poly), expected_box(rect), atol=1.5 * SRC_W / W)
    (boxes, _), = DBPostProcess(use_dilation=True)(prob_map(), SHAPES)
    assert len(boxes) == 2


def test_invalid_options():
    with pytest.raises(ValueError, match="score_mode"):
        DBPostProcess(score_mode="medium")
    with pytest.raises(ValueError, match="box_type"):
        DBPostProcess(box_type="circle")


def test_draw_detections_colours():
    image = np.zeros((40, 60, 3), np.uint8)
    out = draw_detections(image, [np.array([[30, 5], [55, 5], [55, 35], [30, 35]])],
                          [np.array([[2, 2], [20, 2], [20, 15], [2, 15]]),
                           np.array([[2, 20], [20, 20], [20, 35], [2, 35]])], [0, 1], thickness=1)
    assert image.sum() == 0  # input untouched
    assert tuple(out[2, 10]) == (0, 255, 0) and tuple(out[20, 10]) == (0, 0, 255)
    assert tuple(out[5, 40]) == (255, 0, 0)
