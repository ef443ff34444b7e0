"""COCO reader, box transforms, multi-scale collate and the synthetic detection set."""
from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from zoo.data import build_loader
from zoo.data.coco.dataset import COCODetData, load_coco_instances
from zoo.data.coco.dataset import COCODetDataset
from zoo.data.coco.transforms import INTERPOLATIONS, MEAN, STD, BoxTrainTransform, flip_boxes, random_distort
from zoo.data.transforms import normalize_chw
from zoo.data.synthetic.shapes_det import SyntheticShapesDetData, render_detection_image


def _write_coco(root, images, anns, cats=None, name="ann.json", image_dir="img", make_files=True):
    """Write a COCO json under root/annotations and (blank) images under root/image_dir."""
    cats = cats or [{"id": 1, "name": "a"}]
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / image_dir).mkdir(exist_ok=True)
    imgs = []
    for iid, (w, h) in images.items():
        fname = f"{iid:04d}.png"
        imgs.append({"id": iid, "file_name": fname, "width": w, "height": h})
        if make_files:
            cv2.imwrite(str(root / image_dir / fname), np.zeros((h, w, 3), np.uint8))
    full = [dict({"id": k + 1, "iscrowd": 0}, **a) for k, a in enumerate(anns)]
    path = root / "annotations" / name
    path.write_text(json.dumps({"images": imgs, "annotations": full, "categories": cats}))
    return path


def test_sparse_category_ids_map_to_contiguous_labels_and_crowd_is_skipped(tmp_path):
    cats = [{"id": 90, "name": "zebra"}, {"id": 1, "name": "apple"}, {"id": 5, "name": "cat"}]
    anns = [{"image_id": 1, "category_id": 90, "bbox": [1, 2, 10, 20]},
            {"image_id": 1, "category_id": 1, "bbox": [5, 5, 4, 4]},
            {"image_id": 1, "category_id": 5, "bbox": [0, 0, 8, 8], "iscrowd": 1},
            {"image_id": 2, "category_id": 5, "bbox": [3, 4, 5, 6]}]
    ann = _write_coco(tmp_path, {1: (40, 30), 2: (20, 20)}, anns, cats)
    inst = load_coco_instances(ann, tmp_path / "img")
    assert inst.cat_ids == [1, 5, 90] and inst.class_names == ["apple", "cat", "zebra"]
    assert inst.num_crowd == 1
    r1, r2 = inst.records
    assert (r1["im_id"], r1["width"], r1["height"]) == (1, 40, 30)
    np.testing.assert_array_equal(r1["labels"], [2, 0])
    np.testing.assert_allclose(r1["boxes"], [[1, 2, 11, 22], [5, 5, 9, 9]])
    np.testing.assert_array_equal(r2["labels"], [1])
    np.testing.assert_allclose(r2["boxes"], [[3, 4, 8, 10]])


@pytest.mark.parametrize("ann, expect, exc", [
    ({"image_id": 1, "category_id": 1, "bbox": [1, 1, -3, 4]}, "negative bbox width/height", ValueError),
    ({"image_id": 1, "category_id": 7, "bbox": [1, 1, 3, 4]}, "unknown category_id 7", ValueError),
    ({"image_id": 1, "category_id": 1, "bbox": [1, 1, 3]}, "'bbox' must be 4 numbers", ValueError),
    ({"image_id": 1, "category_id": 1}, "missing key 'bbox'", ValueError),
    ({"image_id": 9, "category_id": 1, "bbox": [1, 1, 3, 4]}, "image_id 9 has no entry", ValueError),
])
def test_bad_annotation_errors_name_file_annotation_and_image(tmp_path, ann, expect, exc):
    path = _write_coco(tmp_path, {1: (20, 20)}, [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5]}, ann])
    with pytest.raises(exc) as e:
        load_coco_instances(path, tmp_path / "img")
    msg = str(e.value)
    assert str(path) in msg and "annotation id=2" in msg and expect in msg
    if ann["image_id"] == 1:
        assert "0001.png" in msg


