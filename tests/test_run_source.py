"""tools/eval.py and tools/export.py take a run folder the same way (zoo/engine/from_run.py): its
weights and its saved config.yaml, with the command line's explicit overrides on top."""
from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from conftest import ROOT, TINY, compose, run_tool
from omegaconf import OmegaConf

from zoo.engine.from_run import RunSourceError, run_folder_of, run_source, with_run_config
from zoo.engine.run import train


def _tool_cfg(config_name, cli):
    return compose(cli, config_name), cli, (lambda o: compose(o, config_name))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, ampzoo_home):
    """A finished resnet_tiny run on a small PaddleClas-list data set (trained in-process: no .hydra/)."""
    tmp = tmp_path_factory.mktemp("run_source")
    root = tmp / "imagenet"
    (root / "img").mkdir(parents=True)
    for i in range(6):
        cv2.imwrite(str(root / "img" / f"{i}.png"), np.full((40, 40, 3), 40 * i, np.uint8))
    (root / "train_list.txt").write_text("".join(f"img/{i % 6}.png {i % 2}\n" for i in range(16)))
    (root / "val_list.txt").write_text("".join(f"img/{i}.png {i % 2}\n" for i in range(6)))
    tiny = [o for o in TINY if not o.startswith("data.builder.num_")]
    over = [*tiny, "data=imagenet", f"data.root={root}", "data.num_classes=2", "model.batch_size=4",
            "model.eval_batch_size=3", "data.builder.image_size=32", "data.builder.resize_size=36",
            "trainer.max_steps=2"]
    summary = train(compose(over), tmp / "outputs" / "resnet_tiny_run" / "stamp")
    return tmp / "outputs" / "resnet_tiny_run" / "stamp", root, summary, over


def test_the_run_config_is_the_base_and_the_command_line_goes_on_top(tiny_run):
    run, root, _, _ = tiny_run
    cfg, cli, comp = _tool_cfg("eval", [f"run={run}", "amp=O1", "model.eval_batch_size=5", "model=resnet_tiny"])
    merged, notes = with_run_config(cfg, cli, comp, "checkpoint", ROOT / "configs")
    assert merged.model.name == "resnet_tiny" and merged.data.name == "imagenet"   # from the run, not eval.yaml
    assert merged.data.root == str(root) and merged.data.builder.image_size == 32
    assert merged.model.eval_batch_size == 5 and merged.amp.name == "O1"          # typed: wins
    assert merged.amp.level == "O1" and merged.model.batch_size == 4               # the group, not its recipe's batch
    assert merged.run == str(run) and merged.output is None                         # the tool's own keys
    assert len(notes) == 1 and notes[0].startswith(
        f"config: {run / 'config.yaml'}, with model.eval_batch_size=5, amp.name=O1, ")  # what changed, not what was typed
    assert "model.name" not in notes[0] and "model.batch_size" not in notes[0]  # model= repeated: no change


def test_hydras_record_of_the_training_command_line_is_used_when_present(tiny_run, tmp_path):
    run, _, _, over = tiny_run
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "config.yaml").write_text((run / "config.yaml").read_text())
    (copy / ".hydra").mkdir()
    (copy / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create([*over, f"hydra.run.dir={run}"])))
    cfg, cli, comp = _tool_cfg("export", [f"run={copy}", "export.out_dir=x"])
    merged, notes = with_run_config(cfg, cli, comp, "weights", ROOT / "configs")
    assert notes == [f"config: {copy / 'config.yaml'}"]  # nothing of the training config changed
    assert merged.export.out_dir == "x" and merged.model.name == "resnet_tiny"
    assert OmegaConf.to_container(merged.model) == OmegaConf.to_container(OmegaConf.load(run / "config.yaml").model)


def test_old_keys_are_aliases_with_a_note_and_a_file_outside_a_run_keeps_the_command_line(tiny_run, tmp_path):
    run, _, _, _ = tiny_run
    cfg, cli, comp = _tool_cfg("eval", [f"checkpoint={run / 'checkpoints' / 'best.pdparams'}"])
    merged, notes = with_run_config(cfg, cli, comp, "checkpoint", ROOT / "configs")
    assert notes[0].startswith("note: checkpoint= is now run= ") and len(notes) == 2
    assert merged.model.name == "resnet_tiny" and run_folder_of(merged.checkpoint) == run
    outside = tmp_path / "w.pdparams"
    outside.write_bytes(b"")
    cfg, cli, comp = _tool_cfg("export", [f"weights={outside}", "model=db_det_tiny"])
    merged, notes = with_run_config(cfg, cli, comp, "weights", ROOT / "configs")
    assert merged is cfg and len(notes) == 1 and merged.model.name == "db_det_tiny"
    cfg, cli, comp = _tool_cfg("export", [f"run={run}", f"weights={outside}"])
    with pytest.raises(RunSourceError, match="run: .* and weights=.* name different things"):
        run_source(cfg, "weights")
    cfg, cli, comp = _tool_cfg("export", ["model=db_det_tiny"])
    assert with_run_config(cfg, cli, comp, "weights") == (cfg, [])


def test_eval_and_export_of_a_run_folder_need_nothing_else_and_no_training_split(tiny_run, tmp_path, ampzoo_home):
    run, root, summary, _ = tiny_run
    (root / "train_list.txt").rename(root / "train_list.txt.gone")  # eval reads the validation split only
    try:
        env = {"AMPZOO_HOME": str(ampzoo_home)}
        ev = tmp_path / "eval.json"
        out = run_tool(["tools/eval.py", f"run={run}", f"output={ev}", f"hydra.run.dir={tmp_path / 'ev'}"], ROOT, env)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(ev.read_text())
        assert result["model"] == "resnet_tiny" and result["data"] == "imagenet" and result["num_samples"] == 6
        assert result["metrics"] == summary["metrics"] and result["run"] == str(run)
        assert f"config: {run / 'config.yaml'}" in out.stderr
        old = run_tool(["tools/eval.py", f"checkpoint={run}", "amp=O1", f"hydra.run.dir={tmp_path / 'ev2'}"], ROOT, env)
        assert old.returncode == 0, old.stderr[-3000:]
        assert "note: checkpoint= is now run=" in old.stderr
        assert json.loads((tmp_path / "ev2" / "eval.json").read_text())["effective_precision"] == "emulated-fp16-O1"

        for key in ("run", "weights"):
            dest = tmp_path / f"deploy_{key}"
            out = run_tool(["tools/export.py", f"{key}={run}", f"export.out_dir={dest}", "export.onnx=false",
                            "export.model_name=ResNet18",
                            f"hydra.run.dir={tmp_path / ('ex_' + key)}"], ROOT, env)
            assert out.returncode == 0, out.stderr[-3000:]
            record = json.loads((dest / "export.json").read_text())
            assert record["model"] == "resnet_tiny" and record["weights"].startswith(str(run))
            assert ("note: weights= is now run=" in out.stderr) is (key == "weights")
    finally:
        (root / "train_list.txt.gone").rename(root / "train_list.txt")
