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


def test_coco_clipped_and_outside_boxes_name_their_ids(tmp_path, caplog):
    from test_bad_files import _jpeg

    _jpeg(tmp_path / "img" / "a.jpg")  # 96 x 64
    ann = _coco(tmp_path, {1: "a.jpg"}, {1: (64, 96)})
    data = json.loads(ann.read_text())
    data["annotations"] = [{"id": 11, "image_id": 1, "category_id": 1, "bbox": [1, 1, 10, 10]},
                           {"id": 12, "image_id": 1, "category_id": 1, "bbox": [90, 1, 30, 10]},
                           {"id": 13, "image_id": 1, "category_id": 1, "bbox": [200, 1, 30, 10]}]
    ann.write_text(json.dumps(data))
    inst = load_coco_instances(ann, tmp_path / "img")
    assert inst.clipped_ids == [12] and inst.outside_ids == [13] and inst.degenerate_ids == []
    root = COCODetData(tmp_path, train_ann="annotations/ann.json", val_ann="annotations/ann.json",
                       train_images="img", val_images="img", image_size=32, eval_size=32, multiscale=None)
    with caplog.at_level("WARNING"):
        root.build("train", 0)
    assert "dropped 1 boxes lying outside their image (annotation ids 13)" in caplog.text
    assert "clipped 1 boxes" in caplog.text and "ids 12" in caplog.text
    report = root.data_report()["train"]
    assert report["outside_ids"] == [13] and report["clipped_boxes"] == 1 and report["degenerate_boxes"] == 0


# Image 1 is 96 x 64 (w x h), image 2 the same size.
FIT_CASES = [
    (21, 1, [10, 10, 20, 20], None),                   # inside: kept as it is
    (22, 1, [80, -5, 30, 20], "clipped"),              # past the right and top edges
    (23, 1, [100, 10, 20, 20], "outside"),             # wholly right of the image
    (24, 1, [-30, 10, 20, 20], "outside"),             # wholly left of it
    (25, 1, [96, 10, 20, 20], "outside"),              # touching the right edge from outside: nothing inside
    (26, 1, [95.999999, 10, 20, 20], "outside"),       # under 1e-5 px inside
    (27, 1, [5, 5, 0, 10], "degenerate"),              # zero width in the file
    (28, 1, [10, 10, 20, 20], "duplicate"),            # id 21 again: dropped, 21 kept
    (29, 1, [10, 10, 20, 20], "duplicate"),            # and again
    (30, 2, [10, 10, 20, 20], None),                   # the same box in another image is another object
    (31, 1, [80, -5, 30, 20], "duplicate"),            # a repeat of a clipped box
]


def _fit_root(tmp_path, cats=({"id": 1, "name": "a"}, {"id": 2, "name": "b"})):
    from test_bad_files import _jpeg

    _jpeg(tmp_path / "img" / "a.jpg")
    _jpeg(tmp_path / "img" / "b.jpg")
    ann = _coco(tmp_path, {1: "a.jpg", 2: "b.jpg"}, {1: (64, 96), 2: (64, 96)})
    data = json.loads(ann.read_text())
    data["categories"] = list(cats)
    data["annotations"] = [{"id": i, "image_id": im, "category_id": 1, "bbox": box} for i, im, box, _ in FIT_CASES]
    data["annotations"].append({"id": 32, "image_id": 1, "category_id": 2, "bbox": [10, 10, 20, 20]})  # other class
    ann.write_text(json.dumps(data))
    return ann


