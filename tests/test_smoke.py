"""The README's smoke command trains every model config: ``python tools/train.py model=<m> trainer.max_steps=10``.

resnet_tiny runs that command as written. The other models take up to minutes per run on a CPU
(resnet101, db_det_r50, ppyoloe_x: 4-7 min on 2 busy cores), so they run it in-process on less:
2 steps of batch 2 from a 4-image training split, 2 validation images, 64-pixel detection images,
no bootstrap and no second (FP32) evaluation; checkpoints are written as in any run. A warm-up
longer than the run is clipped (zoo/engine/schedules.py): that made resnet_tiny and ppyoloe_tiny fail.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import CONFIG_DIR, ROOT, compose, run_tool

from zoo.engine.run import train

README_SMOKE = ["trainer.max_steps=10"]
SMOKE = ["trainer.max_steps=2", "model.batch_size=2", "model.eval_batch_size=2", "data.builder.num_train=4",
         "data.builder.num_val=2", "trainer.eval_precision=train", "trainer.bootstrap_resamples=0",
         "trainer.draw_samples=0", "trainer.progress=false", "trainer.log_every=1"]
# smaller inputs, per embedded data set (synthetic_shapes is 32 px already)
SMALL_INPUT = {"synthetic_text": ["data.builder.image_size=[64,64]", "data.builder.crop_size=64"],
               "synthetic_shapes_det": ["data.builder.image_size=64"], "synthetic_shapes": []}
SLOW = {"ppyoloe_x"}  # > 20 s here, most of it writing its 1.2 GB checkpoint
MODELS = [pytest.param(m, marks=[pytest.mark.slow] if m in SLOW else [])
          for m in sorted(p.stem for p in (Path(CONFIG_DIR) / "model").glob("*.yaml")) if m != "resnet_tiny"]


def test_the_readme_smoke_command_as_written(tmp_path, ampzoo_home):
    run = tmp_path / "run"
    out = run_tool(["tools/train.py", "model=resnet_tiny", *README_SMOKE, f"hydra.run.dir={run}"], ROOT,
                   {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert [ln for ln in out.stderr.splitlines() if ln.startswith("warning: sched.")] == [
        "warning: sched.warmup_steps: a warm-up of 10 steps is not shorter than the run (10 steps); "
        "clipped to 5 steps, half the run (summary.json: warmup_clipped)"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 10 and summary["warmup_clipped"]["used_steps"] == 5


@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_trains_with_the_smoke_command(model, tmp_path):
    data = compose([f"model={model}"]).data.name
    summary = train(compose([f"model={model}", *SMOKE, *SMALL_INPUT[data]]), tmp_path, announce_folder=False)
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert math.isfinite(summary["primary_metric"]["value"])
