"""Data that is accepted with a rule is counted, named, and reported in summary.json."""
from __future__ import annotations

import json

import cv2
import numpy as np
from test_bad_files import _coco

from zoo.data.coco.dataset import COCODetData, load_coco_instances
from zoo.data.text_det.dataset import TextDetData, clip_polys_to_image


def _label(points):
    return json.dumps([{"transcription": "AB", "points": points}])


def test_polygons_outside_the_image_are_clipped_and_counted(tmp_path):
    (tmp_path / "img").mkdir()
    cv2.imwrite(str(tmp_path / "img" / "a.png"), np.full((64, 96, 3), 128, np.uint8))  # h 64, w 96
    inside = [[10, 10], [60, 10], [60, 30], [10, 30]]
    lines = [f"img/a.png\t{_label(inside)}",
             f"img/a.png\t{_label([[80, 10], [200, 10], [200, 30], [80, 30]])}",  # reaches past x = 95.5
             f"img/a.png\t{_label([[300, 10], [400, 10], [400, 30], [300, 30]])}",  # wholly outside
             "img/a.png\t[]"]  # a text-free image: allowed by the format, counted
    for name in ("train.txt", "val.txt"):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    data = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4)
    val = data.build("val", 0)
    report = data.data_report()["val"]
    assert report["clipped_polygons"] == 2 and report["empty_label_lists"] == 1 and report["samples"] == 4
    assert report["clipped_at"] == [f"{tmp_path / 'val.txt'}:2", f"{tmp_path / 'val.txt'}:3"]
    polys, ignore = val.annotations(0)
    np.testing.assert_array_equal(polys[0], np.float32(inside))  # untouched bit for bit
    polys, ignore = val.annotations(1)
    assert polys[..., 0].max() == 95.5 and not ignore[0]
    polys, ignore = val.annotations(2)
    assert ignore[0]  # nothing of it left in the image: don't-care


def test_clip_rule_without_verification_matches():
    polys = np.float32([[[80, 10], [200, 10], [200, 30], [80, 30]]])
    out, ignore, n = clip_polys_to_image(polys, np.zeros(1, bool), 64, 96)
    assert n == 1 and out[0, 1, 0] == 95.5 and not ignore[0]


def test_coco_clipped_and_degenerate_boxes_name_their_ids(tmp_path, caplog):
    from test_bad_files import _jpeg

    _jpeg(tmp_path / "img" / "a.jpg")  # 96 x 64
    ann = _coco(tmp_path, {1: "a.jpg"}, {1: (64, 96)})
    data = json.loads(ann.read_text())
    data["annotations"] = [{"id": 11, "image_id": 1, "category_id": 1, "bbox": [1, 1, 10, 10]},
                           {"id": 12, "image_id": 1, "category_id": 1, "bbox": [90, 1, 30, 10]},
                           {"id": 13, "image_id": 1, "category_id": 1, "bbox": [200, 1, 30, 10]}]
    ann.write_text(json.dumps(data))
    inst = load_coco_instances(ann, tmp_path / "img")
    assert inst.clipped_ids == [12] and inst.degenerate_ids == [13]
    root = COCODetData(tmp_path, train_ann="annotations/ann.json", val_ann="annotations/ann.json",
                       train_images="img", val_images="img", image_size=32, eval_size=32, multiscale=None)
    with caplog.at_level("WARNING"):
        root.build("train", 0)
    assert "annotation ids 13" in caplog.text and "clipped 1 boxes" in caplog.text and "ids 12" in caplog.text
    report = root.data_report()["train"]
    assert report["degenerate_ids"] == [13] and report["clipped_boxes"] == 1


def test_skipped_samples_all_listed_and_counted_in_summary(tmp_path, ampzoo_home):
    from conftest import compose

    from zoo.engine.run import train

    (tmp_path / "d" / "img").mkdir(parents=True)
    cv2.imwrite(str(tmp_path / "d" / "img" / "a.png"), np.full((64, 96, 3), 128, np.uint8))
    good = f"img/a.png\t{_label([[10, 10], [60, 10], [60, 30], [10, 30]])}"
    bad = [f"img/missing{i}.png\t[]" for i in range(5)]
    (tmp_path / "d" / "train.txt").write_text("\n".join([good] * 4 + bad) + "\n")
    (tmp_path / "d" / "val.txt").write_text(good + "\n")
    cfg = compose(["model=db_det_tiny", "data=icdar2015", f"data.root={tmp_path / 'd'}",
                   "data.builder.train_label=train.txt", "data.builder.val_label=val.txt",
                   "data.builder.bad_samples=skip", "data.builder.crop_size=64", "data.builder.eval_size=[64,96]",
                   "model.batch_size=2", "model.eval_batch_size=1", "trainer.max_steps=2", "trainer.progress=false",
                   "sched.warmup_steps=0", "trainer.draw_samples=0"])
    summary = train(cfg, tmp_path / "run")
    assert summary["data_report"]["train"]["skipped"] == 5 and summary["data_report"]["train"]["samples"] == 4
    listed = (tmp_path / "run" / "data_problems.txt").read_text().splitlines()
    assert len(listed) == 5 and all(f"missing{i}.png" in line for i, line in enumerate(listed))
