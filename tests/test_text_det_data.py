"""DB text-detection data: label files, label maps, transforms, datasets, synthetic set."""
from __future__ import annotations

import json
import math
import os

import cv2
import numpy as np
import pytest

from zoo.data.text_det.dataset import TextDetData, TextDetDataset, read_det_label_file
from zoo.data.text_det.labels import make_shrink_map
from zoo.data.text_det.transforms import (
    DetTrainTransform,
    crop_area,
    east_random_crop,
    iaa_augment,
)

# ---------------------------------------------------------------- label files


def _box(t, pts):
    return {"transcription": t, "points": pts}


QUAD = [[1, 2], [30, 2], [30, 12], [1, 12]]


def test_read_label_file_good(tmp_path):
    f = tmp_path / "labels.txt"
    pent = [[0, 0], [10, 0], [12, 5], [10, 10], [0, 10]]
    f.write_text(
        f"a/1.jpg\t{json.dumps([_box('hi', QUAD), _box('###', QUAD), _box('*', QUAD)])}\n"
        "\n"
        f"b/2.jpg\t{json.dumps([_box('x', pent)])}\n"
        "c/3.jpg\t[]\n", encoding="utf-8")
    rows = read_det_label_file(f)
    assert [r[0] for r in rows] == ["a/1.jpg", "b/2.jpg", "c/3.jpg"]
    _, polys, ignore = rows[0]
    assert polys.dtype == np.float32 and polys.shape == (3, 4, 2)
    np.testing.assert_array_equal(polys[0], QUAD)
    assert ignore.tolist() == [False, True, True]
    # more than 4 points -> minimum-area rectangle, clockwise from the top-left
    quad = rows[1][1][0]
    assert quad.shape == (4, 2)
    np.testing.assert_allclose(cv2.contourArea(quad), 12 * 10, rtol=1e-4)
    assert np.argmin(quad.sum(axis=1)) == 0
    assert cv2.contourArea(quad, oriented=True) > 0  # clockwise with y pointing down
    assert rows[2][1].shape == (0, 4, 2) and rows[2][2].shape == (0,)


@pytest.mark.parametrize("line, what", [
    ("a.jpg [] ", "no tab"),
    ("a.jpg\t[{\"transcription\": \"x\", ", "bad JSON"),
    ("a.jpg\t{\"points\": []}", "must be a list"),
    (f"a.jpg\t{json.dumps([{'points': QUAD}])}", "'transcription' and 'points'"),
    (f"a.jpg\t{json.dumps([_box('x', QUAD[:3])])}", "at least 4"),
    (f"a.jpg\t{json.dumps([_box('x', [[1, 'b'], [2, 3], [4, 5], [6, 7]])])}", "[x, y] numbers"),
    (f"a.jpg\t{json.dumps([_box('x', [[1, 2, 3]] * 4)])}", "4x2"),
])
def test_read_label_file_errors(tmp_path, line, what):
    f = tmp_path / "bad.txt"
    f.write_text(f"ok.jpg\t{json.dumps([_box('a', QUAD)])}\n\n{line}\n", encoding="utf-8")
    with pytest.raises(ValueError) as err:
        read_det_label_file(f)
    assert f"{f}:3" in str(err.value) and what in str(err.value)


# ---------------------------------------------------------------- label maps


def _random_quads(rng, n, h, w):
    quads = []
    for _ in range(n):
        bw, bh = rng.uniform(8, 30), rng.uniform(4, 14)
        t = rng.uniform(-0.6, 0.6)
        rot = np.array([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]])
        box = np.array([[-bw, -bh], [bw, -bh], [bw, bh], [-bw, bh]]) / 2 + rng.normal(0, 1.0, (4, 2))
        quads.append(box @ rot.T + rng.uniform((0, 0), (w, h)))  # some stick out of the image
    return np.array(quads, np.float32)


def test_shrink_map_rectangle_and_small_text():
    # 40x20 box: D = 800 * (1 - 0.16) / 120 = 5.6 -> inner box x 15.6..44.4, y 15.6..24.4
    big = [[10, 10], [50, 10], [50, 30], [10, 30]]
    small = [[2, 34], [30, 34], [30, 38], [2, 38]]  # 4 px high < min_text_size
    gt, mask = make_shrink_map(np.array([big, small], np.float32), [False, False], 40, 64)
    expected = np.zeros((40, 64), np.float32)
    expected[16:25, 16:45] = 1
    np.testing.assert_array_equal(gt, expected)
    assert mask[10:31, 10:51].min() == 1 and mask[34:39, 2:31].max() == 0
    assert mask.sum() == 40 * 64 - 5 * 29
    # an ignored box only clears the mask
    gt, mask = make_shrink_map(np.array([big], np.float32), [True], 40, 64)
    assert gt.sum() == 0 and mask[10:31, 10:51].max() == 0


