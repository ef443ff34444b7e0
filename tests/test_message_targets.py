"""Messages point somewhere real (issue 40.6): the resolution note names a key that exists, a
resnet_tiny export needs no export.model_name, and tools/eval.py's folder says the precision it
evaluated in."""
from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import ROOT, TINY, compose, run_tool
from omegaconf import OmegaConf

import zoo
from zoo.engine import from_run
from zoo.engine.from_run import evaluated_run_name
from zoo.engine.run import train
from zoo.export.checked_export import more_images_key
from zoo.export.common import ExportError
from zoo.export.inference import paddlex_cls_name
from zoo.export.resolution import margin_rule
from zoo.tasks import ClassificationTask

# ---------------------------------------------------------------- (a) the note names a real key


def test_widened_top1_margin_note_names_the_key_and_the_images_that_would_do():
    """resnet18 on 1000 images: the 0.2 pp margin widens to 0.4 pp; 2000 images would let 0.2 stand."""
    rule = margin_rule("top1", 0.2, *ClassificationTask().metric_unit(1000, {}, None), 1000, 0.9,
                       "data.builder.num_val")
    assert rule["note"].endswith("check on about 2000 images or more (data.builder.num_val=2000) for a finer margin")
    assert "calibration" not in rule["note"]
    assert not margin_rule("top1", 0.2, *ClassificationTask().metric_unit(2000, {}, None), 2000, 0.9)["widened"]
    own = margin_rule("top1", 0.2, *ClassificationTask().metric_unit(1000, {}, None), 1000, 0.9,
                      "data.builder.val_list")
    assert "(a larger validation file: data.builder.val_list=...)" in own["note"]


@pytest.mark.parametrize("data, key", [("synthetic_shapes", "num_val"), ("synthetic_text", "num_val"),
                                       ("synthetic_shapes_det", "num_val"), ("imagenet", "val_list"),
                                       ("icdar2015", "val_label"), ("coco", "val_ann")])
def test_the_note_names_a_key_of_the_composed_export_config(data, key):
    model = {"synthetic_text": "db_det_tiny", "icdar2015": "db_det_tiny", "synthetic_shapes_det": "ppyoloe_tiny",
             "coco": "ppyoloe_tiny"}.get(data, "resnet_tiny")
    cfg = compose([f"model={model}", f"data={data}"], "export")
    assert more_images_key(cfg) == f"data.builder.{key}"
    assert key in cfg.data.builder


def test_every_export_key_a_message_names_exists_in_configs_export_yaml():
    """No message suggests an export.* key that is not there (as export.calibration=... was)."""
    cfg = compose(["model=resnet_tiny"], "export")
    named = set()
    for path in [*(ROOT / "zoo").rglob("*.py"), *(ROOT / "tools").glob("*.py")]:
        for m in re.finditer(r"(?<![\w./])export\.([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)", path.read_text()):
            if m.group(1).split(".")[0] not in ("json", "yaml", "md", "py"):
                named.add((m.group(1), path.relative_to(ROOT)))
    missing = sorted((f"export.{k}", str(p)) for k, p in named if OmegaConf.select(cfg, f"export.{k}",
                                                                                  default="<none>") == "<none>")
    assert named and not missing


# ---------------------------------------------------------------- (b) resnet_tiny's PaddleX name


def test_resnet_tiny_takes_the_paddlex_name_of_its_depth_and_variant():
    assert paddlex_cls_name("resnet_tiny", zoo.create_model("resnet_tiny", num_classes=2)) == "ResNet18_vd"
    assert paddlex_cls_name("resnet50_vd") == "ResNet50_vd" and paddlex_cls_name("resnet18") == "ResNet18"
    assert paddlex_cls_name("mynet", object()) is None


def test_a_classifier_that_is_no_resnet_is_told_the_key_and_the_doc():
    import paddle

    from zoo.export.from_config import _classification_plan

    cfg = compose(["model=resnet_tiny"], "export")
    cfg.model.name = "mynet"
    with pytest.raises(ExportError) as err:
        _classification_plan(cfg, paddle.nn.Linear(2, 2), None)
    assert str(err.value) == ("export.model_name: model mynet is not a ResNet, so no PaddleX classification name "
                              "follows from it; pass the one the client is given (it only selects PaddleX's "
                              "classifier; inference.yml holds the preprocessing), e.g. export.model_name=ResNet18 "
                              "(docs/export.md, Classification)")
    assert "`resnet_tiny` (depth 18, vd) -> `ResNet18_vd`" in (ROOT / "docs" / "export.md").read_text()


