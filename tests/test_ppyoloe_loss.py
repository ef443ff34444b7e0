"""PP-YOLOE loss, assigners and box helpers against hand-computed values and NumPy re-implementations."""
from __future__ import annotations

import math

import numpy as np
import paddle
import pytest

from zoo.losses.assigners import ATSSAssigner, TaskAlignedAssigner
from zoo.losses.bbox_utils import batch_iou, bbox2distance, distance2bbox, giou_loss
from zoo.losses.ppyoloe_loss import PPYOLOELoss, distribution_focal_loss, varifocal_loss


def T(x, dtype="float32"):
    return paddle.to_tensor(np.asarray(x, dtype=dtype))


def grid_anchors(size, strides=(32, 16, 8), cell_scale=5.0, offset=0.5):
    """Anchor points, ATSS anchor boxes, strides and counts of a square ``size`` input (as the head makes)."""
    points, boxes, stride_col, counts = [], [], [], []
    for s in strides:
        n = size // s
        ys, xs = np.meshgrid(np.arange(n) + offset, np.arange(n) + offset, indexing="ij")
        p = np.stack([xs * s, ys * s], -1).reshape(-1, 2)
        half = cell_scale * s / 2
        points.append(p)
        boxes.append(np.concatenate([p - half, p + half], -1))
        stride_col.append(np.full((len(p), 1), s))
        counts.append(len(p))
    return [np.concatenate(v).astype("float32") for v in (points, boxes, stride_col)] + [counts]


# ---------------------------------------------------------------- box helpers

def test_iou_and_giou_hand_values():
    a = [[0, 0, 2, 2], [0, 0, 4, 4]]
    b = [[1, 1, 3, 3], [5, 5, 6, 6], [1, 1, 2, 2], [0, 0, 2, 2]]
    ious = batch_iou(T([a]), T([b])).numpy()[0]
    expected = [[1 / 7, 0, 1 / 4, 1], [4 / 16, 0, 1 / 16, 4 / 16]]
    np.testing.assert_allclose(ious, expected, rtol=1e-6, atol=1e-7)
    # GIoU of [0,0,2,2] vs [1,1,3,3]: IoU 1/7, enclosing 3x3 = 9, union 7
    loss = giou_loss(T([[0, 0, 2, 2], [0, 0, 1, 1]]), T([[1, 1, 3, 3], [2, 0, 3, 1]])).numpy()
    # second pair: disjoint, enclosing 3x1 = 3, union 2 -> GIoU = 0 - 1/3
    np.testing.assert_allclose(loss, [1 - (1 / 7 - 2 / 9), 1 + 1 / 3], rtol=1e-6)


def test_distance_box_round_trip_and_clip():
    points = T([[5.0, 5.0], [1.0, 2.0]])
    dist = T([[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 20.0, 0.0]])
    boxes = distance2bbox(points, dist).numpy()
    np.testing.assert_allclose(boxes, [[4, 3, 8, 9], [0.5, 1.5, 21, 2]])
    np.testing.assert_allclose(bbox2distance(points, T(boxes)).numpy(), dist.numpy(), atol=1e-6)
    clipped = bbox2distance(points, T(boxes), max_dis=16).numpy()
    np.testing.assert_allclose(clipped[1], [0.5, 0.5, 15.99, 0.0], atol=1e-6)
    outside = bbox2distance(T([[0.0, 0.0]]), T([[1.0, 1.0, 3.0, 3.0]]), max_dis=16).numpy()
    np.testing.assert_allclose(outside, [[0.0, 0.0, 3.0, 3.0]])  # negative distances clip to 0


# ---------------------------------------------------------------- DFL and VFL