def test_missing_image_file_and_bad_image_size_are_errors(tmp_path):
    path = _write_coco(tmp_path, {1: (20, 20), 2: (20, 20)}, [{"image_id": 2, "category_id": 1, "bbox": [0, 0, 5, 5]}])
    (tmp_path / "img" / "0002.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"image id=2 \(0002.png\).*0002.png not found"):
        load_coco_instances(path, tmp_path / "img")
    doc = json.loads(path.read_text())
    doc["images"][0]["height"] = -5
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"image id=1 \(0001.png\): 'height' must be a positive number"):
        load_coco_instances(path, tmp_path / "img")


def test_skip_policy_counts_and_skips_bad_images(tmp_path):
    anns = [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5]},
            {"image_id": 2, "category_id": 1, "bbox": [0, 0, 5, 5]},
            {"image_id": 2, "category_id": 3, "bbox": [0, 0, 5, 5]},   # unknown category -> image 2 out
            {"image_id": 3, "category_id": 1, "bbox": [0, 0, 5, 5]},   # image 3 file missing
            {"image_id": 4, "category_id": 1, "bbox": [0, 0, 5, 5]},
            {"image_id": 4, "category_id": 1, "bbox": [2, 2, 0, 5]}]   # zero width: skipped, counted, not bad
    path = _write_coco(tmp_path, {i: (20, 20) for i in (1, 2, 3, 4)}, anns)
    (tmp_path / "img" / "0003.png").unlink()
    inst = load_coco_instances(path, tmp_path / "img", bad_samples="skip")
    assert [r["im_id"] for r in inst.records] == [1, 4]
    assert len(inst.skipped) == 2 and inst.num_degenerate == 1
    assert "annotation id=3" in inst.skipped[0] and "0003.png not found" in inst.skipped[1]
    with pytest.raises(ValueError, match="bad_samples"):
        load_coco_instances(path, tmp_path / "img", bad_samples="ignore")


def test_empty_image_policy_both_ways_and_eval_keeps_empty(tmp_path):
    path = _write_coco(tmp_path, {1: (20, 20), 2: (20, 20)}, [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5]}])
    dropped = load_coco_instances(path, tmp_path / "img", allow_empty=False)
    assert [r["im_id"] for r in dropped.records] == [1] and dropped.num_empty_dropped == 1
    kept = load_coco_instances(path, tmp_path / "img", allow_empty=True)
    assert [r["im_id"] for r in kept.records] == [1, 2] and kept.records[1]["boxes"].shape == (0, 4)
    data = COCODetData(tmp_path, train_ann="annotations/ann.json", val_ann="annotations/ann.json",
                       train_images="img", val_images="img", image_size=32, eval_size=32, multiscale=None)
    assert len(data.build("train", 0)) == 1 and len(data.build("val", 0)) == 2
    assert sorted(data.coco("val").getImgIds()) == [1, 2]
    allow = COCODetData(tmp_path, train_ann="annotations/ann.json", train_images="img", image_size=32,
                        allow_empty=True)
    train = allow.build("train", 0)
    item = train[1]  # the empty image trains as a negative (multi-scale: resized in the batch)
    size = train.batch_size_choice(1)[0]
    assert item["pad_gt_mask"].sum() == 0 and train.collate_fn([item])["image"].shape == (1, 3, size, size)


def _rect_image(h=150, w=200, box=(40, 30, 120, 90)):
    img = np.zeros((h, w, 3), np.uint8)
    x1, y1, x2, y2 = box
    img[y1:y2, x1:x2] = 255
    return img, np.array([box], np.float32)


def _bright_bounds(chw):
    """Bounds (x1, y1, x2, y2) of pixels that are white-ish after undoing the normalisation."""
    rgb = (chw.transpose(1, 2, 0) * np.array(STD) + np.array(MEAN)) * 255
    ys, xs = np.nonzero(rgb.min(axis=2) > 190)  # between the expand fill (~124) and white
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float64)


