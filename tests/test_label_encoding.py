"""Label and annotation files that are not UTF-8 are one error naming file, line, byte offset and
the fix; a UTF-8 BOM is accepted in PaddleOCR label files and COCO json alike (issue 40.2, 40.3)."""
from __future__ import annotations

import json

import _entry
import cv2
import numpy as np
import pytest

from zoo.data.coco.dataset import load_coco_instances
from zoo.data.text_det.dataset import TextDetData, load_det_labels

BOX = '[{"transcription": "%s", "points": [[10, 10], [60, 10], [60, 30], [10, 30]]}]'


def _label_root(tmp_path, lines: list[bytes], bom: bool = False):
    (tmp_path / "img").mkdir(exist_ok=True)
    cv2.imwrite(str(tmp_path / "img" / "good.png"), np.full((64, 96, 3), 128, np.uint8))
    data = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(lines) + b"\n"
    for name in ("train.txt", "val.txt"):
        (tmp_path / name).write_bytes(data)
    return tmp_path / "train.txt"


def _line(text: str, encoding: str = "utf-8") -> bytes:
    return b"img/good.png\t" + (BOX % text).encode(encoding)


def _data(tmp_path, **kw):
    return TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4, **kw)


def test_gbk_label_line_is_one_error_naming_file_line_offset_and_fix(tmp_path, capsys):
    lines = [_line("AB"), _line("中文", "gbk"), _line("AB")]
    path = _label_root(tmp_path, lines)
    offset = len(lines[0]) + 1 + lines[1].index(b"\xd6")  # 0xd6 0xd0 is GBK for 中
    expected = (f"{path}:2: not UTF-8 text (byte 0xd6 at byte offset {offset} of the file); re-encode the "
                f"file to UTF-8, e.g. for GBK text: iconv -f GBK -t UTF-8 {path} > {path}.utf8 and use that")
    with pytest.raises(ValueError) as err:
        _data(tmp_path).build("train", 0)
    assert str(err.value) == expected
    # as the other file:line data errors: one error line, exit status 2
    with pytest.raises(SystemExit) as exit_:
        _entry.run_or_exit(lambda: _data(tmp_path).build("train", 0))
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {expected}"


def test_skip_mode_skips_undecodable_lines_and_counts_them(tmp_path, caplog):
    lines = [_line("AB"), _line("中文", "gbk"), _line("AB"), _line("é", "latin-1"), _line("中文")]
    path = _label_root(tmp_path, lines)
    data = _data(tmp_path, bad_samples="skip")
    with caplog.at_level("WARNING"):
        train = data.build("train", 0)
    assert len(train) == 3 and train.lines.tolist() == [1, 3, 5]
    skipped = data.skipped["train"]
    assert len(skipped) == 2 and skipped[0].startswith(f"{path}:2: not UTF-8 text")
    assert skipped[1].startswith(f"{path}:4: not UTF-8 text (byte 0xe9 at byte offset ")
    assert data.data_report()["train"]["skipped"] == 2
    assert f"skipped 2 of 5 samples of {path}" in caplog.text


def test_bom_label_file_is_still_accepted(tmp_path):
    lines = [_line("AB"), _line("中文"), b"", _line("AB") + b"\r"]
    path = _label_root(tmp_path, lines, bom=True)
    with_bom, _ = load_det_labels(path)
    _label_root(tmp_path, lines, bom=False)
    without, _ = load_det_labels(path)
    assert [s[0] for s in with_bom] == ["img/good.png"] * 3
    for a, b in zip(with_bom, without, strict=True):
        assert a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    assert len(_data(tmp_path).build("train", 0)) == 3


def _coco_doc(tmp_path, name="猫"):
    (tmp_path / "img").mkdir(exist_ok=True)
    cv2.imwrite(str(tmp_path / "img" / "0001.png"), np.zeros((20, 20, 3), np.uint8))
    return {"images": [{"id": 1, "file_name": "0001.png", "width": 20, "height": 20}],
            "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 5, 6], "iscrowd": 0}],
            "categories": [{"id": 1, "name": name}]}


def test_coco_json_with_bom_loads_as_without(tmp_path):
    text = json.dumps(_coco_doc(tmp_path), ensure_ascii=False, indent=1)
    (tmp_path / "plain.json").write_bytes(text.encode("utf-8"))
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    plain = load_coco_instances(tmp_path / "plain.json", tmp_path / "img")
    bom = load_coco_instances(tmp_path / "bom.json", tmp_path / "img")
    assert bom.class_names == plain.class_names == ["猫"] and bom.cat_ids == plain.cat_ids
    assert len(bom.records) == len(plain.records) == 1
    for key, value in plain.records[0].items():
        assert np.array_equal(bom.records[0][key], value), key


@pytest.mark.parametrize("encoding, name, bad", [("gbk", "中文", "0xd6"), ("latin-1", "café", "0xe9")])
@pytest.mark.parametrize("bom", [False, True])
def test_coco_json_not_utf8_is_one_error_naming_file_offset_and_fix(tmp_path, encoding, name, bad, bom):
    data = (b"\xef\xbb\xbf" if bom else b"") + json.dumps(_coco_doc(tmp_path, name), ensure_ascii=False,
                                                           indent=1).encode(encoding)
    path = tmp_path / "ann.json"
    path.write_bytes(data)
    offset = data.index(bytes.fromhex(bad[2:]))
    line = data.count(b"\n", 0, offset) + 1
    with pytest.raises(ValueError) as err:
        load_coco_instances(path, tmp_path / "img")
    assert str(err.value) == (f"{path}:{line}: not UTF-8 text (byte {bad} at byte offset {offset} of the file); "
                              f"re-encode the file to UTF-8, e.g. for GBK text: iconv -f GBK -t UTF-8 {path} > "
                              f"{path}.utf8 and use that")