def test_coco_boxes_that_do_not_fit_are_clipped_or_dropped_by_kind_and_named(tmp_path):
    """Upstream (ppdet/data/source/coco.py) keeps these boxes as they are, logging only the ones of no
    area; here each kind has its rule, its count and its annotation ids, and a message naming it."""
    ann = _fit_root(tmp_path)
    inst = load_coco_instances(ann, tmp_path / "img", keep_gt=True)
    expect = {kind: [i for i, _, _, k in FIT_CASES if k == kind] for kind in ("clipped", "outside", "degenerate",
                                                                           "duplicate")}
    assert (inst.clipped_ids, inst.outside_ids, inst.degenerate_ids, inst.duplicate_ids) == \
        (expect["clipped"], expect["outside"], expect["degenerate"], expect["duplicate"])
    assert inst.num_degenerate == 1
    first, second = inst.records
    np.testing.assert_array_equal(first["boxes"], np.float32([[10, 10, 30, 30], [80, 0, 96, 15], [10, 10, 30, 30]]))
    assert first["labels"].tolist() == [0, 0, 1] and second["boxes"].tolist() == [[10, 10, 30, 30]]
    assert len(inst.notes) == 9 and all(f"annotation id={i} " in n for i, n in
                                        zip([22, 23, 24, 25, 26, 27, 28, 29, 31], inst.notes))
    by_id = {int(n.split("annotation id=")[1].split()[0]): n for n in inst.notes}
    assert by_id[22].endswith("bbox [80, -5, 30, 20] reaches outside the 96x64 (w x h) image; clipped to "
                              "[80, 0, 16, 15]")
    assert by_id[23].endswith("bbox [100, 10, 20, 20] lies outside the 96x64 (w x h) image (under 1e-5 px of it "
                              "inside); dropped")
    assert "zero width or height; dropped" in by_id[27]
    assert by_id[29].endswith("the same image_id, category_id and bbox [10, 10, 20, 20] as annotation id=21; "
                              "dropped (the first is kept)")
    # evaluation's ground truth: the same boxes, the clipped one clipped
    gt = {a["id"]: a["bbox"] for a in inst.gt["annotations"]}
    assert sorted(gt) == [21, 22, 30, 32] and gt[22] == [80, 0, 16, 15] and gt[21] == [10, 10, 20, 20]


def test_coco_fit_rule_is_reported_in_summary_and_data_problems(tmp_path, ampzoo_home):
    from conftest import compose

    from zoo.engine.run import train

    _fit_root(tmp_path / "d")
    (tmp_path / "d" / "annotations" / "ann.json").rename(tmp_path / "d" / "annotations" / "instances.json")
    cfg = compose(["model=ppyoloe_tiny", "data=coco", f"data.root={tmp_path / 'd'}", "data.num_classes=2",
                   "data.builder.train_ann=annotations/instances.json", "data.builder.val_ann=annotations/instances.json",
                   "data.builder.train_images=img", "data.builder.val_images=img", "data.builder.image_size=64",
                   "data.builder.eval_size=64", "data.builder.multiscale=null", "model.batch_size=2",
                   "model.eval_batch_size=2", "trainer.max_steps=1", "trainer.progress=false", "sched.warmup_steps=0",
                   "trainer.eval_precision=train", "trainer.bootstrap_resamples=0", "trainer.draw_samples=0"])
    summary = train(cfg, tmp_path / "run")
    for split in ("train", "val"):
        report = summary["data_report"][split]
        assert (report["clipped_boxes"], report["outside_boxes"], report["degenerate_boxes"],
                report["duplicate_boxes"]) == (1, 4, 1, 3)
        assert report["duplicate_ids"] == [28, 29, 31] and "notes" not in report and report["skipped"] == 0
    listed = (tmp_path / "run" / "data_problems.txt").read_text().splitlines()
    assert len(listed) == 18 and all(line.startswith(("train: ", "val: ")) for line in listed)
    assert [line.split("annotation id=")[1].split()[0] for line in listed[:9]] == \
        ["22", "23", "24", "25", "26", "27", "28", "29", "31"]


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
                   "data.builder.bad_samples=skip", "data.builder.max_lost_fraction=1",  # 5 of 9 lines bad
                   "data.builder.crop_size=64", "data.builder.eval_size=[64,96]", "model.batch_size=2", "model.eval_batch_size=1", "trainer.max_steps=2", "trainer.progress=false",
                   "sched.warmup_steps=0", "trainer.draw_samples=0"])
    summary = train(cfg, tmp_path / "run")
    assert summary["data_report"]["train"]["skipped"] == 5 and summary["data_report"]["train"]["samples"] == 4
    listed = (tmp_path / "run" / "data_problems.txt").read_text().splitlines()
    assert len(listed) == 5 and all(f"missing{i}.png" in line for i, line in enumerate(listed))
