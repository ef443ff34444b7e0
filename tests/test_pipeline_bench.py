"""tools/benchmark.py --pipeline (issue 15.6): stage timings as the dataset runs them, and a
PaddleOCR comparison that is skipped with a reason where PaddleOCR is not present."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_tool
from test_text_det_data import _write_root


def test_stage_clock_does_not_change_the_item_and_covers_every_stage(tmp_path):
    from zoo.bench import pipeline as pb

    ds = _write_root(tmp_path, n=3).build("train", 0)
    totals = pb.db_pass(ds, 3)
    assert list(totals) == list(pb.DB_STAGES) and all(v > 0 for v in totals.values())
    plain = ds[1]
    clocked = ds.transform(*_load(ds, 1), np.random.default_rng((ds.seed, 0, 1)), clock=lambda s: None)
    assert all(np.array_equal(plain[k], clocked[k]) for k in plain)
    ms = pb.summarize([totals, totals], 3)
    assert ms["total"] == pytest.approx(sum(totals.values()) * 1e3 / 3)


def _load(ds, i):
    from zoo.data.images import read_image_bgr
    from zoo.data.text_det.dataset import clip_polys_to_image

    img = read_image_bgr(ds.path(i))
    polys, ignore = ds.annotations(i)
    return (img, *clip_polys_to_image(polys, ignore, *img.shape[:2])[:2])


def test_copy_paste_is_a_stage_of_its_own(tmp_path):
    from zoo.bench import pipeline as pb
    from zoo.data.text_det.dataset import TextDetDataset

    _write_root(tmp_path, n=3)
    ds = TextDetDataset(tmp_path, tmp_path / "train.txt", "train", seed=0, crop_size=32,
                        copy_paste={"objects_paste_ratio": 0.2, "limit_paste": True})
    totals = pb.db_pass(ds, 3)
    assert list(totals) == ["read_decode", "copy_paste", *pb.DB_STAGES[1:]] and totals["copy_paste"] > 0
    # the PaddleOCR config each model's transforms are compared with
    assert pb.paddleocr_config("ppocrv5_mobile_det").as_posix() == "configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml"
    assert pb.paddleocr_config("db_det").as_posix() == pb.paddleocr_config("other_db").as_posix() \
        == "configs/det/det_mv3_db.yml"


def test_pipeline_benchmark_runs_and_skips_paddleocr_clearly(tmp_path):
    out = tmp_path / "r.json"
    r = run_tool(["tools/benchmark.py", "--pipeline", "--images", "4", "--passes", "1", "--workers", "0",
                  "--out", str(out), "model=db_det", "data.builder.num_train=8", "data.builder.num_val=2",
                  "--against", "paddleocr", str(tmp_path / "nowhere")], cwd=ROOT,
                 env_extra={"PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "PaddleOCR comparison skipped" in r.stdout and "not a PaddleOCR source tree" in r.stdout
    res = json.loads(out.read_text())
    assert set(res["zoo_ms_per_image"]) == {"read_decode", "augment", "crop", "border_map", "shrink_map",
                                             "normalize", "total"}
    assert res["images"] == 4 and res["loader_images_per_s"]["0"] > 0


@pytest.mark.skipif(not os.environ.get("AMPZOO_PADDLEOCR_SRC"),
                    reason="set AMPZOO_PADDLEOCR_SRC (and AMPZOO_PADDLEOCR_PYTHON) to a PaddleOCR checkout")
def test_paddleocr_worker_times_every_stage(tmp_path):
    from zoo.bench import pipeline as pb

    ds = _write_root(tmp_path, n=3).build("train", 0)
    w = pb.PaddleOCRWorker(Path(os.environ["AMPZOO_PADDLEOCR_SRC"]), pb.default_python(), ds.label_file, ds.root,
                           3, 32, 0)
    assert w.ok, w.reason
    assert set(w.run()) == set(pb.DB_STAGES)
    w.close()
    v5 = pb.PaddleOCRWorker(Path(os.environ["AMPZOO_PADDLEOCR_SRC"]), pb.default_python(), ds.label_file, ds.root,
                            3, 32, 0, pb.paddleocr_config("ppocrv5_mobile_det").as_posix())
    assert v5.ok, v5.reason
    assert set(v5.run()) == {*pb.DB_STAGES, "copy_paste"}
    v5.close()


def test_pipeline_ab_alternates_two_arms():
    """tools/pipeline_ab.py: two child processes (per-process settings such as keep_freed_memory)."""
    r = run_tool(["tools/pipeline_ab.py", "--passes", "2", "--images", "4",
                  "--a", "data.builder.keep_freed_memory=true", "--b", "data.builder.keep_freed_memory=false",
                  "model=db_det", "data.builder.num_train=8", "data.builder.num_val=2"], cwd=ROOT,
                 env_extra={"PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "A: data.builder.keep_freed_memory=true" in r.stdout and "medians of 2 passes of 4 images" in r.stdout
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[3:]}
    assert set(rows) == {"read_decode", "augment", "crop", "border_map", "shrink_map", "normalize", "total"}
    assert all(float(v[1]) > 0 and float(v[2]) > 0 for v in rows.values())
    bad = run_tool(["tools/pipeline_ab.py", "--passes", "1", "--images", "4", "--a", "data.builder.nope=1",
                    "--b", "", "model=db_det", "data.builder.num_train=8", "data.builder.num_val=2"], cwd=ROOT,
                   env_extra={"PYTHONPATH": str(ROOT)})
    assert bad.returncode != 0 and "an arm failed to start" in bad.stderr
