"""ICDAR IoU evaluator on hand-made boxes, and DBTask end to end on a fake model."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from zoo.metrics.det_iou import DetectionIoUEvaluator, sum_counts
from zoo.tasks import DBTask


def rect(x0, y0, x1, y1):
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


EV = DetectionIoUEvaluator()


def counts(gts, dets, ignore=None):
    ignore = [0] * len(gts) if ignore is None else ignore
    return EV.evaluate_image(gts, ignore, dets)


def test_perfect_prediction_hmean_one():
    gts = [rect(0, 0, 10, 10), rect(20, 0, 40, 8)]
    c = counts(gts, [g.copy() for g in gts[::-1]])
    assert c == {"gt_care": 2.0, "det_care": 2.0, "matched": 2.0}
    assert EV.combine(c) == {"precision": 1.0, "recall": 1.0, "hmean": 1.0}


def test_one_of_two_found():
    m = EV.combine(counts([rect(0, 0, 10, 10), rect(20, 0, 40, 8)], [rect(0, 0, 10, 10)]))
    assert m["recall"] == 0.5 and m["precision"] == 1.0
    assert m["hmean"] == pytest.approx(2 / 3)


def test_detection_on_dont_care_is_not_counted():
    gts = [rect(0, 0, 10, 10), rect(50, 50, 70, 60)]
    dets = [rect(0, 0, 10, 10), rect(51, 50, 70, 60)]  # second: 95% inside the ignored gt
    c = counts(gts, dets, ignore=[0, 1])
    assert c == {"gt_care": 1.0, "det_care": 1.0, "matched": 1.0}
    # a detection only half inside the don't-care region (area precision 0.5, not > 0.5) counts
    c = counts(gts, [rect(0, 0, 10, 10), rect(60, 50, 80, 60)], ignore=[0, 1])
    assert c == {"gt_care": 1.0, "det_care": 2.0, "matched": 1.0}


@pytest.mark.parametrize("width, hit", [(4.9, 0.0), (5.0, 0.0), (5.1, 1.0)])
def test_iou_threshold_is_strict(width, hit):
    # the detection lies inside the 10x10 gt, so IoU = width / 10
    c = counts([rect(0, 0, 10, 10)], [rect(0, 0, width, 10)])
    assert c["matched"] == hit


def test_detection_covering_two_gts_counts_once():
    gts = [rect(0, 0, 10, 10), rect(0, 0, 10, 11)]
    c = counts(gts, [rect(0, 0, 10, 10.5)])
    assert c == {"gt_care": 2.0, "det_care": 1.0, "matched": 1.0}
    # and two detections on one gt: one match, one false positive
    c = counts([rect(0, 0, 10, 10)], [rect(0, 0, 10, 10), rect(0, 0, 10, 9)])
    assert c == {"gt_care": 1.0, "det_care": 2.0, "matched": 1.0}


def test_greedy_matching_in_order():
    # gt0 takes det0, the first detection above 0.5 (IoU 0.7), although det1 fits it exactly;
    # gt1 would match only det0 (IoU 0.57; 0.4 with det1), so it stays unmatched: 1, not the
    # optimal 2. This is upstream's greedy rule.
    gts = [rect(0, 0, 10, 10), rect(0, 0, 10, 4)]
    assert counts(gts, [rect(0, 0, 10, 7), rect(0, 0, 10, 10)])["matched"] == 1.0
    assert counts(gts, [rect(0, 0, 10, 10), rect(0, 0, 10, 7)])["matched"] == 2.0


def test_invalid_polygons_are_dropped():
    bowtie = np.array([[0, 0], [10, 10], [10, 0], [0, 10]], dtype=np.float64)
    c = counts([rect(0, 0, 10, 10), bowtie], [bowtie, rect(0, 0, 10, 10), np.zeros((4, 2))])
    assert c == {"gt_care": 1.0, "det_care": 1.0, "matched": 1.0}


def test_combine_pools_and_handles_empty():
    per_image = [counts([rect(0, 0, 10, 10)], [rect(0, 0, 10, 10)]),
                 counts([rect(0, 0, 10, 10), rect(20, 20, 30, 30)], [rect(50, 50, 60, 60)])]
    m = EV.combine(sum_counts(per_image))
    assert m["recall"] == pytest.approx(1 / 3) and m["precision"] == pytest.approx(1 / 2)
    assert EV.combine(sum_counts([])) == {"precision": 0.0, "recall": 0.0, "hmean": 0.0}


class FixedMap(paddle.nn.Layer):
    """Stands in for a DB model: eval mode returns a fixed probability map."""

    def __init__(self, prob):
        super().__init__()
        self.prob = paddle.to_tensor(prob)

    def forward(self, image):
        if self.training:
            return {"maps": paddle.concat([self.prob] * 3, axis=1)}
        return {"maps": self.prob}


def _eval_batch(prob_shape=(2, 1, 64, 64)):
    """Two 64x64 inputs from 128x128 sources; image 0 has two text boxes, image 1 has one + a ###."""
    n, _, h, w = prob_shape
    prob = np.zeros(prob_shape, np.float32)
    prob[0, 0, 10:20, 8:40] = 0.9
    prob[0, 0, 40:50, 20:56] = 0.9
    prob[1, 0, 30:40, 10:50] = 0.9
    polys = np.zeros((n, 3, 4, 2), np.float32)
    # sources are twice the map size; gts roughly where the unclipped boxes land
    polys[0, 0], polys[0, 1] = rect(8, 12, 88, 48), rect(32, 72, 120, 108)
    polys[1, 0], polys[1, 1] = rect(12, 52, 108, 88), rect(0, 0, 20, 20)
    batch = {"image": paddle.zeros([n, 3, h, w]),
             "shape": paddle.to_tensor(np.array([[128, 128, 0.5, 0.5]] * n, np.float32)),
             "polys": paddle.to_tensor(polys),
             "ignore": paddle.to_tensor(np.array([[0, 0, 0], [0, 1, 0]], np.int64)),
             "num_polys": paddle.to_tensor(np.array([2, 2], np.int64))}
    return prob, batch


