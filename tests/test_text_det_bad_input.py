"""Bad detection data is reported with file and line, before training, under a configurable policy."""
from __future__ import annotations

import cv2
import numpy as np
import pytest

from zoo.data import EvalBatchSampler, TrainBatchSampler, build_loader
from zoo.data.text_det.dataset import TextDetData

GOOD = '[{"transcription": "AB", "points": [[10, 10], [60, 10], [60, 30], [10, 30]]}]'
BAD_LINES = {
    "bad JSON": "img/good.png\t[{\"transcription\": \"AB\", \"points\": [[1, 2]",
    "three points": 'img/good.png\t[{"transcription": "AB", "points": [[10, 10], [60, 10], [60, 30]]}]',
    "NaN coordinates": 'img/good.png\t[{"transcription": "AB", "points": [[NaN, 10], [60, 10], [60, 30], [10, 30]]}]',
    "unreadable image": f"img/corrupt.png\t{GOOD}",
    "missing image": f"img/missing.png\t{GOOD}",
}
EXPECT = {"bad JSON": "bad JSON", "three points": "at least 4", "NaN coordinates": "non-finite",
          "unreadable image": "cannot be decoded", "missing image": "missing"}


def _root(tmp_path, bad_line: str | None) -> None:
    (tmp_path / "img").mkdir(exist_ok=True)
    cv2.imwrite(str(tmp_path / "img" / "good.png"), np.full((64, 96, 3), 128, np.uint8))
    (tmp_path / "img" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    lines = [f"img/good.png\t{GOOD}", f"img/good.png\t{GOOD}"] + ([bad_line] if bad_line else [])
    for name in ("train.txt", "val.txt"):
        (tmp_path / name).write_text("\n".join(lines) + "\n")



@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_fail_policy_names_file_and_line(tmp_path, case):
    _root(tmp_path, BAD_LINES[case])
    data = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4)
    with pytest.raises((ValueError, OSError)) as err:
        data.build("train", 0)
    assert f"{tmp_path / 'train.txt'}:3" in str(err.value) and EXPECT[case] in str(err.value)


def test_skip_policy_counts_and_trains_through_the_epoch(tmp_path):
    (tmp_path / "img").mkdir()
    cv2.imwrite(str(tmp_path / "img" / "good.png"), np.full((64, 96, 3), 128, np.uint8))
    (tmp_path / "img" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    lines = [f"img/good.png\t{GOOD}"] * 2 + list(BAD_LINES.values())
    for name in ("train.txt", "val.txt"):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    # most lines are bad here: max_lost_fraction=1 lets skip leave out more than half (test_skip_limit.py)
    data = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4,
                       bad_samples="skip", max_lost_fraction=1)
    train, val = data.build("train", 0), data.build("val", 0)
    assert len(train) == 2 and len(data.skipped["train"]) == len(BAD_LINES)
    assert all(f"train.txt:{n}" in msg for n, msg in zip(range(3, 8), data.skipped["train"]))
    for batch in build_loader(val, EvalBatchSampler(len(val), 2)):
        assert batch["image"].shape[0] == 2
    it = iter(build_loader(train, TrainBatchSampler(len(train), 2, seed=0)))
    for _ in range(3):  # past one epoch
        assert next(it)["shrink_map"].shape[-1] == 32


def test_bad_policy_value_is_named(tmp_path):
    with pytest.raises(ValueError, match="data.builder.bad_samples"):
        TextDetData(tmp_path, bad_samples="ignore")


@pytest.mark.parametrize("verify", [True, "decode", False])
def test_a_1x1_png_is_an_image_and_trains_as_paddleocr_takes_it(tmp_path, verify):
    """A 1x1 PNG is a valid image. PaddleOCR decodes it and trains on it (its SimpleDataSet never
    stops for a sample: one that fails is logged and replaced by a random other), so it is accepted:
    the reduced (1/8) decode of ``verify_images=decode`` falls back to a full one (OpenCV's resize
    asserted ``inv_scale_x > 0`` on it), its text is clipped to the image and counted, left with no
    area it becomes don't-care, and the DB transforms make an all-background item of it."""
    (tmp_path / "img").mkdir()
    cv2.imwrite(str(tmp_path / "img" / "good.png"), np.full((64, 96, 3), 128, np.uint8))
    cv2.imwrite(str(tmp_path / "img" / "dot.png"), np.full((1, 1, 3), 200, np.uint8))
    lines = [f"img/good.png\t{GOOD}", f"img/good.png\t{GOOD}", f"img/dot.png\t{GOOD}", "img/dot.png\t[]"]
    for name in ("train.txt", "val.txt"):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    data = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4,
                       verify_images=verify)
    train, val = data.build("train", 0), data.build("val", 0)
    assert len(train) == 4 and data.skipped["train"] == []
    if verify:  # the clipping is counted where the images are checked
        report = data.data_report()["train"]
        assert report["clipped_polygons"] == 1 and report["clipped_at"] == [f"{tmp_path / 'train.txt'}:3"]
        assert report["empty_label_lists"] == 1
        assert train.annotations(2)[1].tolist() == [True]  # nothing of the text left in the image: don't-care
    for epoch in range(3):
        for index in (2, 3):
            item = train[epoch * len(train) + index]
            assert item["image"].shape == (3, 32, 32) and np.isfinite(item["image"]).all()
            assert item["shrink_map"].max() == 0  # no text to find in it
    it = iter(build_loader(train, TrainBatchSampler(len(train), 2, seed=0)))
    for _ in range(4):
        assert next(it)["shrink_map"].shape[-1] == 32
    item = val[2]  # upstream's DetResizeForTest pads it to 32x32 first; the ratios refer to that
    assert item["image"].shape == (3, 64, 96) and item["shape"].tolist() == [1, 1, 2, 3]
    assert item["ignore"][0] == 1
    assert sum(b["image"].shape[0] for b in build_loader(val, EvalBatchSampler(len(val), 2))) == 4