def test_train_transform_keeps_box_on_the_rectangle():
    img, box = _rect_image()
    tf = BoxTrainTransform(size=96, distort=0.0, expand=0.5, crop=1.0, flip=0.5)
    seen_flip = seen_small = 0
    for seed in range(25):
        image, boxes, labels = tf(img, box, np.array([3]), np.random.default_rng(seed))
        assert image.shape == (3, 96, 96) and image.dtype == np.float32
        assert len(boxes) == 1 and labels.tolist() == [3]
        np.testing.assert_allclose(boxes[0], _bright_bounds(image), atol=1.5)
        seen_flip += boxes[0, 0] > 96 - boxes[0, 2] + 5  # rectangle is left of centre unless flipped
        seen_small += (boxes[0, 2] - boxes[0, 0]) < 30     # expanded
    assert seen_flip and seen_small


def test_flip_maps_x1_to_w_minus_x2():
    np.testing.assert_allclose(flip_boxes(np.array([[10, 20, 30, 40]], np.float32), 100), [[70, 20, 90, 40]])
    img, box = _rect_image(box=(10, 5, 30, 25))
    flipped = img[:, ::-1]
    xs = np.nonzero(flipped[10, :, 0])[0]
    np.testing.assert_allclose(flip_boxes(box, img.shape[1])[0, [0, 2]], [xs.min(), xs.max() + 1])


def test_distort_is_deterministic_and_changes_colours():
    img = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    a = random_distort(img, np.random.default_rng(3), prob=1.0)
    b = random_distort(img, np.random.default_rng(3), prob=1.0)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.uint8 and not np.array_equal(a, img)
    np.testing.assert_array_equal(random_distort(img, np.random.default_rng(3), prob=0.0), img)


@pytest.fixture(scope="module")
def shapes_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("det_shapes")
    return SyntheticShapesDetData(num_train=12, num_val=4, image_size=96, max_size=60, root=root,
                                  multiscale=[64, 96, 128])


def test_same_seed_and_key_give_same_sample(shapes_data):
    a, b = shapes_data.build("train", 3), shapes_data.build("train", 3)
    for key in (0, 5, 12 + 5):
        x, y = a[key], b[key]
        assert x.keys() == y.keys() and int(x["key"]) == key and int(x["epoch"]) == key // 12
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    assert not np.array_equal(a[5]["image"], a[17]["image"])          # other epoch, other augmentation
    assert not np.array_equal(a[5]["image"], shapes_data.build("train", 4)[5]["image"])


def test_collate_multiscale_one_size_per_batch_and_scaled_boxes(shapes_data):
    ds = shapes_data.build("train", 0)
    sizes = set()
    for first in range(8):
        keys = [first, (first + 3) % 12, (first + 7) % 12]
        items = [ds[k] for k in keys]
        batch = ds.collate_fn(items)
        size = batch["image"].shape[-1]
        assert batch["image"].shape == (3, 3, size, size) and size in (64, 96, 128)
        # each item is its crop at its own size; its boxes scale by its own ratios (clipped to the image)
        want = [np.clip(i["gt_bbox"] * np.array([size / i["image"].shape[1], size / i["image"].shape[0]] * 2),
                        0, size) for i in items]
        np.testing.assert_allclose(batch["gt_bbox"], np.stack(want), atol=1e-3)
        np.testing.assert_array_equal(batch["gt_class"], np.stack([i["gt_class"] for i in items]))
        assert ds.collate_fn(items)["image"].shape == batch["image"].shape  # deterministic
        sizes.add(size)
    assert len(sizes) > 1
    loaded = next(iter(build_loader(ds, [[4, 1, 2]])))                  # build_loader uses collate_fn
    assert tuple(loaded["image"].shape) == (3, 3) + (ds.batch_size_choice(4)[0],) * 2


