"""DB loss against an independent numpy reference on small random maps (fixed seeds)."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from zoo.losses import BalanceLoss, DBLoss, DiceLoss, MaskL1Loss

EPS = 1e-6


# ---- numpy reference ---------------------------------------------------------------------------
def ref_dice(p, g, m):
    return 1 - 2 * (p * g * m).sum() / ((p * m).sum() + (g * m).sum() + EPS)


def ref_l1(p, g, m):
    return (np.abs(p - g) * m).sum() / (m.sum() + EPS)


def ref_bce(p, g):
    return -(g * np.log(p) + (1 - g) * np.log(1 - p))


def ref_balance(loss, g, m, ratio=3):
    """All positives plus the ``ratio * #pos`` largest negative losses, averaged."""
    pos, neg = g * m, (1 - g) * m
    n_pos = int(pos.sum())
    n_neg = int(min(neg.sum(), n_pos * ratio))
    loss = np.broadcast_to(loss, g.shape)
    hardest = np.sort((neg * loss).ravel())[::-1][:n_neg]
    return ((pos * loss).sum() + hardest.sum()) / (n_pos + n_neg + EPS)


def random_case(seed=0, n=2, h=12, w=16, pos_frac=0.15):
    rng = np.random.default_rng(seed)
    maps = rng.uniform(0.02, 0.98, size=(n, 3, h, w)).astype(np.float32)
    batch = {"shrink_map": (rng.random((n, h, w)) < pos_frac).astype(np.float32),
             "shrink_mask": (rng.random((n, h, w)) < 0.9).astype(np.float32),
             "threshold_map": rng.uniform(0.3, 0.7, size=(n, h, w)).astype(np.float32),
             "threshold_mask": (rng.random((n, h, w)) < 0.6).astype(np.float32)}
    return maps, batch


def to_paddle(batch, dtype="float32"):
    return {k: paddle.to_tensor(v.astype(dtype)) for k, v in batch.items()}


def ref_db(maps, b, main="DiceLoss", alpha=5, beta=10):
    g, m = b["shrink_map"], b["shrink_mask"]
    main_loss = ref_dice(maps[:, 0], g, m) if main == "DiceLoss" else ref_bce(maps[:, 0], g)
    shrink = alpha * ref_balance(main_loss, g, m)
    thresh = beta * ref_l1(maps[:, 1], b["threshold_map"], b["threshold_mask"])
    binary = ref_dice(maps[:, 2], g, m)
    return {"loss": shrink + thresh + binary, "loss_shrink_maps": shrink,
            "loss_threshold_maps": thresh, "loss_binary_maps": binary}


# ---- tests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("main", ["DiceLoss", "BCELoss"])
@pytest.mark.parametrize("seed", [0, 1])
def test_db_loss_matches_numpy(main, seed):
    maps, b = random_case(seed)
    out = DBLoss(main_loss_type=main)({"maps": paddle.to_tensor(maps)}, to_paddle(b))
    ref = ref_db(maps.astype(np.float64), {k: v.astype(np.float64) for k, v in b.items()}, main)
    for k, v in ref.items():
        assert float(out[k]) == pytest.approx(v, rel=1e-5, abs=1e-6), k


def test_parts_match_numpy():
    rng = np.random.default_rng(3)
    p, g, m = rng.random((3, 2, 8, 8)).astype(np.float32)
    g, m = (g > 0.5).astype(np.float32), (m > 0.3).astype(np.float32)
    t = [paddle.to_tensor(x) for x in (p, g, m)]
    assert float(DiceLoss()(*t)) == pytest.approx(ref_dice(p, g, m), rel=1e-5)
    assert float(MaskL1Loss()(*t)) == pytest.approx(ref_l1(p, g, m), rel=1e-5)


def test_ohem_keeps_hardest_negatives():
    # one positive (pred 0.8) and five negatives: with ratio 3 the three hardest (0.9, 0.7, 0.5) count
    pred = np.array([[[0.8, 0.1, 0.9, 0.5, 0.7, 0.2]]], np.float32)
    gt = np.array([[[1, 0, 0, 0, 0, 0]]], np.float32)
    mask = np.ones_like(gt)
    loss = BalanceLoss(main_loss_type="BCELoss", negative_ratio=3)
    got = float(loss(*(paddle.to_tensor(x) for x in (pred, gt, mask))))
    want = -(np.log(0.8) + np.log(0.1) + np.log(0.3) + np.log(0.5)) / (4 + EPS)
    assert got == pytest.approx(want, rel=1e-5)
    # masking out the hardest negative (0.9) promotes the next one (0.2)
    mask[0, 0, 2] = 0
    got = float(loss(*(paddle.to_tensor(x) for x in (pred, gt, mask))))
    want = -(np.log(0.8) + np.log(0.3) + np.log(0.5) + np.log(0.8)) / (4 + EPS)
    assert got == pytest.approx(want, rel=1e-5)
    # fewer negatives than 3 x positives: all negatives kept
    gt[0, 0, :4] = 1
    got = float(loss(*(paddle.to_tensor(x) for x in (pred, gt, mask))))
    want = -(np.log([0.8, 0.1, 0.5, 0.3, 0.8])).sum() / (5 + EPS)
    assert got == pytest.approx(want, rel=1e-5)


def test_no_positives_gives_zero_balanced_loss():
    pred = paddle.full([1, 4, 4], 0.7)
    zeros, ones = paddle.zeros([1, 4, 4]), paddle.ones([1, 4, 4])
    assert float(BalanceLoss(main_loss_type="BCELoss")(pred, zeros, ones)) == 0.0


def test_unbalanced_is_masked_mean():
    maps, b = random_case(5)
    p, g, m = maps[:, 0], b["shrink_map"], b["shrink_mask"]
    got = BalanceLoss(balance_loss=False, main_loss_type="BCELoss")(
        *(paddle.to_tensor(x) for x in (p, g, m)))
    want = (ref_bce(p.astype(np.float64), g) * m).sum() / (m.sum() + EPS)
    assert float(got) == pytest.approx(want, rel=1e-5)


def test_float16_inputs_give_float32_loss_and_gradients():
    maps, b = random_case(7)
    x = paddle.to_tensor(maps.astype(np.float16), stop_gradient=False)
    with paddle.amp.auto_cast(enable=True, level="O1"):
        out = DBLoss()({"maps": x}, to_paddle(b, "float16"))
    assert all(v.dtype == paddle.float32 for v in out.values())
    ref = ref_db(maps.astype(np.float16).astype(np.float64),
                 {k: v.astype(np.float64) for k, v in b.items()})
    assert float(out["loss"]) == pytest.approx(ref["loss"], rel=1e-4)
    out["loss"].backward()
    assert x.grad is not None and np.isfinite(x.grad.astype("float32").numpy()).all()


def test_invalid_main_loss_type_lists_choices():
    with pytest.raises(ValueError, match="DiceLoss.*BCELoss.*MaskL1Loss"):
        DBLoss(main_loss_type="Focal")