def test_dfl_interpolates_between_the_two_nearest_bins():
    logits = np.linspace(-1.0, 2.0, 17).astype("float32") ** 2  # any fixed distribution
    p = np.exp(logits) / np.exp(logits).sum()
    log_probs = paddle.nn.functional.log_softmax(T(np.tile(logits, (4, 1))), axis=-1)
    loss = float(distribution_focal_loss(log_probs, T([3.4, 3.4, 3.4, 3.4])))
    assert loss == pytest.approx(-(0.6 * math.log(p[3]) + 0.4 * math.log(p[4])), rel=1e-5)
    # the mean runs over the four sides; an integer target puts all weight on one bin
    sides = float(distribution_focal_loss(log_probs, T([3.4, 0.0, 7.0, 15.99])))
    expected = np.mean([-(0.6 * math.log(p[3]) + 0.4 * math.log(p[4])), -math.log(p[0]), -math.log(p[7]),
                        -(0.01 * math.log(p[15]) + 0.99 * math.log(p[16]))])
    assert sides == pytest.approx(expected, rel=1e-5)


def _np_vfl(logits, q, label, alpha=0.75, gamma=2.0):
    """Upstream's formula: BCE on sigmoid scores, weight alpha*p^g*(1-label) + q*label."""
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    bce = -(q * np.log(p) + (1 - q) * np.log(1 - p))
    return float((bce * (alpha * p ** gamma * (1 - label) + q * label)).sum())


def test_vfl_equals_upstream_formula_on_random_case():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, size=(2, 30, 5)).astype("float32")
    label = (rng.uniform(size=(2, 30, 5)) < 0.2).astype("float32")
    q = (label * rng.uniform(0.1, 1.0, size=label.shape)).astype("float32")
    got = float(varifocal_loss(T(logits), T(q), T(label)))
    assert got == pytest.approx(_np_vfl(logits, q, label), rel=1e-5)
    # the weight is not detached (as upstream): the gradient matches central differences of the formula
    x = T(logits)
    x.stop_gradient = False
    varifocal_loss(x, T(q), T(label)).backward()
    h = 1e-4
    idx = [(0, 0, 0), (0, 3, 2), (1, 7, 4), (1, 29, 1)]
    for i in idx:
        up, down = logits.astype(np.float64), logits.astype(np.float64)
        up[i] += h
        down[i] -= h
        numeric = (_np_vfl(up, q, label) - _np_vfl(down, q, label)) / (2 * h)
        assert float(x.grad.numpy()[i]) == pytest.approx(numeric, rel=1e-3, abs=1e-5)
    # where sigmoid saturates in float32 the logits form stays exact: logit 40, target 0.5 -> 20 + ~0
    sat = float(varifocal_loss(T([40.0]), T([0.5]), T([1.0])))
    assert sat == pytest.approx(0.5 * (np.logaddexp(0, 40.0) - 40.0 * 0.5), rel=1e-6)


# ---------------------------------------------------------------- ATSS

def test_atss_keeps_only_candidates_above_mean_plus_std():
    # GT [0,0,10,10]; topk 3 picks a0, a1, a2 (nearest centres); IoUs 1, 64/136, 36/164:
    # threshold = mean + unbiased std = 0.9619, so only a0 is positive; a3 is never a candidate.
    anchors = [[0, 0, 10, 10], [2, 2, 12, 12], [-4, -4, 6, 6], [20, 20, 30, 30]]
    labels, boxes, scores = ATSSAssigner(topk=3, num_classes=3)(
        T(anchors), [4], T([[[2]]], "int64"), T([[[0, 0, 10, 10]]]), T([[[1]]]))
    np.testing.assert_array_equal(labels.numpy(), [[2, 3, 3, 3]])
    np.testing.assert_allclose(boxes.numpy()[0, 0], [0, 0, 10, 10])
    np.testing.assert_allclose(scores.numpy()[0], [[0, 0, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0]])


def test_atss_threshold_uses_unbiased_std():
    # candidates (topk 5) have IoUs 1, 0.85, 0.04 x3: mean 0.394, unbiased std 0.4876 -> threshold 0.8816,
    # so the 0.85 anchor is not positive (a biased std, 0.4361, would have let it in at 0.8301)
    anchors = [[0, 0, 10, 10], [0, 0, 10, 8.5], [4, 4, 6, 6], [3, 3, 5, 5], [5, 5, 7, 7], [50, 50, 60, 60]]
    labels, _, _ = ATSSAssigner(topk=5, num_classes=1)(
        T(anchors), [6], T([[[0]]], "int64"), T([[[0, 0, 10, 10]]]), T([[[1]]]))
    np.testing.assert_array_equal(labels.numpy(), [[0, 1, 1, 1, 1, 1]])