def test_export_of_resnet_tiny_needs_no_model_name(tmp_path, ampzoo_home):
    out = tmp_path / "cls"
    proc = run_tool(["tools/export.py", "model=resnet_tiny", f"export.out_dir={out}", "export.onnx=false",
                     f"hydra.run.dir={tmp_path / 'ex'}"], ROOT, {"AMPZOO_HOME": str(ampzoo_home)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert yaml.safe_load((out / "inference.yml").read_text())["Global"]["model_name"] == "ResNet18_vd"
    assert json.loads((out / "export.json").read_text())["paddlex_model_name"] == "ResNet18_vd"


# ---------------------------------------------------------------- (c) eval's folder, evaluated precision


def _fake_run(tmp_path, run_name="resnet_tiny_synthetic_shapes_O1_seed0"):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"run_name": run_name, "seed": 0, "amp": {"name": "O1"},
                                                     "model": {"name": "resnet_tiny"},
                                                     "data": {"name": "synthetic_shapes"}}))
    return str(run)


@pytest.mark.parametrize("typed, expected", [(None, "resnet_tiny_synthetic_shapes_O1_seed0"),
                                             ("O1", "resnet_tiny_synthetic_shapes_O1_seed0"),
                                             ("fp32", "resnet_tiny_synthetic_shapes_fp32_seed0"),
                                             ("bf16_O2", "resnet_tiny_synthetic_shapes_bf16_O2_seed0")])
def test_eval_folder_name_is_the_runs_in_the_precision_evaluated(tmp_path, monkeypatch, typed, expected):
    monkeypatch.setattr(from_run, "_typed_choice", lambda group: typed if group == "amp" else None)
    assert evaluated_run_name("fallback", _fake_run(tmp_path), None) == expected


def test_eval_folder_of_a_custom_run_name_gets_the_precision_appended(tmp_path, monkeypatch):
    monkeypatch.setattr(from_run, "_typed_choice", lambda group: "fp32" if group == "amp" else None)
    assert evaluated_run_name("fallback", _fake_run(tmp_path, "my_O1_run"), None) == "my_O1_run_fp32"
    assert evaluated_run_name("resnet_tiny_x_fp32", None, None) == "resnet_tiny_x_fp32"  # no run: the fallback


def test_eval_tool_names_its_folder_after_the_precision_it_evaluated_in(tmp_path, ampzoo_home):
    """tools/eval.py run=<an O1 run> amp=fp32: outputs/eval_<model>_<data>_fp32_seed0/<stamp>/eval.json."""
    run = tmp_path / "outputs" / "resnet_tiny_synthetic_shapes_O1_seed0" / "stamp"
    train(compose([*TINY, "amp=O1", "trainer.max_steps=2"]), run)
    proc = run_tool([str(ROOT / "tools" / "eval.py"), f"run={run}", "amp=fp32"], tmp_path,
                    {"AMPZOO_HOME": str(ampzoo_home)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = list((tmp_path / "outputs").glob("eval_*/*/eval.json"))
    assert [p.parent.parent.name for p in written] == ["eval_resnet_tiny_synthetic_shapes_fp32_seed0"]
    assert json.loads(written[0].read_text())["effective_precision"] == "fp32"


def test_the_fp32_share_warning_names_the_key_of_the_tool_that_warns():
    """The deploy check's key is check.warn_fp32_share (configs/deploy_check.yaml), the export's
    export.check.warn_fp32_share: each warning names the one its user can type."""
    import yaml

    from zoo.export.compute import share_warning

    deploy = yaml.safe_load((ROOT / "configs" / "deploy_check.yaml").read_text())
    assert "warn_fp32_share" in deploy["check"]
    said = share_warning(0.9, ["conv2d"], "fp16", 0.5, key="check.warn_fp32_share")
    assert said.endswith("(warned above check.warn_fp32_share=0.5)")
    assert "export.check.warn_fp32_share=0.5" in share_warning(0.9, ["conv2d"], "fp16", 0.5)
    assert share_warning(0.4, ["conv2d"], "fp16", 0.5) is None
