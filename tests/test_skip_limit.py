"""``bad_samples=skip`` says how much of each split it left out, and refuses when most of a split
goes (``data.builder.max_lost_fraction``, default 0.5; issue 40.4)."""
from __future__ import annotations

import json

import _entry
import cv2
import numpy as np
import pytest

from zoo.data.coco.dataset import COCODetData
from zoo.data.text_det.dataset import TextDetData

KEY = "data.builder.max_lost_fraction"


def _coco_root(tmp_path, n_images: int, no_bbox: list[int]):
    """``n_images`` 20x20 images with two boxes each; the annotation ids in ``no_bbox`` lack ``bbox``."""
    (tmp_path / "img").mkdir()
    images, anns = [], []
    for iid in range(1, n_images + 1):
        cv2.imwrite(str(tmp_path / "img" / f"{iid:04d}.png"), np.zeros((20, 20, 3), np.uint8))
        images.append({"id": iid, "file_name": f"{iid:04d}.png", "width": 20, "height": 20})
        for k in range(2):
            aid = len(anns) + 1
            ann = {"id": aid, "image_id": iid, "category_id": 1, "bbox": [1 + k, 1, 5, 5], "iscrowd": 0}
            if aid in no_bbox:
                del ann["bbox"]
            anns.append(ann)
    doc = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "a"}]}
    for split in ("train", "val"):
        (tmp_path / f"{split}.json").write_text(json.dumps(doc))
    return tmp_path / "train.json"


def _coco(tmp_path, **kw):
    return COCODetData(tmp_path, "train.json", "val.json", "img", "img", image_size=32, eval_size=32,
                       multiscale=None, bad_samples="skip", **kw)


# The issue's case: 29 annotations without bbox on 28 of 40 images (ids 1, 3, ..., 55 and 56).
ISSUE_NO_BBOX = [2 * i + 1 for i in range(28)] + [56]


def test_coco_losing_most_images_is_one_error_naming_file_counts_and_key(tmp_path, capsys):
    ann = _coco_root(tmp_path, 40, ISSUE_NO_BBOX)
    expected = (f"{ann}: data.builder.bad_samples=skip would leave out 28 of 40 images (70%) and 56 of 80 "
                f"annotations of the train split for 29 problems, more than {KEY}=0.5 of them; first problem: "
                f"{ann}: annotation id=1 (image id=1, 0001.png): missing key 'bbox'; fix the file, or set "
                f"{KEY}=1 to use the 12 left")
    with pytest.raises(ValueError) as err:
        _coco(tmp_path).build("train", 0)
    assert str(err.value) == expected
    with pytest.raises(SystemExit) as exit_:  # as the other data errors: one error line, exit status 2
        _entry.run_or_exit(lambda: _coco(tmp_path).build("train", 0))
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {expected}"]


def test_coco_threshold_raised_trains_on_what_is_left_and_says_how_much_went(tmp_path, caplog):
    ann = _coco_root(tmp_path, 40, ISSUE_NO_BBOX)
    data = _coco(tmp_path, max_lost_fraction=1)
    with caplog.at_level("WARNING"):
        assert len(data.build("train", 0)) == 12
    assert (f"data: {ann}: left out 28 of 40 images (70%) and 56 of 80 annotations of the train split for 29 "
            f"problems (data.builder.bad_samples=skip, up to {KEY}=1)") in caplog.text
    report = data.data_report()["train"]
    assert (report["images_in_file"], report["images_lost"], report["samples"]) == (40, 28, 12)
    assert (report["annotations_in_file"], report["annotations_lost"], report["skipped"]) == (80, 56, 29)


def test_coco_few_lost_warns_with_counts_per_split(tmp_path, caplog):
    _coco_root(tmp_path, 40, [1, 2, 7])  # image 1 loses both boxes, image 4 one: 2 images, 4 annotations
    data = _coco(tmp_path)
    with caplog.at_level("WARNING"):
        assert len(data.build("train", 0)) == 38 and len(data.build("val", 0)) == 38
    for split in ("train", "val"):
        assert (f"{tmp_path / (split + '.json')}: left out 2 of 40 images (5%) and 4 of 80 annotations of the "
                f"{split} split for 3 problems") in caplog.text


