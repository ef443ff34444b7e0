"""COCOMetric against hand-computed COCO AP values, and draw_boxes."""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from zoo.metrics.coco_eval import COCOMetric
from zoo.postprocess.draw import GT_COLOR, draw_boxes

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
REC_THRESHOLDS = np.linspace(0.0, 1.0, 101)


def _coco(images, anns, cat_ids=(1,)):
    """pycocotools COCO from {im_id: (w, h)} and [(im_id, cat_id, [x, y, w, h])]."""
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = {
        "images": [{"id": i, "width": w, "height": h, "file_name": f"{i}.jpg"} for i, (w, h) in images.items()],
        "annotations": [{"id": k + 1, "image_id": i, "category_id": c, "bbox": list(b), "area": b[2] * b[3],
                         "iscrowd": 0} for k, (i, c, b) in enumerate(anns)],
        "categories": [{"id": c, "name": f"c{c}"} for c in cat_ids]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _ap_101(tp_sorted, num_gt):
    """Reference 101-point interpolated AP of detections sorted by score (True = match)."""
    tp = np.cumsum(tp_sorted)
    precision = tp / np.arange(1, len(tp_sorted) + 1)
    recall = tp / num_gt
    out = 0.0
    for r in REC_THRESHOLDS:
        ok = precision[recall >= r - 1e-12]
        out += ok.max() if len(ok) else 0.0
    return out / len(REC_THRESHOLDS)


def test_perfect_detections_give_one():
    coco = _coco({1: (200, 200), 2: (200, 200)},
                 [(1, 1, [10, 10, 50, 40]), (1, 2, [100, 100, 60, 80]), (2, 1, [5, 5, 20, 20])], cat_ids=(1, 2))
    m = COCOMetric(coco, {0: 1, 1: 2})
    m.update(1, [[10, 10, 60, 50], [100, 100, 160, 180]], [0.9, 0.8], [0, 1])
    m.update(2, np.array([[5, 5, 25, 25]]), np.array([0.5]), np.array([0]))
    out = m.accumulate()
    assert out["mAP"] == pytest.approx(1.0) and out["AP50"] == pytest.approx(1.0) and out["AP75"] == pytest.approx(1.0)
    assert set(out) == {"mAP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large"}


def test_single_detection_iou_058_gives_two_of_ten_thresholds():
    coco = _coco({1: (200, 200)}, [(1, 1, [0, 0, 100, 100])])
    m = COCOMetric(coco, {0: 1})
    m.update(1, [[0, 0, 100, 58]], [0.9], [0])  # IoU = 5800 / 10000 = 0.58
    expected = float(np.mean(IOU_THRESHOLDS <= 0.58))   # 0.50 and 0.55 pass: 2/10
    out = m.accumulate()
    assert expected == pytest.approx(0.2)
    assert out["mAP"] == pytest.approx(expected, abs=1e-6)
    assert out["AP50"] == pytest.approx(1.0) and out["AP75"] == pytest.approx(0.0)
    assert out["AP_large"] == pytest.approx(expected, abs=1e-6) and out["AP_small"] == -1.0


def test_interpolated_precision_matches_reference():
    coco = _coco({1: (300, 300)}, [(1, 1, [0, 0, 50, 50]), (1, 1, [100, 100, 50, 50])])
    m = COCOMetric(coco, {0: 1})
    # ranked: hit, false positive, hit -> precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1
    m.update(1, [[0, 0, 50, 50], [200, 200, 250, 250], [100, 100, 150, 150]], [0.9, 0.8, 0.7], [0, 0, 0])
    expected = _ap_101(np.array([True, False, True]), 2)
    assert expected == pytest.approx((51 + 50 * 2 / 3) / 101)
    out = m.accumulate()
    assert out["mAP"] == pytest.approx(expected, abs=1e-6) and out["AP50"] == pytest.approx(expected, abs=1e-6)


def test_no_detections_give_zero_not_a_crash():
    coco = _coco({1: (100, 100)}, [(1, 1, [0, 0, 50, 50])])
    m = COCOMetric(coco, {0: 1})
    assert m.accumulate()["mAP"] == 0.0                    # nothing updated
    m.update(1, np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64))
    out = m.accumulate()
    assert out["mAP"] == 0.0 and out["AP50"] == 0.0 and m.results() == []


def test_labels_are_mapped_back_to_category_ids():
    coco = _coco({1: (200, 200)}, [(1, 7, [10, 20, 30, 40]), (1, 3, [100, 100, 20, 20])], cat_ids=(3, 7))
    m = COCOMetric(coco, {0: 3, 1: 7})
    m.update(1, [[10, 20, 40, 60]], [0.9], [1])
    assert m.results() == [{"image_id": 1, "category_id": 7, "bbox": [10.0, 20.0, 30.0, 40.0], "score": 0.9}]
    m.update(1, [[100, 100, 120, 120]], [0.8], [0])
    assert m.accumulate()["mAP"] == pytest.approx(1.0)
    swapped = COCOMetric(coco, {0: 7, 1: 3})              # the wrong mapping must score zero
    swapped.update(1, [[10, 20, 40, 60], [100, 100, 120, 120]], [0.9, 0.8], [1, 0])
    assert swapped.accumulate()["mAP"] == 0.0


def test_batch_update_and_rank_merge_equal_single_pass():
    coco = _coco({1: (100, 100), 2: (100, 100)}, [(1, 1, [0, 0, 40, 40]), (2, 1, [10, 10, 30, 30])])
    boxes = [np.array([[0, 0, 40, 30]]), np.array([[10, 10, 40, 40], [60, 60, 90, 90]])]
    scores, labels = [np.array([0.9]), np.array([0.3, 0.8])], [np.array([0]), np.array([0, 0])]
    whole = COCOMetric(coco, {0: 1})
    whole.update(np.array([1, 2]), boxes, scores, labels)
    a, b = COCOMetric(coco, {0: 1}), COCOMetric(coco, {0: 1})
    a.update(1, boxes[0], scores[0], labels[0])
    b.update(2, boxes[1], scores[1], labels[1])
    a.extend(b.results(), b.image_ids())
    assert a.image_ids() == [1, 2] and len(a.results()) == 3
    assert a.accumulate() == whole.accumulate()
    assert 0.0 < whole.accumulate()["mAP"] < 1.0


def test_bad_update_input_is_named():
    m = COCOMetric(_coco({1: (10, 10)}, []), {0: 1})
    with pytest.raises(ValueError, match="image id 5 is not in the ground truth"):
        m.update(5, [[0, 0, 1, 1]], [0.5], [0])
    with pytest.raises(ValueError, match="label 3 has no category id"):
        m.update(1, [[0, 0, 1, 1]], [0.5], [3])
    with pytest.raises(ValueError, match="category ids \\[9\\]"):
        COCOMetric(_coco({1: (10, 10)}, []), {0: 9})


def test_draw_boxes_gt_green_and_prediction_tagged():
    image = np.zeros((64, 64, 3), np.uint8)
    out = draw_boxes(image, [[30, 30, 60, 60]], [1], [0.87], ["a", "b"], gt_boxes=[[5, 5, 20, 25]], gt_labels=[0])
    assert out is not image and image.max() == 0
    assert tuple(out[15, 5]) == GT_COLOR and tuple(out[24, 12]) == GT_COLOR   # left and bottom edges of the GT
    assert tuple(out[45, 59]) != (0, 0, 0) and tuple(out[45, 59]) != GT_COLOR  # prediction's right edge
    assert out[28:30, 30:60].any()                                              # "b 0.87" tag above it
    assert out[40:50, 40:50].max() == 0                                         # boxes are outlines