def test_atss_anchor_centre_must_be_inside_gt():
    # candidates (topk 4): three tiny anchors (IoU 0.04) and a0 (IoU 100/206.04 = 0.485);
    # threshold 0.151 + 0.223 = 0.374, a0 passes it, but its centre (0, 5) is on the GT edge.
    anchors = [[-10.1, -0.1, 10.1, 10.1], [4, 4, 6, 6], [3, 3, 5, 5], [5, 5, 7, 7], [50, 50, 60, 60]]
    gt = (T([[[1]]], "int64"), T([[[0, 0, 10, 10]]]), T([[[1]]]))
    labels, _, scores = ATSSAssigner(topk=4, num_classes=2)(T(anchors), [5], *gt)
    np.testing.assert_array_equal(labels.numpy(), [[2, 2, 2, 2, 2]])
    assert float(scores.sum()) == 0.0
    anchors[0] = [-10.0, -0.1, 10.2, 10.1]  # same IoU, centre (0.1, 5) now inside
    labels, _, _ = ATSSAssigner(topk=4, num_classes=2)(T(anchors), [5], *gt)
    np.testing.assert_array_equal(labels.numpy(), [[1, 2, 2, 2, 2]])


def test_atss_anchor_claimed_by_two_gts_goes_to_higher_iou():
    # a0 [1.5,0,11.5,10] (centre 6.5,5) is inside both GTs; IoU 85/115 with GT0, 95/105 with GT1.
    # With topk 3 each GT's candidates are a0 and the two tiny anchors, so a0 passes both thresholds.
    anchors = [[1.5, 0, 11.5, 10], [4.5, 4.5, 5.5, 5.5], [6.5, 4.5, 7.5, 5.5], [40, 40, 50, 50]]
    labels, boxes, scores = ATSSAssigner(topk=3, num_classes=2)(
        T(anchors), [4], T([[[0], [1]]], "int64"), T([[[0, 0, 10, 10], [2, 0, 12, 10]]]), T([[[1], [1]]]),
        pred_bboxes=T([anchors]))
    np.testing.assert_array_equal(labels.numpy(), [[1, 2, 2, 2]])
    np.testing.assert_allclose(boxes.numpy()[0, 0], [2, 0, 12, 10])
    # with predicted boxes the positive's score is IoU(pred, its GT) = 95/105
    np.testing.assert_allclose(scores.numpy()[0, 0], [0, 95 / 105], rtol=1e-6)
    assert float(scores.numpy()[0, 1:].sum()) == 0.0


def test_atss_multi_level_topk_and_padding():
    # two levels; the padded GT row (mask 0) is identical to the real one but must assign nothing
    anchors = [[0, 0, 10, 10], [30, 30, 40, 40], [2, 2, 12, 12], [-4, -4, 6, 6], [20, 20, 30, 30]]
    labels, _, _ = ATSSAssigner(topk=2, num_classes=4)(
        T(anchors), [2, 3], T([[[1], [3]]], "int64"), T([[[0, 0, 10, 10], [0, 0, 10, 10]]]), T([[[1], [0]]]))
    # candidates: level 1 -> a0, a1 ; level 2 -> a2, a3. IoUs 1, 0, 64/136, 36/164: thr 0.4225 + 0.4303
    np.testing.assert_array_equal(labels.numpy(), [[1, 4, 4, 4, 4]])


