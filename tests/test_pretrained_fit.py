"""Pretrained weights that do not fit the model fail instead of training from random init."""
from __future__ import annotations

import json

import paddle
import pytest

import zoo
from zoo.weights.hub import sha256_file


def test_another_models_weights_fail_naming_the_file_and_keys(tmp_path):
    path = tmp_path / "db.pdparams"
    paddle.save(zoo.create_model("db_det_tiny").state_dict(), str(path))
    with pytest.raises(ValueError) as err:
        zoo.create_model("resnet_tiny", pretrained=str(path), num_classes=3)
    msg = str(err.value)
    assert str(path) in msg and "0 of" in msg and "blocks.0." in msg and "backbone." in msg
    assert "strict=false" in msg
    # Explicitly lenient: loads what matches (nothing here), as before.
    model = zoo.create_model("resnet_tiny", pretrained=str(path), num_classes=3, strict=False)
    assert model.pretrained_report["matched"] == 0


def test_training_checkpoint_as_pretrained_says_to_resume(tmp_path):
    path = tmp_path / "last.pdckpt"
    paddle.save({"format": "ampzoo-ckpt-1", "step": 3, "model": zoo.create_model("resnet_tiny").state_dict()},
                str(path))
    with pytest.raises(ValueError, match="training checkpoint: continue it with trainer.resume"):
        zoo.create_model("resnet_tiny", pretrained=str(path))


def test_load_report_goes_into_summary(tiny_cfg, tmp_path):
    from zoo.engine.run import ConfigError, train

    path = tmp_path / "w.pdparams"
    paddle.save(zoo.create_model("resnet_tiny", num_classes=10).state_dict(), str(path))
    summary = train(tiny_cfg(f"model.net.pretrained={path}", "trainer.max_steps=2"), tmp_path / "run")
    rec = json.loads((tmp_path / "run" / "summary.json").read_text())["pretrained"]
    assert rec == summary["pretrained"]
    assert rec["file"] == str(path) and rec["sha256"] == sha256_file(path)
    assert rec["matched"] > 0 and rec["missing"] == rec["unexpected"] == rec["shape_mismatch"] == 0
    assert train(tiny_cfg("trainer.max_steps=2"), tmp_path / "plain")["pretrained"] is None

    other = tmp_path / "db.pdparams"
    paddle.save(zoo.create_model("db_det_tiny").state_dict(), str(other))
    with pytest.raises(ConfigError, match=f"model.net: pretrained weights '{other}' do not fit"):
        train(tiny_cfg(f"model.net.pretrained={other}"), tmp_path / "bad")


def test_shape_only_difference_is_reported_once_as_a_shape_mismatch():
    from zoo.engine.checkpoint import CheckpointError, check_fits

    ten, five = zoo.create_model("resnet_tiny", num_classes=10), zoo.create_model("resnet_tiny", num_classes=5)
    with pytest.raises(CheckpointError) as err:
        check_fits(ten, five.state_dict(), "w.pdparams", "model resnet_tiny")
    msg = str(err.value)
    assert msg == "w.pdparams does not fit model resnet_tiny: shape mismatch 2 ['fc.bias', 'fc.weight']"
