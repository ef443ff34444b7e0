"""Multi-class NMS against hand-made cases and Paddle's own multiclass_nms3 kernel."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from zoo.postprocess.nms import batch_multiclass_nms, greedy_nms, multiclass_nms

BOXES = np.array([[0, 0, 10, 10],      # 0
                  [0.5, 0, 10.5, 10],  # 1: IoU 95/105 = 0.905 with 0
                  [1, 1, 11, 11],      # 2: IoU 81/119 = 0.681 with 0
                  [20, 20, 30, 30]],   # 3: disjoint
                 dtype=np.float32)


def test_same_class_overlaps_suppressed_others_kept():
    scores = np.array([[0.9, 0.8, 0.7, 0.6]], np.float32)
    boxes, out_scores, labels = multiclass_nms(BOXES, scores, nms_threshold=0.7)
    np.testing.assert_allclose(out_scores, [0.9, 0.7, 0.6])
    np.testing.assert_allclose(boxes, BOXES[[0, 2, 3]])
    np.testing.assert_array_equal(labels, [0, 0, 0])
    # a lower threshold also removes box 2 (0.681 > 0.5)
    _, out_scores, _ = multiclass_nms(BOXES, scores, nms_threshold=0.5)
    np.testing.assert_allclose(out_scores, [0.9, 0.6])


def test_suppression_is_by_kept_boxes_only():
    # 1 is suppressed by 0; 2 overlaps 1 above the threshold, but 1 is gone, so only its IoU with 0 counts
    boxes = np.array([[0, 0, 10, 10], [0.6, 0, 10.6, 10], [1.2, 0, 11.2, 10]], np.float32)
    # IoU(0,1) = 94/106 = 0.887, IoU(1,2) = 0.887, IoU(0,2) = 88/112 = 0.786
    keep = greedy_nms(boxes, np.array([0.9, 0.8, 0.7], np.float32), nms_threshold=0.8)
    np.testing.assert_array_equal(keep, [0, 2])


def test_iou_uses_continuous_widths_and_keeps_equal_iou():
    # [0,0,2,2] vs [1,0,3,2]: IoU 2/6 = 1/3 with x2 - x1 widths (it would be 0.5 with the +1 convention)
    boxes = np.array([[0, 0, 2, 2], [1, 0, 3, 2]], np.float32)
    _, s, _ = multiclass_nms(boxes, np.array([[0.9, 0.8]], np.float32), nms_threshold=0.4)
    assert len(s) == 2
    # IoU exactly at the threshold is kept (suppression needs IoU > threshold), as Paddle's kernel
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 5]], np.float32)  # IoU 0.5
    assert len(multiclass_nms(boxes, np.array([[0.9, 0.8]], np.float32), nms_threshold=0.5)[1]) == 2
    assert len(multiclass_nms(boxes, np.array([[0.9, 0.8]], np.float32), nms_threshold=0.49)[1]) == 1


def test_different_classes_kept_sorted_by_score():
    scores = np.array([[0.5, 0.0, 0.0, 0.0], [0.95, 0.0, 0.0, 0.3], [0.0, 0.0, 0.7, 0.0]], np.float32)
    boxes, out_scores, labels = multiclass_nms(BOXES, scores, nms_threshold=0.7)
    np.testing.assert_allclose(out_scores, [0.95, 0.7, 0.5, 0.3])
    np.testing.assert_array_equal(labels, [1, 2, 0, 1])
    np.testing.assert_allclose(boxes, BOXES[[0, 2, 0, 3]])


def test_thresholds_and_top_k_limits():
    scores = np.array([[0.01, 0.02, 0.5, 0.6], [0.2, 0.0, 0.0, 0.3]], np.float32)
    _, s, _ = multiclass_nms(BOXES, scores, score_threshold=0.01, nms_threshold=0.99)
    np.testing.assert_allclose(s, [0.6, 0.5, 0.3, 0.2, 0.02])  # 0.01 is not > 0.01
    _, s, labels = multiclass_nms(BOXES, scores, score_threshold=0.01, nms_threshold=0.99, keep_top_k=3)
    np.testing.assert_allclose(s, [0.6, 0.5, 0.3])
    np.testing.assert_array_equal(labels, [0, 0, 1])
    # nms_top_k applies per class before NMS
    _, s, labels = multiclass_nms(BOXES, scores, score_threshold=0.01, nms_threshold=0.99, nms_top_k=1)
    np.testing.assert_allclose(s, [0.6, 0.3])
    np.testing.assert_array_equal(labels, [0, 1])


@pytest.mark.parametrize("num_boxes,score", [(0, 0.0), (4, 0.005)])
def test_empty_results_have_the_right_shapes(num_boxes, score):
    boxes, scores, labels = multiclass_nms(BOXES[:num_boxes], np.full((3, num_boxes), score, np.float32))
    assert boxes.shape == (0, 4) and scores.shape == (0,) and labels.shape == (0,)
    assert boxes.dtype == np.float32 and scores.dtype == np.float32 and labels.dtype == np.int64


def test_matches_paddle_multiclass_nms3_on_random_boxes():
    rng = np.random.default_rng(0)
    n, a, c = 2, 400, 6
    xy = rng.uniform(0, 200, size=(n, a, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 60, size=(n, a, 2))], -1).astype(np.float32)
    scores = (rng.uniform(size=(n, c, a)) ** 3).astype(np.float32)
    kwargs = dict(score_threshold=0.05, nms_top_k=100, keep_top_k=50, nms_threshold=0.5)
    ours = batch_multiclass_nms(paddle.to_tensor(boxes), paddle.to_tensor(scores), **kwargs)
    out, _, counts = paddle._C_ops.multiclass_nms3(paddle.to_tensor(boxes), paddle.to_tensor(scores), None,
                                                   kwargs["score_threshold"], kwargs["nms_top_k"],
                                                   kwargs["keep_top_k"], kwargs["nms_threshold"], True, 1.0, -1)
    out, counts = out.numpy(), counts.numpy()
    start = 0
    for i, (b, s, lab) in enumerate(ours):
        ref = out[start:start + counts[i]]
        start += counts[i]
        assert len(s) == len(ref) > 10
        ref = ref[np.argsort(-ref[:, 1], kind="stable")]  # the kernel groups by class; we sort by score
        np.testing.assert_array_equal(lab, ref[:, 0].astype(np.int64))
        np.testing.assert_allclose(s, ref[:, 1])
        np.testing.assert_allclose(b, ref[:, 2:])


def test_bad_shapes_are_reported():
    with pytest.raises(ValueError, match=r"boxes must have shape \[A, 4\]"):
        multiclass_nms(np.zeros((4, 5)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"scores must have shape \[C, A\] with A = 4"):
        multiclass_nms(BOXES, np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"boxes \[N, A, 4\] and scores \[N, C, A\]"):
        batch_multiclass_nms(np.zeros((2, 4, 4)), np.zeros((3, 2, 4)))
