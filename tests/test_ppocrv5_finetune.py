"""experiment=ppocrv5_mobile_det_finetune and experiment=ppocrv5_server_det_finetune: PaddleX's fine-tune
recipes for PP-OCRv5_mobile_det and PP-OCRv5_server_det on a user's own data in PaddleX's text-detection
layout (issue 36 item 5). What they share is configs/experiment/base/ppocrv5_det_finetune.yaml.

Upstream values, cited: PaddleX paddlex/configs/modules/text_detection/PP-OCRv5_mobile_det.yaml at
3c1bcdc and PP-OCRv5_server_det.yaml at 5fd6182 (both: Train: epochs_iters 100, batch_size 4,
learning_rate 0.001, pretrain_weight_path .../PP-OCRv5_{mobile,server}_det_pretrained.pdparams; device
gpu:0,1,2,3), and PaddleOCR configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml and PP-OCRv5_server_det.yml
(mirror XucroYuri/PaddleOCR-Dev main), which PaddleX trains with: warmup_epoch 2 (line 55 / 54), L2
5.0e-05 (58) / 1e-6 (57), CopyPaste (83 / 82), drop_last false (135 / 134), DetResizeForTest with its
defaults (150 / 149: limit_side_len 736, limit_type min), eval batch 1 (172 / 171).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT, run_tool
from test_configs import compose

EXPERIMENTS = {"mobile": "ppocrv5_mobile_det_finetune", "server": "ppocrv5_server_det_finetune"}
OWN = {  # what differs between the two
    "mobile": {"model.name": "ppocrv5_mobile_det", "model.net.pretrained": "PP-OCRv5_mobile_det_pretrained",
               "optim.optimizer.weight_decay": 5.0e-05},
    "server": {"model.name": "ppocrv5_server_det", "model.net.pretrained": "PP-OCRv5_server_det_pretrained",
               "optim.optimizer.weight_decay": 1.0e-06},
}
UPSTREAM = {  # what they share
    "trainer.epochs": 100,
    "model.batch_size": 4,
    "optim.lr": 1.0e-3,
    "optim.base_batch_size": None,          # PaddleOCR does not scale the lr with the cards
    "sched.warmup_epochs": 2,
    "sched.warmup_steps": 0,
    "sched.warmup_start_factor": 0.0,       # LinearWarmup from 0
    "data.builder.copy_paste.objects_paste_ratio": 0.2,
    "trainer.drop_last": False,
    "data.builder.limit_side_len": 736,
    "data.builder.limit_type": "min",
    "model.eval_batch_size": 1,
    "data.builder.crop_size": 640,
    "data.builder.train_label": "train.txt",  # PaddleX's dataset layout
    "data.builder.val_label": "val.txt",
}


def _get(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("which", sorted(EXPERIMENTS))
@pytest.mark.parametrize("key", sorted(UPSTREAM))
def test_the_experiment_is_paddlex_recipe(key, which):
    cfg = compose([f"experiment={EXPERIMENTS[which]}", "data.root=/data/x"])
    assert _get(cfg, key) == UPSTREAM[key], key


@pytest.mark.parametrize("which", sorted(EXPERIMENTS))
def test_each_experiment_has_its_own_model_weights_and_l2(which):
    cfg = compose([f"experiment={EXPERIMENTS[which]}", "data.root=/data/x"])
    for key, value in OWN[which].items():
        assert _get(cfg, key) == value, key


@pytest.mark.parametrize("which", sorted(EXPERIMENTS))
def test_the_registry_url_is_paddlex_pretrain_weight_path(which):
    import yaml

    name = OWN[which]["model.net.pretrained"]
    entry = yaml.safe_load((ROOT / "zoo" / "weights" / "registry.yaml").read_text())[name]
    assert entry["url"] == f"https://paddle-model-ecology.bj.bcebos.com/paddlex/official_pretrained_model/{name}.pdparams"
    assert entry["model"] == OWN[which]["model.name"]


@pytest.mark.parametrize("which", sorted(EXPERIMENTS))
def test_the_composed_run_passes_validation(which, tmp_path):
    """With a data folder the run's settings are valid: trainer.epochs sets the length (a null
    trainer.max_steps beside it was refused before any data was read)."""
    from zoo.engine.run import validate

    validate(compose([f"experiment={EXPERIMENTS[which]}", f"data.root={tmp_path}"]))


@pytest.mark.parametrize("which", sorted(EXPERIMENTS))
def test_refuses_clearly_without_the_users_data(which, tmp_path):
    base = ["tools/train.py", f"experiment={EXPERIMENTS[which]}", f"hydra.run.dir={tmp_path / 'run'}"]
    res = run_tool(base, cwd=ROOT, timeout=300)
    assert res.returncode == 2 and "data.root: missing mandatory value" in res.stderr, res.stderr[-2000:]
    res = run_tool([*base, f"data.root={tmp_path / 'nowhere'}"], cwd=ROOT, timeout=300)
    assert res.returncode == 2 and f"data.root: {tmp_path / 'nowhere'} does not exist" in res.stderr, \
        res.stderr[-2000:]


def _paddlex_dataset(root, n_train=6, n_val=2):
    """PaddleX's text-detection layout: images/, train.txt, val.txt in PaddleOCR's label format."""
    import cv2

    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    lines = {"train": [], "val": []}
    for i in range(n_train + n_val):
        img = np.full((200, 320, 3), 235, np.uint8)
        x, y = int(rng.integers(10, 120)), int(rng.integers(20, 120))
        cv2.putText(img, "TEXT 42", (x, y + 30), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (20, 20, 20), 3)
        cv2.imwrite(str(root / "images" / f"{i}.jpg"), img)
        box = [[x - 4, y], [x + 170, y], [x + 170, y + 40], [x - 4, y + 40]]
        split = "train" if i < n_train else "val"
        lines[split].append(f"images/{i}.jpg\t" + json.dumps([{"transcription": "TEXT 42", "points": box}]))
    for split in ("train", "val"):
        (root / f"{split}.txt").write_text("\n".join(lines[split]) + "\n")


@pytest.mark.slow
def test_fine_tunes_from_the_wheels_deploy_form_weights_on_paddlex_data(tmp_path):
    from test_deploy_interpreter import _rapidocr_models

    det = f"{_rapidocr_models()}/ch_PP-OCRv4_det_infer"  # the official weights this machine has
    _paddlex_dataset(tmp_path / "data")
    run = tmp_path / "run"
    res = run_tool(["tools/train.py", "experiment=ppocrv5_mobile_det_finetune", f"data.root={tmp_path / 'data'}",
                    f"model.net.pretrained={det}", "trainer.epochs=null", "trainer.max_steps=2",
                    "sched.warmup_epochs=null", "data.builder.crop_size=160", "data.builder.limit_side_len=320",
                    "trainer.num_workers=0", "trainer.progress=false", "trainer.draw_samples=2",
                    f"hydra.run.dir={run}"], cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == 2 and s["data"] == "ocr_det_dataset"
    assert s["pretrained"]["matched"] == 234  # every tensor of the deploy-form program
    # the official detector finds the rendered line before any training to speak of
    assert s["primary_metric"]["value"] > 0.5, s["primary_metric"]
    assert sorted(p.name for p in (run / "drawings").iterdir())[:1]