@pytest.mark.parametrize("assigner", ["atss", "tal"])
def test_assigners_with_no_gt(assigner):
    points, boxes, _, counts = grid_anchors(64)
    a = len(points)
    for m in (0, 2):  # no GT rows at all, and only padding rows
        gt = (paddle.zeros([2, m, 1], "int64"), paddle.zeros([2, m, 4]), paddle.zeros([2, m, 1]))
        if assigner == "atss":
            out = ATSSAssigner(topk=9, num_classes=5)(T(boxes), counts, *gt)
        else:
            out = TaskAlignedAssigner()(paddle.rand([2, a, 5]), T(np.tile(boxes, (2, 1, 1))), T(points), counts, *gt)
        labels, bboxes, scores = out
        assert labels.shape == [2, a] and bboxes.shape == [2, a, 4] and scores.shape == [2, a, 5]
        assert (labels.numpy() == 5).all() and float(scores.abs().sum()) == 0.0


# ---------------------------------------------------------------- TAL

def test_tal_metric_topk_centre_and_normalised_scores():
    # GT [0,0,10,10], class 0. Anchors p3 (outside) and p4 (on the edge) have the best metric but
    # are excluded by the centre rule. Metrics s * iou^6: p0 0.2*0.9^6 = 0.1063, p1 0.9*0.64^6 = 0.0618,
    # p2 0.5*(81/119)^6 = 0.0497 -> top-2 = p0, p1.
    points = [[5, 5], [3, 3], [8, 8], [15, 5], [0, 5]]
    pred = [[0, 0, 10, 9], [0, 0, 8, 8], [1, 1, 11, 11], [0, 0, 10, 10], [0, 0, 10, 10]]
    scores = np.zeros((1, 5, 2), "float32")
    scores[0, :, 0] = [0.2, 0.9, 0.5, 0.99, 0.99]
    scores[0, :, 1] = 0.7
    labels, boxes, assigned = TaskAlignedAssigner(topk=2, alpha=1.0, beta=6.0)(
        T(scores), T([pred]), T(points), [5], T([[[0]]], "int32"), T([[[0, 0, 10, 10]]]), T([[[1]]]))
    np.testing.assert_array_equal(labels.numpy(), [[0, 0, 2, 2, 2]])
    t0, t1 = 0.2 * 0.9 ** 6, 0.9 * 0.64 ** 6
    # normalised: t / max_t * max IoU over the GT's positives (0.9); the best positive gets 0.9
    np.testing.assert_allclose(assigned.numpy()[0, :, 0], [0.9, t1 / t0 * 0.9, 0, 0, 0], rtol=1e-5)
    assert float(assigned.numpy()[0, :, 1].sum()) == 0.0
    np.testing.assert_allclose(boxes.numpy()[0, :2], [[0, 0, 10, 10]] * 2)


def test_tal_alpha_beta_change_the_ranking():
    # same case, alpha 1, beta 0 -> metric = score only: p1 (0.9) and p2 (0.5) win over p0 (0.2)
    points = [[5, 5], [3, 3], [8, 8]]
    pred = [[0, 0, 10, 9], [0, 0, 8, 8], [1, 1, 11, 11]]
    scores = np.array([[[0.2], [0.9], [0.5]]], "float32")
    labels, _, assigned = TaskAlignedAssigner(topk=2, alpha=1.0, beta=0.0)(
        T(scores), T([pred]), T(points), [3], T([[[0]]], "int64"), T([[[0, 0, 10, 10]]]), T([[[1]]]))
    np.testing.assert_array_equal(labels.numpy(), [[1, 0, 0]])
    max_iou = max(0.64, 81 / 119)
    np.testing.assert_allclose(assigned.numpy()[0, :, 0], [0, max_iou, 0.5 / 0.9 * max_iou], rtol=1e-5)


def test_tal_anchor_claimed_by_two_gts_goes_to_higher_iou():
    # anchor (5,5) is inside both GTs; its box [1,1,9,9] has IoU 0.64 with GT0 and 0.8 with GT1
    labels, boxes, assigned = TaskAlignedAssigner(topk=1)(
        T([[[0.5, 0.5], [0.5, 0.5]]]), T([[[1, 1, 9, 9], [50, 50, 60, 60]]]), T([[5, 5], [55, 55]]), [2],
        T([[[0], [1]]], "int64"), T([[[0, 0, 10, 10], [1, 0, 9, 10]]]), T([[[1], [1]]]))
    np.testing.assert_array_equal(labels.numpy(), [[1, 2]])
    np.testing.assert_allclose(boxes.numpy()[0, 0], [1, 0, 9, 10])
    np.testing.assert_allclose(assigned.numpy()[0, 0], [0, 0.8], rtol=1e-5)


