"""Issue 15 items 2-3: decode once in the model's channel order, normalise in one pass, and
uint8 batches normalised where they land (data.builder.normalize_on=device)."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
from test_text_det_data import _write_root

from zoo.data.images import read_image_bgr, read_image_rgb
from zoo.data.transforms import normalize_chw

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _three_step(img, mean, std):  # the previous implementation
    out = (img.astype(np.float32) / np.float32(255.0) - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(out.transpose(2, 0, 1))


def test_bgr_decode_equals_the_rgb_round_trip(tmp_path):
    img = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    for ext in (".png", ".jpg"):
        cv2.imwrite(str(tmp_path / f"a{ext}"), img)
        bgr = read_image_bgr(tmp_path / f"a{ext}")
        assert np.array_equal(bgr, read_image_rgb(tmp_path / f"a{ext}")[..., ::-1])
    assert np.array_equal(read_image_bgr(tmp_path / "a.png"), img)  # lossless: exactly what was written


def test_normalize_chw_matches_the_three_step_formula():
    img = np.random.default_rng(1).integers(0, 256, (41, 29, 3), dtype=np.uint8)
    new, old = normalize_chw(img, MEAN, STD), _three_step(img, MEAN, STD)
    assert new.dtype == np.float32 and new.shape == (3, 41, 29) and new.flags.c_contiguous
    assert np.abs(new - old).max() < 1e-6
    # channel k uses mean[k], std[k] (a swapped channel would be off by ~0.1)
    assert np.allclose(new[2, 0, 0], (img[0, 0, 2] / 255 - MEAN[2]) / STD[2], atol=1e-6)


def test_device_normalisation_gives_the_host_batch(tmp_path):
    from zoo.data.sampler import EvalBatchSampler, TrainBatchSampler, build_loader
    from zoo.data.text_det.dataset import TextDetData

    host = _write_root(tmp_path, n=4)
    dev = TextDetData(tmp_path, train_label="train.txt", val_label="val.txt", crop_size=32, eval_size=(48, 64),
                      max_polys=4, normalize_on="device")
    for split, sampler in (("train", lambda: TrainBatchSampler(4, 2, seed=0, stop_step=1)),
                           ("val", lambda: EvalBatchSampler(4, 2))):
        d = dev.build(split, 0)
        assert d[0]["image"].dtype == np.uint8 and d.device_normalize == (MEAN, STD)
        a = next(iter(build_loader(host.build(split, 0), sampler())))["image"].numpy()
        b = next(iter(build_loader(d, sampler())))["image"].numpy()
        assert b.dtype == np.float32 and np.abs(a - b).max() < 1e-5


def test_normalize_on_rejects_other_values(tmp_path):
    from zoo.data.text_det.dataset import TextDetData

    with pytest.raises(ValueError, match="normalize_on"):
        TextDetData(tmp_path, normalize_on="gpu")


# ---------------------------------------------------------------- geometry in one warp (item 1)

def _scene(seed, h=150, w=200):
    from test_text_det_data import _poly_image

    rng = np.random.default_rng(100 + seed)
    polys = []
    for _ in range(5):
        x0, y0 = rng.uniform(5, w - 60), rng.uniform(5, h - 30)
        bw, bh = rng.uniform(15, 50), rng.uniform(6, 20)
        polys.append([[x0, y0], [x0 + bw, y0 + 1], [x0 + bw - 1, y0 + bh], [x0, y0 + bh - 1]])
    polys = np.array(polys, np.float64)
    # smooth texture under the text so the interpolation difference is measured on real content
    texture = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (9, 9), 3)
    img = np.maximum(_poly_image(polys, h, w), texture // 2)
    return img, polys, np.array([False, False, True, False, False])


@pytest.mark.parametrize("seed", range(12))
def test_one_warp_gives_the_sequential_polygons_and_almost_the_image(seed):
    from zoo.data.text_det.geometry import augment_and_crop, east_random_crop, iaa_augment

    img, polys, ignore = _scene(seed)
    one = augment_and_crop(img, polys, ignore, np.random.default_rng(seed), size=96, scale=(0.5, 2.0))
    rng = np.random.default_rng(seed)
    aug, aug_polys = iaa_augment(img, polys, rng, scale=(0.5, 2.0))
    seq = east_random_crop(aug, aug_polys, ignore, rng, size=96)
    # same draws, same crop, same kept polygons: bit-identical labels
    assert np.array_equal(one[1], seq[1]) and np.array_equal(one[2], seq[2])
    # The image: on smooth content the interpolation order hardly matters, so a wrong matrix shows.
    smooth = cv2.GaussianBlur(img, (0, 0), 6)
    one_s = augment_and_crop(smooth, polys, ignore, np.random.default_rng(seed), size=96, scale=(0.5, 2.0))[0]
    rng = np.random.default_rng(seed)
    seq_s = east_random_crop(*iaa_augment(smooth, polys, rng, scale=(0.5, 2.0)), ignore, rng, size=96)[0]
    inner = np.s_[2:-2, 2:-2]  # pixels at the rotated canvas's edge interpolate with black differently
    diff = np.abs(one_s.astype(int) - seq_s.astype(int))[inner]
    assert diff.mean() < 0.8 and np.percentile(diff, 99) <= 3, (diff.mean(), np.percentile(diff, 99))
    # On the sharp scene: the polygons lie on their text in the warped image (content lands with them).
    from test_text_det_data import _poly_image

    def overlap(image, quads):  # IoU of the drawn polygons with the bright (text) pixels
        drawn, bright = _poly_image(quads, 96, 96)[..., 0] > 0, image[..., 0] > 200
        return (drawn & bright).sum() / max((drawn | bright).sum(), 1)

    if len(one[1]):
        assert overlap(one[0], one[1]) >= overlap(seq[0], seq[1]) - 0.02


def test_one_warp_hand_computed_flip_and_half_scale():
    from zoo.data.text_det.geometry import augment_and_crop

    # no text to keep -> crop_area falls back to the whole (flipped, halved) image: 100x50 fitted to 64
    img = np.zeros((100, 200, 3), np.uint8)
    img[:, :100] = 200  # left half bright
    poly = np.array([[[10.0, 20.0], [60.0, 20.0], [60.0, 40.0], [10.0, 40.0]]])
    out, p, ign = augment_and_crop(img, poly, np.array([True]), np.random.default_rng(0), size=64, flip_p=1.0,
                                   rotate=(0, 0), scale=(0.5, 0.5))
    # flip: x -> 199 - x; half: (x + 0.5) * 0.5 - 0.5; fit 100x50 into 64: 64/100
    x = ((199 - poly[0, :, 0]) + 0.5) * 0.5 - 0.5
    x = (x + 0.5) * 0.64 - 0.5
    y = ((poly[0, :, 1] + 0.5) * 0.5 - 0.5 + 0.5) * 0.64 - 0.5
    assert np.allclose(p[0], np.stack([x, y], 1)) and ign.tolist() == [True]
    assert out.shape == (64, 64, 3) and (out[32:, :] == 0).all()          # padding below 64x32
    assert (out[:32, 40:64] == 200).all() and (out[:32, :24] == 0).all()  # flipped: bright on the right


def test_train_transform_geometry_option():
    from zoo.data.text_det.transforms import DetTrainTransform

    img, polys, ignore = _scene(0)
    a = DetTrainTransform(64, geometry="one_warp")(img, polys, ignore, np.random.default_rng(1))
    b = DetTrainTransform(64, geometry="sequential")(img, polys, ignore, np.random.default_rng(1))
    for k in ("shrink_map", "shrink_mask", "threshold_map", "threshold_mask"):
        assert np.array_equal(a[k], b[k]), k
    assert np.abs(a["image"] - b["image"]).mean() < 0.05
    with pytest.raises(ValueError, match="geometry"):
        DetTrainTransform(64, geometry="fast")


# ---------------------------------------------------------------- reduced JPEG decode (item 2)

@pytest.mark.parametrize("seed", range(4))
def test_reduced_decode_keeps_the_labels_and_nearly_the_image(seed, monkeypatch):
    from zoo.data import images
    from zoo.data.text_det import transforms
    from zoo.data.text_det.transforms import DetTrainTransform

    img, polys, ignore = _scene(seed, h=480, w=640)
    img = cv2.GaussianBlur(img, (0, 0), 3)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])
    data = buf.tobytes()
    flags = []
    real = images.decode_image
    monkeypatch.setattr(transforms, "decode_image", lambda d, p, f=cv2.IMREAD_COLOR: flags.append(f) or real(d, p, f))
    t = DetTrainTransform(64, scale=(0.5, 1.0))  # the crop shrinks >= 2x: a reduced decode applies
    a = t.decode_and_apply(data, "x.jpg", polys, ignore, np.random.default_rng(seed))
    assert flags and flags[-1] != cv2.IMREAD_COLOR, "no reduced decode was used"
    full = real(data, "x.jpg")
    b = t(full, polys, ignore, np.random.default_rng(seed))
    for k in ("shrink_map", "shrink_mask", "threshold_map", "threshold_mask"):
        assert np.array_equal(a[k], b[k]), k
    diff = np.abs(a["image"] - b["image"]) * 0.226 * 255  # back to grey levels
    assert diff.mean() < 2.5 and np.percentile(diff, 99) < 12, (diff.mean(), np.percentile(diff, 99))
    off = DetTrainTransform(64, scale=(0.5, 1.0), reduced_decode=False)
    c = off.decode_and_apply(data, "x.jpg", polys, ignore, np.random.default_rng(seed))
    assert np.array_equal(c["image"], b["image"])  # off: exactly decode + transform


def test_no_reduced_decode_when_the_crop_enlarges(monkeypatch):
    from zoo.data import images
    from zoo.data.text_det import transforms
    from zoo.data.text_det.transforms import DetTrainTransform

    img, polys, ignore = _scene(0, h=120, w=160)
    data = cv2.imencode(".jpg", img)[1].tobytes()
    flags = []
    real = images.decode_image
    monkeypatch.setattr(transforms, "decode_image", lambda d, p, f=cv2.IMREAD_COLOR: flags.append(f) or real(d, p, f))
    t = DetTrainTransform(160, scale=(1.0, 2.0))
    a = t.decode_and_apply(data, "x.jpg", polys, ignore, np.random.default_rng(0))
    b = t(real(data, "x.jpg"), polys, ignore, np.random.default_rng(0))
    assert flags == [cv2.IMREAD_COLOR] and all(np.array_equal(a[k], b[k]) for k in a)
