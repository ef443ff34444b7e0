"""summary.json's predicted peak memory (``trainer.predict_memory``, issue 28 item 6): the memory
planner's figure for the run's precision and per-rank batch beside the measured ``peak_memory_mb``;
asked for with ``on``, left out (and never computed) on a CPU with the default ``auto``; a bad value
is one clear line."""
from __future__ import annotations

import json

import pytest
from conftest import ROOT, TINY, run_tool
from train import _predict_memory  # tools/train.py's hook (tools/ is on sys.path, see conftest)

from zoo.diagnostics import memory as M
from zoo.engine.run import ConfigError, predict_memory_setting, train, validate, wants_memory_prediction

FAST = ["trainer.max_steps=2", "trainer.final_eval=false", "trainer.bootstrap_resamples=0"]


def test_on_records_the_planners_peak_beside_the_measured_one(tiny_cfg, tmp_path):
    cfg = tiny_cfg("amp=O1", "trainer.predict_memory=on", *FAST)
    summary = train(cfg, tmp_path / "run", predict_memory=_predict_memory)
    want = M.predict_peak(cfg, 16)          # the same config and per-rank batch, directly
    pred = summary["predicted_memory"]
    assert pred == {"precision": "O1", "batch": 16, "peak_mb": round(want["peak_mb"], 1),
                    "what": "planner prediction for a GPU (tools/amp_doctor.py --memory)"}
    assert summary["predicted_peak_memory_mb"] == pred["peak_mb"] > 0
    assert summary["peak_memory_kind"] == "host_rss" and summary["peak_memory_mb"] > 0
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["predicted_memory"] == pred


def test_auto_on_a_cpu_and_off_never_call_the_planner(tiny_cfg, tmp_path):
    def boom(*args):
        raise AssertionError("the planner ran")

    for i, setting in enumerate(("auto", "off")):
        s = train(tiny_cfg(f"trainer.predict_memory={setting}", *FAST), tmp_path / str(i), predict_memory=boom)
        assert s["predicted_peak_memory_mb"] is None and s["predicted_memory"] is None
    assert wants_memory_prediction("auto", "gpu") and not wants_memory_prediction("auto", "cpu")
    assert wants_memory_prediction("on", "cpu") and not wants_memory_prediction("off", "gpu")


def test_a_failed_prediction_does_not_lose_the_run(tiny_cfg, tmp_path):
    def fails(*args):
        raise RuntimeError("no trace")

    s = train(tiny_cfg("trainer.predict_memory=on", *FAST), tmp_path / "run", predict_memory=fails)
    assert s["status"] == "completed" and s["predicted_peak_memory_mb"] is None
    assert s["predicted_memory"] == {"error": "RuntimeError: no trace"}


def test_the_setting_is_checked(tiny_cfg):
    with pytest.raises(ConfigError, match=r"^trainer.predict_memory: expected auto, on or off, got 'x'$"):
        validate(tiny_cfg("trainer.predict_memory=x"))
    cfg = tiny_cfg()
    assert predict_memory_setting(cfg) == "auto"
    cfg.trainer.predict_memory = True       # what YAML 1.1 makes of a bare `on`
    assert predict_memory_setting(cfg) == "on"


def test_a_bad_value_is_one_line_from_the_tool(tmp_path):
    r = run_tool(["tools/train.py", *TINY, "trainer.predict_memory=x", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "error: trainer.predict_memory: expected auto, on or off, got 'x'" in r.stderr.splitlines()


def test_the_setting_changes_neither_the_digest_nor_what_a_resume_accepts(tiny_cfg):
    """Old runs (without the key) and runs with each value compare and resume alike."""
    from omegaconf import OmegaConf, open_dict

    from zoo.engine.checkpoint import SAFE_TO_CHANGE_ON_RESUME, config_changes
    from zoo.engine.provenance import config_digest

    on, auto = tiny_cfg("trainer.predict_memory=on"), tiny_cfg()
    old = tiny_cfg()
    with open_dict(old):
        del old.trainer["predict_memory"]
    assert config_digest(on) == config_digest(auto) == config_digest(old)
    changes = config_changes(OmegaConf.to_yaml(old), OmegaConf.to_yaml(on))
    assert set(changes) == {"trainer.predict_memory"} <= set(SAFE_TO_CHANGE_ON_RESUME)
