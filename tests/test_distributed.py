"""Two CPU ranks over gloo: same code path, identical parameters at the end, pooled metrics."""
from __future__ import annotations

import json

import pytest
from conftest import ROOT, TINY, launch_failure, run_tool

import zoo
from zoo.engine import checkpoint as ckpt
from zoo.utils.distributed import parameter_digest


@pytest.mark.slow
def test_two_process_cpu_launch_ends_in_sync(tmp_path, ampzoo_home):
    args = ["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
            str(ROOT / "tools" / "train.py"), *TINY, "model.batch_size=8", "trainer.ema_decay=0.9"]
    out = run_tool(args, tmp_path, {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 0, launch_failure(out, tmp_path / "log")
    # Both ranks named the same run folder (the launcher's start time), and only rank 0 wrote the run.
    runs = list((tmp_path / "outputs").glob("*/*"))
    assert len(runs) == 1, runs
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch_size"] == 16
    assert sorted(p.name for p in (runs[0] / "launch_log").iterdir()) == ["workerlog.0", "workerlog.1"]
    assert summary["ranks_in_sync"] and len(set(summary["param_digests"])) == 1
    assert len(summary["param_digests"]) == 2
    # Each rank evaluated half of the 48 validation images; the pooled count is the whole split.
    assert summary["metrics"]["num_samples"] == 48
    # Independent check: the saved weights hash to the digest both ranks reported.
    model = zoo.create_model("resnet_tiny", num_classes=10)
    model.set_state_dict(ckpt.load(runs[0] / "checkpoints" / ckpt.LAST)["model"])
    assert parameter_digest(model) == summary["param_digests"][0]
    assert summary["steps"] == 4


@pytest.mark.slow
def test_two_rank_ppyoloe_pools_detections_for_coco_map(tmp_path, ampzoo_home):
    """COCO mAP is not a sum over batches: the ranks' detections are gathered before COCOeval, so the
    2-rank result equals a one-process evaluation of the same weights on the whole split."""
    tiny = ["model=ppyoloe_tiny", "data.builder.num_train=16", "data.builder.num_val=6", "data.builder.image_size=64",
            "model.batch_size=2", "model.eval_batch_size=2", "trainer.max_steps=3", "trainer.log_every=1",
            "trainer.progress=false", "trainer.draw_samples=0", "sched.warmup_steps=1",
            "model.task.nms.score_threshold=0.0"]
    env = {"AMPZOO_HOME": str(ampzoo_home)}
    args = ["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
            str(ROOT / "tools" / "train.py"), *tiny]
    out = run_tool(args, tmp_path, env)
    assert out.returncode == 0, launch_failure(out, tmp_path / "log")
    run = next((tmp_path / "outputs").glob("*/*"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["ranks_in_sync"]
    assert summary["metrics"]["num_images"] == 6
    out = run_tool([str(ROOT / "tools" / "eval.py"), *tiny, f"checkpoint={run}",
                    f"hydra.run.dir={tmp_path / 'ev'}"], tmp_path, env)
    assert out.returncode == 0, out.stderr[-3000:]
    single = json.loads((tmp_path / "ev" / "eval.json").read_text())["metrics"]
    assert single["num_images"] == 6
    assert single["AP50"] > 0  # detections matched something, so a missing gather would change the value
    for key in ("mAP", "AP50", "AP75"):
        assert abs(single[key] - summary["metrics"][key]) < 1e-9, (key, single, summary["metrics"])
    print("2-rank", summary["metrics"], "1-process", single)