@pytest.mark.parametrize("seed", range(3))
def test_shrink_map_matches_shapely_buffer(seed):
    from shapely.geometry import Polygon

    rng = np.random.default_rng(seed)
    polys = _random_quads(rng, 3, 80, 80) * 2 + 20
    gt, _ = make_shrink_map(polys.copy(), np.zeros(3, bool), 200, 200)
    ref = np.zeros((200, 200), np.float32)
    for p in np.clip(polys, 0, 199):
        shape = Polygon(p)
        # pyclipper truncates the coordinates it is given to integers
        inner = Polygon(p.astype(int)).buffer(-shape.area * 0.84 / shape.length)
        if not inner.is_empty and min(np.ptp(p, axis=0)) >= 8:
            cv2.fillPoly(ref, [np.round(np.array(inner.exterior.coords)).astype(np.int32)], 1)
    inter, union = (gt * ref).sum(), np.maximum(gt, ref).sum()
    assert union == 0 or inter / union > 0.85


# ---------------------------------------------------------------- transforms


def _poly_image(polys, h, w):
    img = np.zeros((h, w, 3), np.uint8)
    cv2.fillPoly(img, [np.round(p).astype(np.int32) for p in polys], (255, 255, 255))
    return img


@pytest.mark.parametrize("seed", range(6))
def test_augment_and_crop_keep_polys_on_their_pixels(seed):
    rng = np.random.default_rng(seed)
    h, w = 90, 120
    polys = np.array([[[10, 10], [50, 12], [49, 30], [9, 28]], [[60, 50], [110, 50], [110, 75], [60, 75]],
                      [[20, 60], [40, 60], [40, 70], [20, 70]]], np.float64)
    img = _poly_image(polys, h, w)
    img2, polys2 = iaa_augment(img, polys, rng, rotate=(-10, 10), scale=(0.5, 1.5))
    img3, polys3, ignore3 = east_random_crop(img2, polys2, np.zeros(3, bool), rng, size=64)
    assert img3.shape == (64, 64, 3) and len(polys3) == len(ignore3) >= 1
    for before, after in ((img2, polys2), (img3, polys3)):
        drawn = _poly_image(after, *before.shape[:2])[..., 0] > 0
        bright = before[..., 0] > 127
        inter, union = (drawn & bright).sum(), (drawn | bright).sum()
        assert inter / union > 0.85, (seed, inter / union)


@pytest.mark.parametrize("seed", range(10))
def test_crop_area_does_not_cut_text(seed):
    rng = np.random.default_rng(seed)
    h, w = 200, 300
    polys = _random_quads(rng, 6, h - 40, w - 40) + 20
    x, y, cw, ch = crop_area(h, w, list(polys), rng, 0.1, 50)
    assert 0 <= x and 0 <= y and x + cw <= w and y + ch <= h and cw >= 0.1 * w and ch >= 0.1 * h
    inside = 0
    for p in np.round(polys).astype(int):
        for lo, hi, edges in ((p[:, 0].min(), p[:, 0].max(), (x, x + cw)), (p[:, 1].min(), p[:, 1].max(), (y, y + ch))):
            assert not any(lo <= e < hi for e in edges), "a crop edge cuts a text box"
        inside += p[:, 0].min() >= x and p[:, 0].max() <= x + cw and p[:, 1].min() >= y and p[:, 1].max() <= y + ch
    assert inside >= 1


def test_train_transform_item_format():
    rng = np.random.default_rng(0)
    polys = np.array([[[10, 10], [60, 10], [60, 30], [10, 30]]], np.float32)
    item = DetTrainTransform(crop_size=48)(_poly_image(polys, 80, 80), polys, np.zeros(1, bool), rng)
    assert set(item) == {"image", "shrink_map", "shrink_mask", "threshold_map", "threshold_mask"}
    assert item["image"].shape == (3, 48, 48)
    assert all(v.dtype == np.float32 for v in item.values())
    assert all(item[k].shape == (48, 48) for k in item if k != "image")


# ---------------------------------------------------------------- datasets


def _write_root(root, n=3, size=(60, 80), polys_per_image=2):
    (root / "imgs").mkdir(parents=True)
    lines = []
    for i in range(n):
        boxes = [_box("###" if j == 1 else f"w{j}", [[5 + 20 * j, 5], [20 + 20 * j, 5], [20 + 20 * j, 25],
                                                      [5 + 20 * j, 25]]) for j in range(polys_per_image)]
        polys = np.array([b["points"] for b in boxes], np.float32)
        cv2.imwrite(str(root / f"imgs/{i}.png"), _poly_image(polys, *size))
        lines.append(f"imgs/{i}.png\t{json.dumps(boxes)}\n")
    (root / "train.txt").write_text("".join(lines))
    (root / "val.txt").write_text("".join(lines))
    return TextDetData(root, train_label="train.txt", val_label="val.txt", crop_size=32, eval_size=(48, 64),
                       max_polys=4)


def test_dataset_determinism_by_key(tmp_path):
    ds = _write_root(tmp_path).build("train", seed=3)
    assert len(ds) == 3
    a, b = ds[4], ds[4]  # epoch 1, index 1
    assert all(np.array_equal(a[k], b[k]) for k in a)
    again = TextDetDataset(tmp_path, tmp_path / "train.txt", "train", seed=3, crop_size=32)
    assert all(np.array_equal(a[k], again[4][k]) for k in a)
    assert any(not np.array_equal(ds[1][k], a[k]) for k in a)  # other epoch, other augmentation