def test_eval_item_sizes_and_source_pixel_targets(shapes_data):
    ds = shapes_data.build("val", 0)
    item = ds[1]
    assert item["image"].shape == (3, 96, 96) and int(item["im_id"]) == 2
    np.testing.assert_allclose(item["scale_factor"], [1.0, 1.0])
    np.testing.assert_array_equal(item["orig_size"], [96, 96])
    k = int(item["pad_gt_mask"].sum())
    boxes, labels = ds.annotations(1)
    np.testing.assert_allclose(item["gt_bbox"][:k], boxes)
    np.testing.assert_array_equal(item["gt_class"][:k, 0], labels)
    big = SyntheticShapesDetData(num_train=12, num_val=4, image_size=96, max_size=60, root=shapes_data.root.parent,
                                 eval_size=64).build("val", 0)[1]
    assert big["image"].shape == (3, 64, 64)
    np.testing.assert_allclose(big["scale_factor"], [64 / 96, 64 / 96])


def test_synthetic_set_is_deterministic_across_folders(tmp_path, shapes_data):
    other = SyntheticShapesDetData(num_train=12, num_val=4, image_size=96, max_size=60, root=tmp_path)
    other.prepare()
    assert other.root.name == shapes_data.root.name and other.root != shapes_data.root
    for rel in ("annotations/instances_train.json", "annotations/instances_val.json", "train/000000.jpg",
                "train/000011.jpg", "val/000003.jpg"):
        assert (other.root / rel).read_bytes() == (shapes_data.root / rel).read_bytes(), rel
    assert shapes_data.num_classes == 8 and shapes_data.class_names[0] == "circle"
    changed = SyntheticShapesDetData(num_train=12, num_val=4, image_size=96, max_size=50, root=tmp_path)
    assert changed.root.name != other.root.name                              # params are in the folder name