def test_db_task_eval_stats_on_fixed_map(tmp_path):
    prob, batch = _eval_batch()
    model = FixedMap(prob)
    model.eval()
    task = DBTask(postprocess={"box_thresh": 0.6})
    stats = task.eval_stats(model, batch)
    assert stats == {"gt_care": 3.0, "det_care": 3.0, "matched": 3.0, "num_images": 2.0}
    metrics = task.compute_metrics(stats)
    assert metrics == {"precision": 1.0, "recall": 1.0, "hmean": 1.0, "num_images": 2}
    assert DBTask.primary_metric == "hmean"

    # a model that finds nothing: recall 0, hmean 0
    empty = FixedMap(np.zeros_like(prob))
    empty.eval()
    assert task.compute_metrics(task.eval_stats(empty, batch))["hmean"] == 0.0

    model.train()
    paths = task.draw(model, batch, tmp_path / "draw", prefix="val")
    assert model.training and [p.name for p in paths] == ["val_0.png", "val_1.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_db_task_losses_and_kwargs():
    from omegaconf import OmegaConf

    prob, _ = _eval_batch()
    model = FixedMap(prob)
    model.train()
    cfg = OmegaConf.create({"loss": {"alpha": 2, "beta": 0}, "postprocess": {"box_thresh": 0.5}})
    task = DBTask(loss=cfg.loss, postprocess=cfg.postprocess)
    assert task.loss.alpha == 2.0 and task.postprocess.box_thresh == 0.5
    label = (prob[:, 0] > 0.5).astype(np.float32)
    batch = {"image": paddle.zeros([2, 3, 64, 64]), "shrink_map": paddle.to_tensor(label),
             "shrink_mask": paddle.ones([2, 64, 64]), "threshold_map": paddle.zeros([2, 64, 64]),
             "threshold_mask": paddle.ones([2, 64, 64])}
    losses = task.losses(model, batch)
    assert set(losses) == {"loss", "loss_shrink_maps", "loss_threshold_maps", "loss_binary_maps"}
    assert float(losses["loss_threshold_maps"]) == 0.0
    with pytest.raises(ValueError, match="model.task"):
        DBTask(postprocess={"box_treshold": 0.5})
