"""The text-det evaluation's DetResizeForTest limit-side modes (issue 36.2): PaddleOCR v5 evaluates at
``limit_side_len 736, limit_type min``, its predictor runs 960 / max. Shapes computed by hand from
upstream's ``resize_image_type0`` (``ppocr/data/imaug/operators.py``): scale, ``int()`` each side,
``round(side / 32) * 32`` (Python's round: halves go to even), at least 32. The fixed ``eval_size``
stays the default, so db_det's evaluation does not move."""
from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from zoo.data.loader import build_loader
from zoo.data.text_det.dataset import TextDetData
from zoo.data.text_det.transforms import DetEvalTransform, limit_side_shape, pad_eval_batch
from zoo.export import det_resize_shape
from zoo.tasks import DBTask


@pytest.mark.parametrize("h, w, side, kind, want", [
    (720, 1280, 960, "max", (544, 960)),      # x 0.75 -> 540 x 960; 540 / 32 = 16.9 -> 17 * 32
    (191, 384, 960, "max", (192, 384)),       # no shrink; 191 -> 192 (skimage's page at the predictor's 960)
    (80, 48, 960, "max", (64, 64)),           # 80 / 32 = 2.5 -> 2 and 48 / 32 = 1.5 -> 2: halves to even
    (720, 1280, 736, "min", (736, 1312)),     # x 736/720 -> 736 x int(1308.4) = 1308 -> 40.9 -> 41 * 32
    (256, 256, 736, "min", (736, 736)),       # the synthetic set's images grown to 736
    (1000, 800, 736, "min", (992, 800)),      # short side already >= 736: kept; 1000 -> 31.25 -> 31 * 32
    (300, 200, 640, "resize_long", (640, 416)),  # x 2.133 -> 640 x int(426.7) = 426 -> 13.3 -> 13 * 32
    (4000, 1000, 640, "resize_long", (640, 160)),  # shrinks too
    (10, 20, 960, "max", (32, 32)),           # at least 32
])
def test_limit_side_shape_hand_values(h, w, side, kind, want):
    assert limit_side_shape(h, w, side, kind) == want


def test_predictor_cap_only_in_the_export_shape():
    """PaddleX's predictor caps the long side at 4000 before rounding; the training-side evaluation does not."""
    assert limit_side_shape(100, 5000, 736, "min") == (736, 36800)
    assert det_resize_shape(100, 5000, 736, "min") == (64, 4000)  # 736 x 36800 capped: x 4000/36800


def test_bad_limit_settings_name_the_key():
    with pytest.raises(ValueError, match="data.builder.limit_type"):
        DetEvalTransform(limit_side_len=736, limit_type="long")
    with pytest.raises(ValueError, match="data.builder.limit_side_len"):
        DetEvalTransform(limit_side_len=0)


def test_default_is_the_fixed_eval_size():
    t = DetEvalTransform((64, 96))
    item = t(np.zeros((720, 1280, 3), np.uint8))
    assert item["image"].shape == (3, 64, 96)
    np.testing.assert_allclose(item["shape"], [720, 1280, 64 / 720, 96 / 1280], rtol=1e-6)
    assert repr(t) == "DetEvalTransform(eval_size=(64, 96))"


@pytest.mark.parametrize("src, side, kind, want", [
    ((720, 1280), 960, "max", (544, 960)),
    ((256, 256), 736, "min", (736, 736)),
    ((20, 30), 736, "min", (736, 736)),  # h + w < 64: zero-padded to 32 x 32 first, ratios of the padded size
])
def test_eval_transform_limit_modes(src, side, kind, want):
    t = DetEvalTransform((64, 96), limit_side_len=side, limit_type=kind)
    item = t(np.full(src + (3,), 128, np.uint8))
    assert item["image"].shape == (3, *want)
    padded = (max(32, src[0]), max(32, src[1])) if sum(src) < 64 else src
    np.testing.assert_allclose(item["shape"], [*src, want[0] / padded[0], want[1] / padded[1]], rtol=1e-6)