# ---------------------------------------------------------------- whole loss

def _random_case(seed=0, size=96, num_classes=3, reg_max=16):
    rng = np.random.default_rng(seed)
    points, boxes, strides, counts = grid_anchors(size)
    n, a = 2, len(points)
    cls = rng.normal(0, 1, size=(n, a, num_classes)).astype("float32")
    reg = rng.normal(0, 1, size=(n, a, 4 * (reg_max + 1))).astype("float32")
    gt_bbox = np.zeros((n, 3, 4), "float32")
    gt_bbox[0, 0] = [8, 10, 60, 70]
    gt_bbox[0, 1] = [40, 30, 90, 88]
    gt_class = np.zeros((n, 3, 1), "int32")
    gt_class[0, 1] = 2
    pad = np.zeros((n, 3, 1), "float32")
    pad[0, :2] = 1  # image 1 has no real boxes
    outputs = dict(cls_logits=cls, reg_distri=reg, anchor_points=points, stride_tensor=strides, anchors=boxes,
                   num_anchors_list=counts)
    targets = dict(gt_class=gt_class, gt_bbox=gt_bbox, pad_gt_mask=pad)
    return outputs, targets


def _to_paddle(outputs, targets):
    o = {k: (v if k == "num_anchors_list" else T(v, v.dtype)) for k, v in outputs.items()}
    o["cls_logits"].stop_gradient = False
    o["reg_distri"].stop_gradient = False
    return o, {k: T(v, v.dtype) for k, v in targets.items()}


def _np_giou(p, g):
    w = np.clip(np.minimum(p[:, 2], g[:, 2]) - np.maximum(p[:, 0], g[:, 0]), 0, None)
    h = np.clip(np.minimum(p[:, 3], g[:, 3]) - np.maximum(p[:, 1], g[:, 1]), 0, None)
    inter = w * h
    union = (p[:, 2] - p[:, 0]) * (p[:, 3] - p[:, 1]) + (g[:, 2] - g[:, 0]) * (g[:, 3] - g[:, 1]) - inter
    enc = (np.maximum(p[:, 2], g[:, 2]) - np.minimum(p[:, 0], g[:, 0])) * \
        (np.maximum(p[:, 3], g[:, 3]) - np.minimum(p[:, 1], g[:, 1]))
    return 1 - (inter / union - (enc - union) / enc)


def test_loss_matches_numpy_reimplementation_given_the_assignment():
    outputs, targets = _random_case(seed=1)
    n, a, c = outputs["cls_logits"].shape
    r = 16
    o, t = _to_paddle(outputs, targets)
    got = PPYOLOELoss(num_classes=c)(o, t, epoch=0)

    # NumPy: decode, then the upstream formulas on the ATSS assignment
    logits = outputs["reg_distri"].reshape(n, a, 4, r + 1).astype(np.float64)
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    stride = outputs["stride_tensor"]
    pts_s = outputs["anchor_points"] / stride
    dist = prob @ np.arange(r + 1)
    pred = np.concatenate([pts_s - dist[..., :2], pts_s + dist[..., 2:]], -1)  # stride units
    labels, boxes, scores = (x.numpy() for x in ATSSAssigner(9, c)(
        o["anchors"], outputs["num_anchors_list"], t["gt_class"].astype("int64"), t["gt_bbox"], t["pad_gt_mask"],
        pred_bboxes=T(pred * stride)))
    boxes = boxes / stride
    one_hot = np.eye(c + 1)[labels][..., :c]
    norm = max(scores.sum(), 1.0)
    loss_cls = _np_vfl(outputs["cls_logits"], scores, one_hot) / norm
    pos = labels != c
    weight = scores.sum(-1)[pos]
    loss_iou = (_np_giou(pred[pos], boxes[pos]) * weight).sum() / norm
    target = np.clip(np.concatenate([pts_s - boxes[..., :2], boxes[..., 2:] - pts_s], -1), 0, r - 0.01)[pos]
    lp = np.log(prob[pos])
    left = np.floor(target).astype(int)
    wl = left + 1 - target
    take = lambda idx: np.take_along_axis(lp, idx[..., None], -1)[..., 0]  # noqa: E731
    dfl = -(take(left) * wl + take(left + 1) * (1 - wl)).mean(-1)
    loss_dfl = (dfl * weight).sum() / norm
    assert pos.sum() > 0
    assert float(got["loss_cls"]) == pytest.approx(loss_cls, rel=1e-4)
    assert float(got["loss_iou"]) == pytest.approx(loss_iou, rel=1e-4)
    assert float(got["loss_dfl"]) == pytest.approx(loss_dfl, rel=1e-4)
    assert float(got["loss"]) == pytest.approx(loss_cls + 2.5 * loss_iou + 0.5 * loss_dfl, rel=1e-4)
    assert float(got["loss_l1"]) == pytest.approx(np.abs(pred[pos] - boxes[pos]).mean(), rel=1e-4)