def test_eval_item(tmp_path):
    ds = _write_root(tmp_path).build("val", seed=0)
    item = ds[0]
    assert item["image"].shape == (3, 48, 64) and item["image"].dtype == np.float32
    np.testing.assert_allclose(item["shape"], [60, 80, 48 / 60, 64 / 80], rtol=1e-6)
    assert item["polys"].shape == (4, 4, 2) and item["polys"].dtype == np.float32
    np.testing.assert_array_equal(item["polys"][1], [[25, 5], [40, 5], [40, 25], [25, 25]])
    assert not item["polys"][2:].any()
    assert item["ignore"].tolist() == [0, 1, 0, 0] and item["ignore"].dtype == np.int64
    assert item["num_polys"].shape == () and int(item["num_polys"]) == 2


def test_dataset_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.root"):
        TextDetData(tmp_path / "missing").build("train", 0)
    data = _write_root(tmp_path / "r", polys_per_image=5)
    with pytest.raises(ValueError, match=r"imgs/0\.png.*max_polys=4"):
        data.build("val", 0)
    (tmp_path / "r/imgs/1.png").write_bytes(b"not an image")
    with pytest.raises(OSError, match=r"imgs/1\.png"):  # found when the data set is built
        data.build("train", 0)
    unchecked = TextDetData(tmp_path / "r", train_label="train.txt", val_label="val.txt", crop_size=32,
                            eval_size=(48, 64), max_polys=8, verify_images=False)
    with pytest.raises(ValueError, match=r"imgs/1\.png"):  # without the check: when it is loaded
        unchecked.build("train", 0)[1]
    with pytest.raises(FileNotFoundError, match="no val label file"):
        TextDetData(tmp_path / "r", val_label="nope.txt").build("val", 0)


def test_paddle_loader_collates(tmp_path):
    from zoo.data.sampler import EvalBatchSampler, TrainBatchSampler, build_loader

    data = _write_root(tmp_path, n=4)
    train = build_loader(data.build("train", 0), TrainBatchSampler(4, batch_size=2, seed=0))
    batch = next(iter(train))
    assert tuple(batch["image"].shape) == (2, 3, 32, 32) and tuple(batch["threshold_mask"].shape) == (2, 32, 32)
    val = build_loader(data.build("val", 0), EvalBatchSampler(4, batch_size=3))
    batch = next(iter(val))
    assert tuple(batch["polys"].shape) == (3, 4, 4, 2) and tuple(batch["num_polys"].shape) == (3,)
    assert str(batch["ignore"].dtype).endswith("int64")


# ---------------------------------------------------------------- synthetic set


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_synthetic_generation_deterministic_and_atomic(tmp_path, monkeypatch):
    from zoo.data.synthetic import text as synthetic_text

    monkeypatch.setenv("AMPZOO_HOME", str(tmp_path / "home"))
    kw = dict(num_train=6, num_val=3, image_size=(64, 96), crop_size=32)
    a = synthetic_text.SyntheticTextData(**kw)
    assert a.root.parent == tmp_path / "home" / "datasets" and "64x96" in a.root.name
    ds = a.build("train", 0)
    assert len(ds) == 6 and ds[0]["image"].shape == (3, 32, 32)
    val = a.build("val", 0)
    assert val[0]["image"].shape == (3, 64, 96) and len(val) == 3
    b = synthetic_text.SyntheticTextData(root=tmp_path / "other", **kw)
    b.prepare()
    files = _files(a.root)
    assert files == _files(b.root) and len(files) == 6 + 3 + 2
    rows = read_det_label_file(a.root / "train_label.txt")
    assert sum(len(p) for _, p, _ in rows) > 0
    assert not list(a.root.parent.glob("*.tmp-*"))

    # A failed generation publishes nothing and leaves no temp folder behind.
    def boom(out_dir, **params):
        (out_dir / "train").mkdir(parents=True)
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(synthetic_text, "generate_dataset", boom)
    c = synthetic_text.SyntheticTextData(root=tmp_path / "third", **kw)
    with pytest.raises(RuntimeError):
        c.prepare()
    assert not c.root.exists() and not list((tmp_path / "third").glob("*.tmp-*"))
    # An existing dataset is reused without regenerating.
    synthetic_text.SyntheticTextData(root=tmp_path / "other", **kw).prepare()


def test_synthetic_stale_temp_removed(tmp_path):
    import socket
    import subprocess
    import sys

    from zoo.data.synthetic import text as synthetic_text

    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = int(proc.stdout)  # a pid that has exited
    d = synthetic_text.SyntheticTextData(num_train=2, num_val=1, image_size=48, root=tmp_path, crop_size=32)
    stale = tmp_path / f"{d.root.name}.tmp-{socket.gethostname()}-{dead}"
    stale.mkdir()
    d.prepare()
    assert not stale.exists() and d.root.is_dir()
    assert os.path.isfile(d.root / "val_label.txt")