@pytest.mark.parametrize("normalize_on", ["host", "device"])
def test_pad_eval_batch_pads_black_and_records_sizes(normalize_on):
    t = DetEvalTransform(limit_side_len=64, limit_type="max", normalize_on=normalize_on)
    a, b = t(np.full((64, 32, 3), 200, np.uint8)), t(np.full((32, 64, 3), 200, np.uint8))
    for item, k in ((a, 2), (b, 3)):
        item.update(polys=np.zeros((4, 4, 2), np.float32), ignore=np.zeros(4, np.int64), num_polys=np.array(k))
    batch = pad_eval_batch([a, b], t.pad_value())
    assert batch["image"].shape == (2, 3, 64, 64) and batch["image"].dtype == a["image"].dtype
    assert batch["valid_hw"].tolist() == [[64, 32], [32, 64]]
    assert batch["num_polys"].tolist() == [2, 3] and batch["shape"].shape == (2, 4)
    np.testing.assert_array_equal(batch["image"][0, :, :, :32], a["image"])
    black = t(np.zeros((64, 32, 3), np.uint8))["image"][:, 0, 0]
    np.testing.assert_allclose(batch["image"][0, :, 0, 40], black, atol=1e-6)
    np.testing.assert_allclose(batch["image"][1, :, 40, 0], black, atol=1e-6)


def _write_set(root, sizes):
    """Images of their own sizes, each with one text quad at the centre (PaddleOCR label format)."""
    lines = []
    for i, (h, w) in enumerate(sizes):
        img = np.zeros((h, w, 3), np.uint8)
        x0, y0, x1, y1 = w // 4, h // 3, 3 * w // 4, 2 * h // 3
        img[y0:y1, x0:x1] = 255
        cv2.imwrite(str(root / f"{i}.png"), img)
        quad = [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]
        lines.append(f"{i}.png\t{json.dumps([{'transcription': 'x', 'points': quad}])}")
    (root / "val.txt").write_text("\n".join(lines) + "\n")
    (root / "train.txt").write_text(lines[0] + "\n")


def test_dataset_and_loader_with_images_of_their_own_sizes(tmp_path):
    _write_set(tmp_path, [(100, 200), (150, 90)])
    data = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=64, eval_size=(64, 64), max_polys=4,
                       limit_side_len=96, limit_type="min")
    val = data.build("val", 0)
    assert val[0]["image"].shape == (3, 96, 192) and val[1]["image"].shape == (3, 160, 96)
    assert "DetEvalTransform(limit_side_len=96, limit_type='min')" in repr(val)
    (batch,) = list(build_loader(val, [[0, 1]]))
    assert list(batch["image"].shape) == [2, 3, 160, 192]
    assert batch["valid_hw"].numpy().tolist() == [[96, 192], [160, 96]]
    fixed = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=64, eval_size=(64, 64), max_polys=4).build("val", 0)
    assert not hasattr(fixed, "collate_fn") and fixed[1]["image"].shape == (3, 64, 64)


class _Echo:
    """A 'model' whose shrink map is the batch's first channel (already a probability map)."""

    def __call__(self, image):
        return {"maps": image[:, :1]}


def test_db_predict_crops_padded_maps_to_each_image():
    """Boxes of a padded batch equal those of each image evaluated alone (as PaddleOCR, batch 1)."""
    import paddle

    rng = np.random.default_rng(0)
    maps, shapes = [], []
    for h, w, src in ((64, 128, (100, 200)), (96, 64, (150, 100))):
        m = np.zeros((1, h, w), np.float32)
        for _ in range(2):
            y, x = int(rng.integers(4, h - 20)), int(rng.integers(4, w - 40))
            m[0, y:y + 12, x:x + 30] = 0.9
        maps.append(m)
        shapes.append(np.array([*src, h / src[0], w / src[1]], np.float32))
    task = DBTask()
    alone = [task.predict(_Echo(), {"image": paddle.to_tensor(m[None]), "shape": paddle.to_tensor(s[None])})[0]
             for m, s in zip(maps, shapes)]
    items = [{"image": m, "shape": s} for m, s in zip(maps, shapes)]
    batch = pad_eval_batch(items, np.zeros(1, np.float32))
    batched = task.predict(_Echo(), {k: paddle.to_tensor(v) for k, v in batch.items()})
    assert [len(b) for b, _ in alone] == [2, 2]
    for (b1, s1), (b2, s2) in zip(alone, batched):
        np.testing.assert_array_equal(b1, b2)
        np.testing.assert_allclose(s1, s2)
