"""tools/benchmark.py --train-against paddleocr (issue 15, last item; model=ppocrv5_mobile_det: issue 36
item 6): the PaddleOCR SimpleDataSet and config written from the zoo's synthetic_text set, the log
parsing, and (with a PaddleOCR checkout) both training commands for 2 steps."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import CONFIG_DIR, ROOT, run_tool

# The keys of PaddleOCR's configs/det/det_mv3_db.yml that the writer reads or sets (a stand-in
# written for this test; the real file is used too when AMPZOO_PADDLEOCR_SRC points to a checkout).
STAND_IN = {
    "Global": {"use_gpu": True, "epoch_num": 1200, "print_batch_step": 10, "save_model_dir": "./output/",
               "save_epoch_step": 1200, "eval_batch_step": [0, 2000], "cal_metric_during_train": False,
               "pretrained_model": "./pretrain_models/backbone", "checkpoints": None, "use_visualdl": False},
    "Optimizer": {"name": "Adam", "beta1": 0.9, "beta2": 0.999, "lr": {"learning_rate": 0.001}},
    "Train": {"dataset": {"name": "SimpleDataSet", "data_dir": "./d/", "label_file_list": ["./d/t.txt"],
                          "transforms": [{"DecodeImage": {"img_mode": "BGR"}}, {"DetLabelEncode": None},
                                         {"EastRandomCropData": {"size": [640, 640], "max_tries": 50}}]},
              "loader": {"shuffle": True, "drop_last": False, "batch_size_per_card": 16, "num_workers": 8,
                         "use_shared_memory": True}},
    "Eval": {"dataset": {"name": "SimpleDataSet", "data_dir": "./d/", "label_file_list": ["./d/v.txt"],
                         "transforms": [{"DecodeImage": {"img_mode": "BGR"}}]},
             "loader": {"shuffle": False, "drop_last": False, "batch_size_per_card": 1, "num_workers": 8}},
}


# The keys of configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml that differ for the writer: upstream's
# cosine schedule with warm-up and L2 (kept), CopyPaste and the maps around the crop.
STAND_IN_V5 = {
    **STAND_IN,
    "Optimizer": {"name": "Adam", "beta1": 0.9, "beta2": 0.999,
                  "lr": {"name": "Cosine", "learning_rate": 0.001, "warmup_epoch": 2},
                  "regularizer": {"name": "L2", "factor": 5.0e-05}},
    "Train": {**STAND_IN["Train"], "dataset": {
        **STAND_IN["Train"]["dataset"],
        "transforms": [{"DecodeImage": {"img_mode": "BGR"}}, {"DetLabelEncode": None}, {"CopyPaste": None},
                       {"EastRandomCropData": {"size": [640, 640], "max_tries": 50, "keep_ratio": True}},
                       {"MakeBorderMap": {"shrink_ratio": 0.4, "total_epoch": 500}}]}},
}


def _sources(tmp_path):
    stand_in = tmp_path / "pocr"
    (stand_in / "configs" / "det" / "PP-OCRv5").mkdir(parents=True)
    (stand_in / "configs" / "det" / "det_mv3_db.yml").write_text(yaml.safe_dump(STAND_IN))
    (stand_in / "configs" / "det" / "PP-OCRv5" / "PP-OCRv5_mobile_det.yml").write_text(yaml.safe_dump(STAND_IN_V5))
    real = os.environ.get("AMPZOO_PADDLEOCR_SRC")
    return [stand_in] + ([Path(real)] if real else [])


@pytest.fixture
def generated(tmp_path):
    from zoo.data.synthetic.text import generate_dataset

    root = tmp_path / "st"
    generate_dataset(root, num_train=6, num_val=2, height=64, width=64, max_instances=2, seed=0)
    return root


def test_simple_dataset_lists_are_the_zoo_images_in_paddleocr_format(tmp_path, generated):
    from zoo.bench import paddleocr_train as tb

    data = tb.write_simple_dataset(generated, generated / "train_label.txt", generated / "val_label.txt",
                                   tmp_path / "out", 4)
    assert data["num_train"] == 4 and data["num_val"] == 1 and data["data_dir"] == generated.resolve()
    train = data["train"].read_text(encoding="utf-8").splitlines()
    assert train == (generated / "train_label.txt").read_text(encoding="utf-8").splitlines()[:4]
    for line in train + data["val"].read_text(encoding="utf-8").splitlines():
        rel, js = line.split("\t")
        assert (generated / rel).is_file() and rel.endswith(".jpg")
        for box in json.loads(js):
            assert set(box) == {"transcription", "points"} and len(box["points"]) == 4
            assert all(len(p) == 2 and all(isinstance(v, int) for v in p) for p in box["points"])
    with pytest.raises(ValueError, match="need 7"):
        tb.write_simple_dataset(generated, generated / "train_label.txt", generated / "val_label.txt",
                                tmp_path / "o2", 7)
    bad = tmp_path / "bad.txt"
    bad.write_text("train/000000.jpg\t[{\"text\": \"a\", \"points\": [[0, 0]]}]\n")
    with pytest.raises(ValueError, match="not a PaddleOCR detection label line"):
        tb.write_simple_dataset(generated, bad, generated / "val_label.txt", tmp_path / "o3", 1)


def test_paddleocr_config_sets_crop_batch_step_limit_and_no_eval(tmp_path, generated):
    from zoo.bench import paddleocr_train as tb

    data = tb.write_simple_dataset(generated, generated / "train_label.txt", generated / "val_label.txt",
                                   tmp_path / "out", 6)
    for k, src in enumerate(_sources(tmp_path)):
        out = tmp_path / f"cfg{k}.yml"
        tb.write_paddleocr_config(src, out, data, crop=160, batch=3, steps=2, seed=5, save_dir=tmp_path / "save")
        cfg = yaml.safe_load(out.read_text())
        g = cfg["Global"]
        assert g["use_gpu"] is False and g["epoch_num"] == 1 and g["print_batch_step"] == 1 and g["seed"] == 5
        assert g["eval_batch_step"][0] >= 2 and g["save_epoch_step"] > 1  # no eval, no per-epoch copy in the run
        assert g["pretrained_model"] is None and g["checkpoints"] is None and g["cal_metric_during_train"] is False
        assert g["save_model_dir"] == str(tmp_path / "save")
        assert cfg["Optimizer"]["name"] == "Adam" and cfg["Optimizer"]["lr"] == {"learning_rate": 1e-3}
        tr = cfg["Train"]
        assert tr["dataset"]["name"] == "SimpleDataSet" and tr["dataset"]["data_dir"] == str(generated.resolve())
        assert tr["dataset"]["label_file_list"] == [str(data["train"])] and tr["dataset"]["ratio_list"] == [1.0]
        crop = [t["EastRandomCropData"] for t in tr["dataset"]["transforms"] if "EastRandomCropData" in t]
        assert crop == [{**crop[0], "size": [160, 160]}]
        # one epoch of 6 images in batches of 3 = exactly 2 iterations
        assert tr["loader"]["batch_size_per_card"] == 3 and tr["loader"]["drop_last"] is False
        assert tr["loader"]["num_workers"] == 0 and cfg["Eval"]["loader"]["num_workers"] == 0
        assert cfg["Eval"]["dataset"]["label_file_list"] == [str(data["val"])]


def test_ppocrv5_config_keeps_upstreams_optimizer_and_copy_paste(tmp_path, generated):
    from zoo.bench import paddleocr_train as tb

    data = tb.write_simple_dataset(generated, generated / "train_label.txt", generated / "val_label.txt",
                                   tmp_path / "out", 6)
    for k, src in enumerate(_sources(tmp_path)):
        out = tmp_path / f"v5_{k}.yml"
        tb.write_paddleocr_config(src, out, data, crop=160, batch=3, steps=2, seed=5, save_dir=tmp_path / "save",
                                  model="ppocrv5_mobile_det")
        cfg = yaml.safe_load(out.read_text())
        g = cfg["Global"]
        assert g["use_gpu"] is False and g["epoch_num"] == 1 and g["print_batch_step"] == 1 and g["seed"] == 5
        assert g["pretrained_model"] is None and g["checkpoints"] is None and g["eval_batch_step"][0] >= 2
        opt = cfg["Optimizer"]  # upstream's, as the zoo's ppocrv5_mobile_det config: cosine 1e-3, L2 5e-5
        assert opt["lr"]["name"] == "Cosine" and opt["lr"]["learning_rate"] == 1e-3
        assert opt["regularizer"] == {"name": "L2", "factor": 5e-5}
        tr = cfg["Train"]
        names = [next(iter(t)) for t in tr["dataset"]["transforms"]]
        assert names[:3] == ["DecodeImage", "DetLabelEncode", "CopyPaste"] and "MakeBorderMap" in names
        crop = [t["EastRandomCropData"] for t in tr["dataset"]["transforms"] if "EastRandomCropData" in t]
        assert crop == [{**crop[0], "size": [160, 160]}]
        assert tr["dataset"]["label_file_list"] == [str(data["train"])] and tr["loader"]["batch_size_per_card"] == 3
        assert tr["loader"]["num_workers"] == 0 and tr["loader"]["drop_last"] is False
    src = _sources(tmp_path / "other")[0]  # a config whose optimizer is not upstream's: refused
    path = src / "configs" / "det" / "PP-OCRv5" / "PP-OCRv5_mobile_det.yml"
    path.write_text(yaml.safe_dump({**STAND_IN_V5, "Optimizer": STAND_IN["Optimizer"]}))
    with pytest.raises(AssertionError):
        tb.write_paddleocr_config(src, tmp_path / "x.yml", data, 160, 3, 2, 5, tmp_path / "s", "ppocrv5_mobile_det")


def test_step_times_from_both_logs():
    from zoo.bench import paddleocr_train as tb

    log = "\n".join(
        f"[2026/12/01 14:43:0{k}] ppocr INFO: epoch: [1/1], global_step: {k}, lr: 0.001000, loss: 9.5, "
        f"avg_reader_cost: 0.09 s, avg_batch_cost: {t} s, avg_samples: 8.0, ips: 2.3 samples/s, eta: 0:00:06"
        for k, t in ((1, "3.50000"), (2, "2.00000"), (3, "2.00000")))
    parsed = tb.parse_paddleocr_log(log + "\n[..] ppocr ERROR: When parsing line x, error happened")
    assert parsed == {"step_s": {1: 3.5, 2: 2.0, 3: 2.0}, "dataset_errors": 1}
    assert tb.images_per_s(parsed["step_s"], 3, 1, 8) == pytest.approx(4.0)
    with pytest.raises(RuntimeError, match="no step time"):
        tb.images_per_s(parsed["step_s"], 4, 1, 8)


def test_zoo_command_is_the_issue_command_on_the_same_images():
    from zoo.bench import paddleocr_train as tb

    cmd = tb.zoo_command(ROOT / "tools" / "train.py", ["model.batch_size=4"], 16, 64, Path("/r"))
    assert cmd[1].endswith("tools/train.py") and cmd[2:6] == ["model=db_det", "amp=fp32", "trainer.final_eval=false",
                                                               "trainer.max_steps=16"]
    assert "data.builder.num_train=64" in cmd and cmd[-2:] == ["model.batch_size=4", "hydra.run.dir=/r"]
    cfg = tb.compose_zoo(CONFIG_DIR, ["model.batch_size=4"], 16)
    assert cfg.data.builder.num_train == 64 and cfg.model.batch_size == 4 and cfg.trainer.final_eval is False
    assert cfg.data.builder.crop_size == 160  # the quick run's crop


def test_ppocrv5_zoo_command_starts_from_scratch_on_the_same_images():
    from zoo.bench import paddleocr_train as tb

    assert tb.split_model(["model.batch_size=4"]) == ("db_det", ["model.batch_size=4"])
    model, rest = tb.split_model(["model=ppocrv5_mobile_det", "model.batch_size=4"])
    assert (model, rest) == ("ppocrv5_mobile_det", ["model.batch_size=4"])
    with pytest.raises(ValueError, match="compares db_det, ppocrv5_mobile_det, got model=resnet18"):
        tb.split_model(["model=resnet18"])
    cmd = tb.zoo_command(ROOT / "tools" / "train.py", rest, 16, 64, Path("/r"), model)
    assert cmd[2:6] == ["model=ppocrv5_mobile_det", "amp=fp32", "trainer.final_eval=false", "trainer.max_steps=16"]
    assert cmd.index("model.net.pretrained=null") < cmd.index("model.batch_size=4")  # the caller's go last
    cfg = tb.compose_zoo(CONFIG_DIR, ["model=ppocrv5_mobile_det", "model.batch_size=4"], 16)
    assert cfg.model.name == "ppocrv5_mobile_det" and cfg.model.net.pretrained is None
    assert cfg.data.builder.num_train == 64 and cfg.data.builder.crop_size == 160
    assert cfg.data.builder.copy_paste is not None  # the v5 transforms, as upstream's CopyPaste
    assert tb.launcher_report('x\nAMPZOO_PARAMS {"parameters": 3, "trainable": 2}\n', "AMPZOO_PARAMS") == \
        {"parameters": 3, "trainable": 2}
    assert tb.launcher_report("nothing", "AMPZOO_PARAMS") == {}


def test_cli_refuses_a_missing_source_tree(tmp_path):
    r = run_tool(["tools/benchmark.py", "--train-against", "paddleocr", str(tmp_path / "nowhere")], cwd=ROOT)
    assert r.returncode == 2 and "not a PaddleOCR source tree" in r.stderr
    r = run_tool(["tools/benchmark.py", "--train-against", "paddleocr", str(tmp_path), "model=resnet18"], cwd=ROOT)
    assert r.returncode == 2 and "compares db_det, ppocrv5_mobile_det, got model=resnet18" in r.stderr


def _two_steps(tmp_path, *overrides) -> dict:
    """Both training commands for 2 steps of batch 2 with a real PaddleOCR checkout; the result JSON."""
    out = tmp_path / "r.json"
    r = run_tool(["tools/benchmark.py", "--train-against", "paddleocr", os.environ["AMPZOO_PADDLEOCR_SRC"],
                  "--steps", "2", "--warmup", "1", "--repeats", "1", "--work", str(tmp_path / "w"),
                  "--out", str(out), *overrides, "model.batch_size=2"], cwd=ROOT, env_extra={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("AMPZOO_PADDLEOCR_SRC"),
                    reason="set AMPZOO_PADDLEOCR_SRC to a PaddleOCR checkout (and AMPZOO_PADDLEOCR_PYTHON to a "
                           "python with its training requirements and the zoo's Paddle)")
def test_both_training_commands_run_two_steps(tmp_path):
    res = _two_steps(tmp_path)
    assert res["images"] == 4 and res["batch_size"] == 2 and res["crop_size"] == 160
    for side in ("zoo", "paddleocr"):
        (run,) = res["runs"][side]
        assert len(run["step_s"]) == 2 and run["images_per_s"] > 0 and run["wall_s"] > 0
    assert res["runs"]["paddleocr"][0]["paddle"]["version"] == res["paddle_version"]
    assert res["runs"]["paddleocr"][0]["dataset_errors"] == 0
    assert res["ratio"] == pytest.approx(res["zoo_images_per_s"] / res["paddleocr_images_per_s"])


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("AMPZOO_PADDLEOCR_SRC"),
                    reason="set AMPZOO_PADDLEOCR_SRC to a PaddleOCR checkout (and AMPZOO_PADDLEOCR_PYTHON to a "
                           "python with its training requirements and the zoo's Paddle)")
def test_ppocrv5_both_training_commands_run_two_steps_of_the_same_network(tmp_path):
    res = _two_steps(tmp_path, "model=ppocrv5_mobile_det")
    assert res["model"] == "ppocrv5_mobile_det" and res["images"] == 4 and res["crop_size"] == 160
    assert res["paddleocr_config_source"] == "configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml"
    assert res["zoo_params"]["parameters"] == res["paddleocr_params"]["parameters"] > 3_000_000
    (run,) = res["runs"]["paddleocr"]
    assert run["dataset_errors"] == 0 and len(run["step_s"]) == 2
    assert "model.net.pretrained=null" in res["commands"]["zoo"]