def test_synthetic_boxes_are_tight_around_drawn_pixels():
    singles = 0
    for seed in range(30):
        img, boxes, labels, areas = render_detection_image(np.random.default_rng(seed), 128, max_objects=3,
                                                          max_size=60, plain=True)
        assert len(boxes) == len(labels) == len(areas) >= 1 and labels.max() < 8
        ys, xs = np.nonzero(np.linalg.norm(img.astype(np.float64), axis=2) > 60)
        drawn = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
        union = [boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max()]
        np.testing.assert_allclose(union, drawn, atol=1.0)
        assert ((boxes[:, 2:] - boxes[:, :2]) >= 4).all()
        if len(boxes) == 1:  # coverage = |pixel| / |colour|; the box bounds coverage >= 1/2 exactly
            singles += 1
            norm = np.linalg.norm(img.astype(np.float64), axis=2)
            ys, xs = np.nonzero(norm / norm.max() >= 0.5)
            np.testing.assert_array_equal(boxes[0], [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            assert areas[0] <= (boxes[0, 2] - boxes[0, 0]) * (boxes[0, 3] - boxes[0, 1])
    assert singles >= 3


# --- multi-scale resamples once, from the crop (issue 37.5) ----------------------------------------------
# PaddleDetection's ppyoloe_reader.yml TrainReader: sample_transforms Decode, RandomDistort, RandomExpand,
# RandomCrop, RandomFlip (no resize), then batch_transforms BatchRandomResize (keep_ratio False,
# random_interp): each crop is resized once, to the batch's size.


def _rect_dataset(tmp_path, box=(40, 30, 120, 90), h=150, w=200, multiscale=(64, 96, 128, 160), **tf):
    """A train set of one known image (a white rectangle on black, its box) under ``multiscale``."""
    img, boxes = _rect_image(h, w, box)
    file = tmp_path / "rect.png"
    cv2.imwrite(str(file), img)
    record = {"file": str(file), "im_id": 1, "height": h, "width": w, "boxes": boxes,
              "labels": np.array([0], np.int64)}
    transform = BoxTrainTransform(size=96, **{"distort": 0.0, **tf})
    return COCODetDataset([record], "train", 0, transform, max_boxes=4, multiscale=multiscale), img


def test_multiscale_boxes_land_on_the_rectangle_of_a_known_image(tmp_path):
    """No expand, crop or flip: the crop is the image itself, so the batch's box is the source box times
    size / (w, h), computed here without the zoo, and the white pixels of the batch image lie there."""
    ds, _ = _rect_dataset(tmp_path, expand=0.0, crop=0.0, flip=0.0)
    seen = set()
    for first in range(12):
        batch = ds.collate_fn([ds[first], ds[first + 1]])
        size, interp = ds.batch_size_choice(first)
        seen.add((size, interp))
        assert batch["image"].shape == (2, 3, size, size)
        want = np.array([40 * size / 200, 30 * size / 150, 120 * size / 200, 90 * size / 150], np.float32)
        for i in range(2):
            np.testing.assert_allclose(batch["gt_bbox"][i, 0], want, rtol=1e-6)
            np.testing.assert_allclose(batch["gt_bbox"][i, 0], _bright_bounds(batch["image"][i]), atol=1.0)
            assert batch["pad_gt_mask"][i].ravel().tolist() == [1, 0, 0, 0]
            np.testing.assert_array_equal(batch["gt_bbox"][i, 1:], 0)
    assert len({s for s, _ in seen}) > 1 and len({i for _, i in seen}) > 1  # sizes and interpolations vary


def test_multiscale_resizes_each_crop_exactly_once(tmp_path, monkeypatch):
    """With expand, crop and flip on: loading an item resizes nothing; collating resizes each crop once,
    and the batch image is exactly one cv2.resize of the crop to the batch's size with the batch's
    interpolation, normalised; its boxes are the crop's boxes times that resize's ratios."""
    ds, _ = _rect_dataset(tmp_path, expand=0.5, crop=1.0, flip=0.5)
    calls = []
    real = cv2.resize

    def counting(src, dsize, *args, **kwargs):
        calls.append((src.shape[:2], tuple(dsize)))
        return real(src, dsize, *args, **kwargs)

    monkeypatch.setattr(cv2, "resize", counting)
    crops_seen = set()
    for first in range(0, 16, 2):
        items = [ds[first], ds[first + 1]]
        assert calls == []  # the per-image ops do not resize
        for it in items:
            assert it["image"].dtype == np.uint8 and it["image"].ndim == 3  # the crop, HWC, own size
            crops_seen.add(it["image"].shape[:2])
        batch = ds.collate_fn(items)
        size, interp = ds.batch_size_choice(first)
        assert calls == [(it["image"].shape[:2], (size, size)) for it in items]
        calls.clear()
        for i, it in enumerate(items):
            h, w = it["image"].shape[:2]
            once = normalize_chw(real(it["image"], (size, size), interpolation=interp), MEAN, STD)
            np.testing.assert_array_equal(batch["image"][i], once)
            k = int(it["pad_gt_mask"].sum())
            want = np.clip(it["gt_bbox"][:k] * np.array([size / w, size / h, size / w, size / h]), 0, size)
            np.testing.assert_allclose(batch["gt_bbox"][i, :k], want, rtol=1e-6, atol=1e-4)
            if k:  # the rectangle's white pixels are where the boxes say (crop, expand, flip and resize)
                np.testing.assert_allclose(batch["gt_bbox"][i, 0], _bright_bounds(batch["image"][i]), atol=1.5)
    assert len(crops_seen) > 2  # crops of several sizes went straight to the batch size


def test_multiscale_interpolations_are_batch_random_resizes():
    """BatchRandomResize's random_interp choices (ppdet/data/transform/batch_operators.py:129-135)."""
    assert INTERPOLATIONS == (cv2.INTER_NEAREST, cv2.INTER_LINEAR, cv2.INTER_AREA, cv2.INTER_CUBIC,
                              cv2.INTER_LANCZOS4)


def test_without_multiscale_items_are_resized_once_to_image_size(tmp_path, monkeypatch):
    ds, _ = _rect_dataset(tmp_path, multiscale=None, expand=0.5, crop=1.0, flip=0.5)
    calls = []
    real = cv2.resize
    monkeypatch.setattr(cv2, "resize", lambda src, dsize, *a, **k: calls.append(tuple(dsize)) or real(src, dsize, *a, **k))
    item = ds[3]
    assert item["image"].shape == (3, 96, 96) and calls == [(96, 96)]
    assert ds.collate_fn([item, ds[4]])["image"].shape == (2, 3, 96, 96) and len(calls) == 2