def test_dfl_target_is_clipped_below_reg_max():
    # stride 1, one anchor at (20, 20) inside GT [0,0,40,40]: the target distance 20 per side exceeds
    # reg_max 16 and is clipped to 15.99 -> DFL = -(0.01 log p15 + 0.99 log p16) per side.
    # ATSS (topk 3): the anchor box equals the GT (IoU 1); two tiny anchors make the threshold 0.91.
    rng = np.random.default_rng(7)
    reg = rng.normal(0, 1, size=(1, 3, 4 * 17)).astype("float32")
    points = np.array([[20, 20], [10, 10], [30, 30]], "float32")
    boxes = np.array([[0, 0, 40, 40], [9, 9, 11, 11], [29, 29, 31, 31]], "float32")
    outputs = dict(cls_logits=np.zeros((1, 3, 1), "float32"), reg_distri=reg, anchor_points=points,
                   stride_tensor=np.ones((3, 1), "float32"), anchors=boxes, num_anchors_list=[3])
    targets = dict(gt_class=np.zeros((1, 1, 1), "int64"), gt_bbox=np.array([[[0, 0, 40, 40]]], "float32"),
                   pad_gt_mask=np.ones((1, 1, 1), "float32"))
    out = PPYOLOELoss(num_classes=1, atss_topk=3)(*_to_paddle(outputs, targets), epoch=0)
    logits = reg[0, 0].reshape(4, 17).astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    dist = np.exp(logp) @ np.arange(17)
    pred = np.array([20 - dist[0], 20 - dist[1], 20 + dist[2], 20 + dist[3]])
    score = float(1 - _np_giou(pred[None], np.array([[0, 0, 40, 40.0]]))[0])  # pred lies inside: GIoU = IoU
    dfl = -(0.01 * logp[:, 15] + 0.99 * logp[:, 16]).mean()
    assert float(out["loss_dfl"]) == pytest.approx(dfl * score / max(score, 1.0), rel=1e-4)


@pytest.mark.parametrize("epoch", [0, 100])  # ATSS, then TAL (static_assigner_epoch = 100)
def test_loss_finite_positive_and_differentiable(epoch):
    outputs, targets = _random_case(seed=2)
    o, t = _to_paddle(outputs, targets)
    out = PPYOLOELoss(num_classes=3, static_assigner_epoch=100)(o, t, epoch=epoch)
    assert set(out) == {"loss", "loss_cls", "loss_iou", "loss_dfl", "loss_l1"}
    for k, v in out.items():
        assert v.shape == [] and v.dtype == paddle.float32 and np.isfinite(float(v)), k
        assert float(v) > 0, k
    out["loss"].backward()
    for k in ("cls_logits", "reg_distri"):
        g = o[k].grad.numpy()
        assert np.isfinite(g).all() and np.abs(g).sum() > 0, k
    # image 1 has no real GT: its regression logits get no gradient, its class logits do (background)
    assert np.abs(o["reg_distri"].grad.numpy()[1]).sum() == 0
    assert np.abs(o["cls_logits"].grad.numpy()[1]).sum() > 0


