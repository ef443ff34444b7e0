"""CopyPaste (PP-OCRv4/v5 det training; zoo/data/text_det/copy_paste.py), with fixed seeds: what is
cut from the donor, how it is turned, where it may land, how many instances, and the labels."""
from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from zoo.data.text_det.copy_paste import CopyPaste, rectify_quad, rotated_patch
from zoo.data.text_det.dataset import TextDetData
from zoo.data.text_det.transforms import DetTrainTransform

GREEN = (0, 255, 0)


def _rect(x0, y0, x1, y1):
    """A quad whose outline runs along the outer pixel edges of columns x0..x1-1, rows y0..y1-1."""
    return np.array([[x0 - 0.5, y0 - 0.5], [x1 - 0.5, y0 - 0.5], [x1 - 0.5, y1 - 0.5], [x0 - 0.5, y1 - 0.5]])


def _donor(n_cared, n_ignored=0, size=(200, 300)):
    """A black donor with ``n_cared`` green 40x10 words in a grid (plus ignored ones)."""
    img = np.zeros(size + (3,), np.uint8)
    quads = []
    for i in range(n_cared + n_ignored):
        x, y = 10 + (i % 5) * 55, 10 + (i // 5) * 20
        img[y:y + 10, x:x + 40] = GREEN
        quads.append(_rect(x, y, x + 40, y + 10))
    ignore = np.array([False] * n_cared + [True] * n_ignored)
    return img, np.array(quads, np.float32), ignore


def test_rectify_quad_cuts_the_text_upright():
    img = np.zeros((50, 80, 3), np.uint8)
    img[10:20, 5:45] = 255
    patch = rectify_quad(img, _rect(5, 10, 45, 20))
    assert patch.shape == (10, 40, 3) and (patch == 255).all()
    tall = np.zeros((60, 30, 3), np.uint8)
    tall[5:25, 10:20] = (0, 0, 255)  # top half red
    tall[25:45, 10:20] = (255, 0, 0)  # bottom half blue
    patch = rectify_quad(tall, _rect(10, 5, 20, 45))  # 10 wide, 40 tall: >= 1.5, turned a quarter
    assert patch.shape == (10, 40, 3)
    assert (patch[:, :20] == (0, 0, 255)).all() and (patch[:, 20:] == (255, 0, 0)).all()  # top -> left


def test_rotated_patch_quarter_turn_and_outline():
    patch = np.zeros((4, 10, 3), np.uint8)
    patch[:, 0] = 255  # the left column
    image, mask, quad = rotated_patch(patch, 0)
    assert image.shape == (4, 10, 3) and mask.all()
    np.testing.assert_allclose(quad, _rect(0, 0, 10, 4), atol=1e-6)
    image, mask, quad = rotated_patch(patch, 90)  # counter-clockwise: the left column ends at the bottom
    assert mask.sum() == 40 and image[mask].reshape(-1, 3).shape == (40, 3)
    rows = np.flatnonzero(mask.any(1))
    assert (image[rows[-1]][mask[rows[-1]]] == 255).all() and not image[rows[0]].any()
    xs, ys = np.nonzero(mask.T)  # every masked pixel centre lies inside the outline
    inside = [cv2.pointPolygonTest(quad.astype(np.float32), (float(x), float(y)), False) >= 0
              for x, y in zip(xs, ys)]
    assert all(inside)


def test_one_instance_pasted_where_no_box_is():
    """Six donor boxes, one ignored: max(1, min(int(0.2 * 6), 30)) = 1 instance, a cared one."""
    donor = _donor(5, 1)
    img = np.zeros((240, 320, 3), np.uint8)
    polys = np.array([_rect(20, 20, 120, 60)], np.float32)
    img[20:60, 20:120] = 128
    out, new_polys, new_ignore = CopyPaste()(img, polys, np.array([False]), donor, np.random.default_rng(0))
    assert new_polys.shape == (2, 4, 2) and new_ignore.tolist() == [False, False]
    np.testing.assert_array_equal(new_polys[0], polys[0])
    pasted = new_polys[1]
    green = np.all(out == GREEN, axis=-1)
    assert 350 <= green.sum() <= 400  # the 40x10 word, nearest-neighbour rotated
    ys, xs = np.nonzero(green)
    assert all(cv2.pointPolygonTest(pasted, (float(x), float(y)), True) >= -0.5 for x, y in zip(xs, ys))
    (x0, y0), (x1, y1) = pasted.min(0), pasted.max(0)
    assert x1 < 20 - 0.5 or x0 > 120 - 0.5 or y1 < 20 - 0.5 or y0 > 60 - 0.5  # limit_paste: clear of the box
    assert (out[20:60, 20:120] == 128).all() and not np.shares_memory(out, img)
    again = CopyPaste()(img, polys, np.array([False]), donor, np.random.default_rng(0))
    assert np.array_equal(again[0], out) and np.array_equal(again[1], new_polys)  # fixed seed, same result


def test_count_follows_the_ratio():
    donor = _donor(20)
    img = np.zeros((600, 800, 3), np.uint8)
    empty = np.zeros((0, 4, 2), np.float32)
    for ratio, want in ((0.2, 4), (0.05, 1), (0.0, 1), (1.0, 20)):  # at least 1, int(ratio * n), at most 30
        out, polys, ignore = CopyPaste(ratio)(img, empty, np.zeros(0, bool), donor, np.random.default_rng(1))
        assert len(polys) == want and not ignore.any(), ratio
        assert (polys[..., 0] >= 0).all() and (polys[..., 0] <= 800).all() and (polys[..., 1] <= 600).all()


def test_nothing_to_paste_or_nowhere_to_put_it():
    img = np.full((100, 100, 3), 7, np.uint8)
    polys, ignore = np.array([_rect(0, 0, 100, 100)], np.float32), np.array([False])
    cp = CopyPaste()
    out, p, g = cp(img, polys, ignore, _donor(0, 3), np.random.default_rng(0))  # only ignored donor boxes
    assert np.array_equal(out, img) and np.array_equal(p, polys) and g.tolist() == [False]
    out, p, _ = cp(img, polys, ignore, _donor(3), np.random.default_rng(0))  # the whole image is a box
    assert np.array_equal(out, img) and len(p) == 1
    out, p, _ = CopyPaste(limit_paste=False)(img, polys, ignore, _donor(3), np.random.default_rng(0))
    assert len(p) == 2 and np.all(out == GREEN, axis=-1).sum() > 300
    small = np.zeros((8, 8, 3), np.uint8)  # the word does not fit whatever its angle
    out, p, _ = CopyPaste(limit_paste=False)(small, np.zeros((0, 4, 2)), np.zeros(0, bool), _donor(3),
                                             np.random.default_rng(0))
    assert not out.any() and len(p) == 0


def test_settings_are_checked():
    with pytest.raises(ValueError, match="data.builder.copy_paste"):
        DetTrainTransform(64, copy_paste={"ratio": 0.2})
    with pytest.raises(ValueError, match="objects_paste_ratio"):
        DetTrainTransform(64, copy_paste={"objects_paste_ratio": 2})
    with pytest.raises(ValueError, match="no donor"):
        DetTrainTransform(64, copy_paste={})(np.zeros((64, 64, 3), np.uint8), np.zeros((0, 4, 2)),
                                             np.zeros(0, bool), np.random.default_rng(0))


def _write_set(root, n=4):
    lines = []
    for i in range(n):
        img = np.full((120, 160, 3), 40 * i, np.uint8)
        img[20:40, 20:100] = GREEN
        cv2.imwrite(str(root / f"{i}.png"), img)
        lines.append(f"{i}.png\t{json.dumps([{'transcription': 'w', 'points': _rect(20, 20, 100, 40).tolist()}])}")
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    (root / "val.txt").write_text(lines[0] + "\n")


def test_dataset_items_with_copy_paste_are_reproducible(tmp_path):
    _write_set(tmp_path)
    # no flip, rotation or resize, and a crop of the whole image: the geometry leaves every box in view
    kw = dict(crop_size=64, eval_size=(64, 64), max_polys=4, scale=(1.0, 1.0), rotate=(0, 0), flip_p=0.0,
              min_crop_side_ratio=1.0)
    on = TextDetData(tmp_path, "train.txt", "val.txt", copy_paste={"objects_paste_ratio": 0.2}, **kw).build("train", 5)
    off = TextDetData(tmp_path, "train.txt", "val.txt", **kw).build("train", 5)
    assert "CopyPaste(objects_paste_ratio=0.2, limit_paste=True)" in repr(on)
    a, b = on[1], on[1]
    assert all(np.array_equal(a[k], b[k]) for k in a)  # the key (epoch, index) fixes every draw
    for key in range(2 * len(on)):  # the donor's word is one more text region in every item
        with_paste, without = on[key]["shrink_map"], off[key]["shrink_map"]
        assert with_paste.sum() > 1.5 * without.sum() and (with_paste >= without).all(), key
