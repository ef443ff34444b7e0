"""DB through the real configs and engine: a short run per DB model, drawings, eval.py."""
from __future__ import annotations

import json

import cv2
import pytest
from conftest import ROOT, compose, run_tool

from zoo.engine.run import train

DB_TINY = ["data.builder.num_train=8", "data.builder.num_val=4", "model.batch_size=2",
           "model.eval_batch_size=2", "trainer.max_steps=2", "trainer.log_every=1",
           "trainer.progress=false", "trainer.draw_samples=2"]


@pytest.mark.parametrize("model", ["db_det_tiny", "db_det"])
def test_short_db_run_writes_summary_and_drawings(model, tmp_path):
    summary = train(compose([f"model={model}", "amp=O1", *DB_TINY]), tmp_path)
    assert summary["primary_metric"]["name"] == "hmean"
    assert set(summary["metrics"]) >= {"precision", "recall", "hmean"}
    assert summary["requested_precision"] == "fp16-O1"
    assert summary["effective_precision"] == "emulated-fp16-O1" and summary["loss_scaler"] is not None
    # drawn in the precision that was measured and in FP32, each labelled, the legend below the image
    pngs = sorted((tmp_path / "drawings").glob("*.png"))
    assert [p.name for p in pngs] == ["step2_emulated-fp16-O1_0.png", "step2_emulated-fp16-O1_1.png",
                                      "step2_fp32_0.png", "step2_fp32_1.png"]
    img = cv2.imread(str(pngs[0]))
    assert img is not None and img.shape[0] > 256 and img.shape[1] >= 256
    assert summary["eval_numerics"] == {"images": 4, "watched": "layers", "nonfinite_images": 0, "nonfinite_output_images": 0,
                                        "image_indices": [], "first_layers": {}}
    assert summary["primary_metric"]["nonfinite_images"] == 0


@pytest.mark.slow
def test_db_train_then_eval_cli(tmp_path, ampzoo_home):
    env = {"AMPZOO_HOME": str(ampzoo_home)}
    run = tmp_path / "run"
    out = run_tool(["tools/train.py", "model=db_det_tiny", *DB_TINY, f"hydra.run.dir={run}"], ROOT, env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    out = run_tool(["tools/eval.py", "model=db_det_tiny", *DB_TINY, f"checkpoint={run}",
                    f"hydra.run.dir={tmp_path / 'ev'}"], ROOT, env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert result["metrics"] == summary["metrics"]
    assert len(result["drawings"]) == 2
