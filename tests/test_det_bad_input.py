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
    data = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4,
                       bad_samples="skip")
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