def test_coco_exactly_half_lost_is_still_accepted(tmp_path):
    _coco_root(tmp_path, 4, [1, 3])  # 2 of 4 images: not more than half
    assert len(_coco(tmp_path).build("train", 0)) == 2
    with pytest.raises(ValueError, match=rf"2 of 4 images \(50%\).*more than {KEY}=0.4 of them"):
        _coco(tmp_path, max_lost_fraction=0.4).build("train", 0)


BOX = '[{"transcription": "AB", "points": [[10, 10], [60, 10], [60, 30], [10, 30]]}]'


def _text_root(tmp_path, good: int, bad: int):
    (tmp_path / "img").mkdir()
    cv2.imwrite(str(tmp_path / "img" / "good.png"), np.full((64, 96, 3), 128, np.uint8))
    lines = [f"img/good.png\t{BOX}"] * good + ["img/missing.png\t" + BOX] * bad
    for name in ("train.txt", "val.txt"):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    return tmp_path / "train.txt"


def _text(tmp_path, **kw):
    return TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4,
                       bad_samples="skip", **kw)


def test_text_losing_most_lines_is_one_error_naming_file_counts_and_key(tmp_path, capsys):
    path = _text_root(tmp_path, 2, 3)
    with pytest.raises(SystemExit) as exit_:
        _entry.run_or_exit(lambda: _text(tmp_path).build("train", 0))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: {path}: data.builder.bad_samples=skip would leave out 3 of 5 label lines (images) (60%) and "
        f"3 of 5 text boxes (60%) of the train split for 3 problems, more than {KEY}=0.5 of them; first problem: {path}:3: image is missing")
    assert err[0].endswith(f"; fix the file, or set {KEY}=1 to use the 2 left")


def test_text_few_lost_warns_with_share_and_threshold(tmp_path, caplog):
    path = _text_root(tmp_path, 3, 2)
    with caplog.at_level("WARNING"):
        assert len(_text(tmp_path).build("train", 0)) == 3
    assert (f"skipped 2 of 5 samples of {path} (40% of the train split's label lines, each an image) and "
            f"2 of 5 text boxes (40%); data.builder.bad_samples=skip, up to {KEY}=0.5;") in caplog.text


def test_text_lost_boxes_count_each_line_and_name_the_unreadable_ones(tmp_path, caplog):
    """Issue 40 item 4 for label files: the boxes lost with skipped lines, where the labels were read."""
    two = '[{"transcription": "A", "points": [[1, 1], [9, 1], [9, 9], [1, 9]]}, ' \
          '{"transcription": "B", "points": [[11, 1], [19, 1], [19, 9], [11, 9]]}]'
    (tmp_path / "img").mkdir()
    cv2.imwrite(str(tmp_path / "img" / "good.png"), np.full((64, 96, 3), 128, np.uint8))
    lines = [f"img/good.png\t{BOX}"] * 4 + [f"img/missing.png\t{two}", "img/good.png\tnot json"]
    for name in ("train.txt", "val.txt"):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    with caplog.at_level("WARNING"):
        assert len(_text(tmp_path).build("train", 0)) == 4
    # 4 kept lines of one box, the missing image's 2 boxes lost, the unparsable line's boxes unknown
    assert ("(33% of the train split's label lines, each an image) and 2 of 6 text boxes (33%), plus the "
            "boxes of 1 line that could not be read;") in caplog.text


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan"), True, "half"])
def test_bad_threshold_is_an_error_naming_the_key(tmp_path, value):
    _text_root(tmp_path, 1, 0)
    with pytest.raises(ValueError, match=rf"^{KEY}: expected a number in \[0, 1\]"):
        _text(tmp_path, max_lost_fraction=value)
    with pytest.raises(ValueError, match=rf"^{KEY}: expected a number in \[0, 1\]"):
        _coco(tmp_path, max_lost_fraction=value)
