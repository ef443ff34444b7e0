"""What summary.json records for the parity report: pairing digests, versions, config digest,
bootstrap CI and the FP32 evaluation of AMP weights; and that a fixed-seed CPU run repeats exactly."""
from __future__ import annotations

import pytest

from zoo.engine.provenance import config_digest
from zoo.engine.run import train


def test_same_seed_shares_start_digests_across_precisions_other_seed_does_not(tiny_cfg, tmp_path):
    fp32 = train(tiny_cfg("amp=fp32"), tmp_path / "fp32")
    o1 = train(tiny_cfg("amp=O1"), tmp_path / "o1")
    other = train(tiny_cfg("amp=fp32", "seed=1"), tmp_path / "seed1")
    assert o1["effective_precision"] == "emulated-fp16-O1"
    keys = {"init_weights", "sample_ids", "batches", "rng_state"}
    assert keys <= set(fp32["pairing"]) and fp32["pairing"]["batches_hashed"] == 3
    assert fp32["pairing"] == o1["pairing"]
    for key in keys:
        assert other["pairing"][key] != fp32["pairing"][key], key
    # what must match for the report to compare the runs at all
    assert fp32["config_digest"] == o1["config_digest"] == other["config_digest"]
    assert fp32["data_version"] == o1["data_version"] == other["data_version"]
    assert set(fp32["versions"]) == {"python", "paddle", "numpy", "opencv"}
    # eval_precision=both (default): the AMP run is evaluated in FP32 too; an FP32 run needs no second pass
    assert o1["eval_precision"] == "both" and o1["primary_metric"]["evaluated_in"] == "emulated-fp16-O1"
    assert o1["primary_metric_fp32_eval"]["evaluated_in"] == "fp32"
    assert set(o1["metrics_fp32_eval"]) == set(o1["metrics"])
    ci = o1["primary_metric"]["ci"]
    assert ci["n_images"] == 48 and ci["n_resamples"] == 1000
    assert ci["low"] <= o1["primary_metric"]["value"] <= ci["high"]
    assert fp32["metrics_fp32_eval"] == fp32["metrics"]


def test_fixed_seed_cpu_run_repeats_exactly(tiny_cfg, tmp_path):
    a = train(tiny_cfg("amp=O1", "trainer.eval_precision=train"), tmp_path / "a")
    b = train(tiny_cfg("amp=O1", "trainer.eval_precision=train"), tmp_path / "b")
    assert a["metrics"] == b["metrics"] and a["param_digests"] == b["param_digests"]
    assert a["final_loss_scale"] == b["final_loss_scale"]
    assert "metrics_fp32_eval" not in a


def test_eval_precision_fp32_makes_the_fp32_evaluation_primary(tiny_cfg, tmp_path):
    s = train(tiny_cfg("amp=O1", "trainer.eval_precision=fp32", "trainer.bootstrap_resamples=0"), tmp_path)
    assert s["primary_metric"]["evaluated_in"] == "fp32" and s["primary_metric"]["ci"] is None
    assert s["primary_metric_train_precision_eval"]["evaluated_in"] == "emulated-fp16-O1"
    with pytest.raises(ValueError, match="trainer.eval_precision"):
        train(tiny_cfg("trainer.eval_precision=int8"), tmp_path / "bad")


def test_config_digest_ignores_amp_seed_and_recipe_keys_only(tiny_cfg):
    base = config_digest(tiny_cfg())
    assert config_digest(tiny_cfg("amp=O2", "seed=3", "model.batch_size=8")) == base
    assert config_digest(tiny_cfg("optim.lr=0.3")) != base
    assert config_digest(tiny_cfg("trainer.max_steps=5")) != base


def test_git_revision_is_read_once_per_process(monkeypatch):
    """A commit made while a sweep runs must not relabel its later jobs with code they never ran."""
    import subprocess

    from zoo.engine import runinfo

    heads = iter(["aaaa\n", "", "bbbb\n", ""])

    def fake_run(*args, **kwargs):
        return subprocess.CompletedProcess(args, 0, stdout=next(heads), stderr="")

    runinfo.git_revision.cache_clear()
    monkeypatch.setattr(runinfo.subprocess, "run", fake_run)
    try:
        assert runinfo.git_revision() == "aaaa"
        assert runinfo.git_revision() == "aaaa"  # HEAD moved to bbbb meanwhile
    finally:
        runinfo.git_revision.cache_clear()
