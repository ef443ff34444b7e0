"""Issue 15 items 2-3: decode once in the model's channel order, normalise in one pass, and
uint8 batches normalised where they land (data.builder.normalize_on=device)."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from zoo.data.classification import read_image_bgr, read_image_rgb
from zoo.data.transforms import normalize_chw

from test_det_data import _write_root

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

    from zoo.data.text_det import TextDetData

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
    from zoo.data.text_det import TextDetData

    with pytest.raises(ValueError, match="normalize_on"):
        TextDetData(tmp_path, normalize_on="gpu")
