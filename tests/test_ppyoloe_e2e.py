"""PP-YOLOE through the real configs and engine: short runs, the assigner switch, drawings, eval.py."""
from __future__ import annotations

import json

import cv2
import numpy as np
import paddle
import pytest
from conftest import ROOT, compose, run_tool

from zoo.engine.run import train

YOLO_TINY = ["model=ppyoloe_tiny", "data.builder.num_train=16", "data.builder.num_val=4",
             "data.builder.image_size=64", "model.batch_size=4", "model.eval_batch_size=4",
             "trainer.epochs=null", "trainer.max_steps=3", "trainer.log_every=1", "trainer.progress=false",
             "trainer.draw_samples=2", "sched.warmup_epochs=null", "sched.warmup_steps=1"]


def batch_of(dataset, keys):
    """What the loader yields: the dataset's own collate, as paddle tensors."""
    return {k: paddle.to_tensor(v) for k, v in dataset.collate_fn([dataset[k] for k in keys]).items()}


def test_short_ppyoloe_run_under_emulated_fp16(tmp_path):
    summary = train(compose([*YOLO_TINY, "amp=O1"]), tmp_path)
    assert summary["primary_metric"]["name"] == "mAP"
    assert set(summary["metrics"]) >= {"mAP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large"}
    assert summary["requested_precision"] == "fp16-O1"
    assert summary["effective_precision"] == "emulated-fp16-O1" and summary["loss_scaler"] is not None
    assert summary["loss_scaler"]["init_loss_scaling"] == 1024.0  # the PP-YOLOE recipe, not the amp default
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["kind"] == "train"]
    assert {"loss_cls", "loss_iou", "loss_dfl"} <= set(train_lines[0])
    assert all(np.isfinite(x["loss"]) for x in train_lines)
    # the training precision's predictions and FP32's, each with a legend strip below the image
    pngs = sorted((tmp_path / "drawings").glob("*.png"))
    assert [p.name.rsplit("_", 1)[0] for p in pngs] == ["step3_emulated-fp16-O1"] * 2 + ["step3_fp32"] * 2
    img = cv2.imread(str(pngs[0]))
    assert img is not None and img.shape[0] > 64 and img.shape[1] >= 64


@pytest.mark.parametrize("amp, effective", [("O2", "emulated-fp16-O2"), ("bf16_O2", "emulated-bf16-O2")])
def test_ppyoloe_o2_recipes_train_with_finite_losses(amp, effective, tmp_path):
    summary = train(compose([*YOLO_TINY, f"amp={amp}", "trainer.draw_samples=0"]), tmp_path)
    assert summary["effective_precision"] == effective
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["kind"] == "train"]
    assert len(train_lines) == 3 and all(np.isfinite(x["loss"]) for x in train_lines)
    assert summary["skipped_steps"] == 0 and np.isfinite(summary["metrics"]["mAP"])


@pytest.mark.parametrize("override, message", [
    (["data.builder.min_size=90", "data.builder.max_size=20"], r"data.builder.min_size / max_size: need 4 <= "),
    (["+model.task.nms.iou=0.5"], r"model.task.nms: unknown keys \['iou'\]"),
    (["+model.task.loss.topk=3"], r"model.task.loss: .*topk"),
    (["sched.horizon=0.5"], r"sched.horizon: expected a finite number >= 1 "),
])
def test_bad_ppyoloe_settings_fail_naming_the_key(override, message, tmp_path):
    from zoo.engine.run import build_trainer

    with pytest.raises(ValueError, match=message):  # tools/ print these as "error: ..." and exit 2
        build_trainer(compose([*YOLO_TINY, *override]), tmp_path)


def test_assigner_follows_the_data_epoch():
    """ATSS before loss.static_assigner_epoch, task-aligned from it on: the batch's epoch decides."""
    from hydra.utils import instantiate

    cfg = compose([*YOLO_TINY, "model.task.loss.static_assigner_epoch=1"])
    data = instantiate(cfg.data.builder)
    train_set = data.build("train", 0)
    net, task = instantiate(cfg.model.net), instantiate(cfg.model.task)
    calls = []

    def spy(name, assigner):
        return lambda *a, **k: calls.append(name) or assigner(*a, **k)

    task.loss.static_assigner = spy("atss", task.loss.static_assigner)
    task.loss.assigner = spy("tal", task.loss.assigner)
    net.train()
    for key in (0, len(train_set)):  # epoch 0, then epoch 1 (key = epoch * N + index)
        losses = task.losses(net, batch_of(train_set, [key]))
        assert np.isfinite(float(losses["loss"]))
    assert calls == ["atss", "tal"]


@pytest.mark.slow
def test_ppyoloe_train_then_eval_cli(tmp_path, ampzoo_home):
    env = {"AMPZOO_HOME": str(ampzoo_home)}
    run = tmp_path / "run"
    out = run_tool(["tools/train.py", *YOLO_TINY, f"hydra.run.dir={run}"], ROOT, env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["effective_precision"] == "fp32"
    out = run_tool(["tools/eval.py", *YOLO_TINY, f"checkpoint={run}", f"hydra.run.dir={tmp_path / 'ev'}"],
                   ROOT, env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert result["metrics"] == summary["metrics"]  # EMA weights saved as best, evaluated the same way
    assert len(result["drawings"]) == 2


@pytest.mark.slow
def test_ppyoloe_tiny_learns_on_a_fixed_batch():
    """A few dozen Momentum steps on one fixed batch drive the loss well below its start (seeded)."""
    from hydra.utils import instantiate

    paddle.seed(0)
    cfg = compose([*YOLO_TINY, "data.builder.image_size=96"])
    data = instantiate(cfg.data.builder)
    train_set = data.build("train", 0)
    batch = batch_of(train_set, range(4))
    net, task = instantiate(cfg.model.net), instantiate(cfg.model.task)
    opt = paddle.optimizer.Momentum(0.005, momentum=0.9, parameters=net.parameters())
    net.train()
    history = []
    for _ in range(40):
        loss = task.losses(net, batch)["loss"]
        loss.backward()
        opt.step()
        opt.clear_grad()
        history.append(float(loss))
    assert np.mean(history[-5:]) < 0.8 * np.mean(history[:5]), history