def test_tal_phase_uses_predictions():
    # TAL depends on the predicted scores; ATSS (with the same boxes) does not depend on them
    outputs, targets = _random_case(seed=3)
    loss = PPYOLOELoss(num_classes=3)
    shifted = dict(outputs, cls_logits=outputs["cls_logits"] * 3.0)
    atss = [float(loss(*_to_paddle(x, targets), epoch=0)["loss_iou"]) for x in (outputs, shifted)]
    tal = [float(loss(*_to_paddle(x, targets), epoch=100)["loss_iou"]) for x in (outputs, shifted)]
    assert atss[0] == pytest.approx(atss[1], rel=1e-6)
    assert tal[0] != pytest.approx(tal[1], rel=1e-3)


@pytest.mark.parametrize("epoch", [0, 100])
def test_loss_batch_without_any_gt_is_classification_only(epoch):
    outputs, _ = _random_case(seed=4)
    targets = dict(gt_class=np.zeros((2, 0, 1), "int64"), gt_bbox=np.zeros((2, 0, 4), "float32"),
                   pad_gt_mask=np.zeros((2, 0, 1), "float32"))
    o, t = _to_paddle(outputs, targets)
    out = PPYOLOELoss(num_classes=3)(o, t, epoch=epoch)
    assert float(out["loss_iou"]) == 0.0 and float(out["loss_dfl"]) == 0.0
    # all background: VFL = sum alpha * p^2 * BCE(p, 0), normaliser clipped to 1
    zeros = np.zeros_like(outputs["cls_logits"])
    assert float(out["loss"]) == pytest.approx(_np_vfl(outputs["cls_logits"], zeros, zeros), rel=1e-5)
    out["loss"].backward()
    assert np.isfinite(o["reg_distri"].grad.numpy()).all()


def test_loss_is_float32_under_autocast_and_with_half_inputs():
    outputs, targets = _random_case(seed=5)
    o, t = _to_paddle(outputs, targets)
    ref = PPYOLOELoss(num_classes=3)(o, t, epoch=0)
    half = dict(o, cls_logits=o["cls_logits"].astype("float16"), reg_distri=o["reg_distri"].astype("float16"))
    with paddle.amp.auto_cast():
        out = PPYOLOELoss(num_classes=3)(half, t, epoch=0)
    for k, v in out.items():
        assert v.dtype == paddle.float32, k
        assert float(v) == pytest.approx(float(ref[k]), rel=2e-2), k  # inputs rounded to half
    out["loss"].backward()
    assert o["cls_logits"].grad.dtype == paddle.float32 and np.isfinite(o["cls_logits"].grad.numpy()).all()


def test_loss_reports_bad_input():
    outputs, targets = _random_case(seed=6)
    loss = PPYOLOELoss(num_classes=3)
    with pytest.raises(KeyError, match="pad_gt_mask"):
        loss(*_to_paddle(outputs, {k: v for k, v in targets.items() if k != "pad_gt_mask"}), epoch=0)
    with pytest.raises(ValueError, match=r"reg_distri.*expected"):
        loss(*_to_paddle(dict(outputs, reg_distri=outputs["reg_distri"][..., :60]), targets), epoch=0)
    bad = dict(targets, gt_class=targets["gt_class"] + 5)
    with pytest.raises(ValueError, match=r"gt_class'\]\[0, 0\] = 5 .*0\.\.2"):
        loss(*_to_paddle(outputs, bad), epoch=0)
    with pytest.raises(ValueError, match="num_anchors_list"):
        loss(*_to_paddle(dict(outputs, num_anchors_list=[1, 2, 3]), targets), epoch=0)
    with pytest.raises(ValueError, match="loss_weight"):
        PPYOLOELoss(num_classes=3, loss_weight={"cls": 1.0})
