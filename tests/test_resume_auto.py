"""trainer.resume=auto continues one run, once (issue 40.1): a resume marks the folder it continued,
auto takes only the newest unfinished run with these settings, a guard-stopped run is not taken,
the report reads a chain as its newest folder, and the README's two lines compose."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, TINY

from zoo.diagnostics.nonfinite_step import locate_and_describe
from zoo.engine import checkpoint as ckpt
from zoo.engine.metrics_log import read_metrics
from zoo.engine.run import GuardStopped, train
from zoo.engine.signals import TrainingInterrupted
from zoo.engine.trainer import Trainer

_spec = importlib.util.spec_from_file_location("report_tool", ROOT / "tools" / "report.py")
report_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_tool)

RUN = ["trainer.max_steps=6", "trainer.ckpt_every=2", "seed=2"]


def _killed(tiny_cfg, monkeypatch, folder, at_step: int, *extra):
    """A run killed during step ``at_step`` (no checkpoint written at the kill, as after kill -9)."""
    real = Trainer.train_step

    def dies(self, batch):
        if self.step == at_step - 1:
            raise KeyboardInterrupt("killed")
        return real(self, batch)

    monkeypatch.setattr(Trainer, "train_step", dies)
    with pytest.raises(TrainingInterrupted):
        train(tiny_cfg(*RUN, *extra), folder)
    monkeypatch.setattr(Trainer, "train_step", real)
    assert not (folder / "summary.json").exists()


def _summary(folder):
    return json.loads((folder / "summary.json").read_text())


def _said(caplog, text):
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_run_is_continued_once_along_its_chain_and_then_left_alone(tiny_cfg, tmp_path, monkeypatch, caplog):
    """Killed, resumed and killed again, resumed to the end: each resume takes the newest folder of
    the chain, marks the one it continued, and ends where an uninterrupted run ends; the next
    resume=auto starts fresh instead of resuming an old checkpoint a third time."""
    caplog.set_level("INFO")
    full = train(tiny_cfg(*RUN), tmp_path / "full")
    runs = tmp_path / "runs"
    _killed(tiny_cfg, monkeypatch, runs / "a", 3)  # checkpoint of step 2
    _killed(tiny_cfg, monkeypatch, runs / "b", 5, "trainer.resume=auto")  # from a's step 2; its own of step 4
    assert ckpt.load(runs / "b" / "checkpoints" / ckpt.LAST)["step"] == 4
    assert _summary(runs / "a") == {"status": "continued", "continued_by": str(runs / "b"), "steps": 2,
                                    "checkpoint": str(runs / "a" / "checkpoints" / ckpt.LAST),
                                    "run_dir": str(runs / "a"), "model": "resnet_tiny",
                                    "data": "synthetic_shapes", "seed": 2}
    caplog.clear()
    c = train(tiny_cfg(*RUN, "trainer.resume=auto"), runs / "c")
    assert c["resumed_from"] == str(runs / "b" / "checkpoints" / ckpt.LAST) and c["steps"] == 6
    assert c["param_digests"] == full["param_digests"] and c["metrics"] == full["metrics"]
    assert [r["step"] for r in read_metrics(runs / "c" / "metrics.jsonl", "train")] == [1, 2, 3, 4, 5, 6]
    assert _summary(runs / "b")["status"] == "continued" and _summary(runs / "b")["continued_by"] == str(runs / "c")
    assert len(_said(caplog, "trainer.resume=auto: continuing")) == 1 and _said(caplog, f"continuing {runs / 'b'},")

    caplog.clear()
    d = train(tiny_cfg(*RUN, "trainer.resume=auto"), runs / "d")
    assert d["resumed_from"] is None and d["steps"] == 6  # fresh: nothing unfinished is left
    passed = _said(caplog, "passing over")
    assert passed == ["trainer.resume=auto: passing over c: completed",
                      f"trainer.resume=auto: passing over b: continued by {runs / 'c'}",
                      f"trainer.resume=auto: passing over a: continued by {runs / 'b'}"]
    assert _said(caplog, "starting fresh")


def test_a_resume_killed_before_its_first_checkpoint_leaves_the_old_run_resumable(tiny_cfg, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    _killed(tiny_cfg, monkeypatch, runs / "a", 3)  # checkpoint of step 2
    _killed(tiny_cfg, monkeypatch, runs / "b", 4, "trainer.resume=auto")  # killed in step 4: saved nothing
    assert not (runs / "a" / "summary.json").exists() and not (runs / "b" / "checkpoints" / ckpt.LAST).exists()
    c = train(tiny_cfg(*RUN, "trainer.resume=auto"), runs / "c")
    assert c["resumed_from"] == str(runs / "a" / "checkpoints" / ckpt.LAST)
    assert _summary(runs / "a")["continued_by"] == str(runs / "c")


def test_report_reads_a_chain_as_its_newest_run(tiny_cfg, tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs"
    _killed(tiny_cfg, monkeypatch, runs / "a", 3)
    train(tiny_cfg(*RUN, "trainer.resume=auto"), runs / "b")
    capsys.readouterr()
    for given in (runs, runs / "a"):  # the run name's folder, or the continued folder itself
        code = report_tool.main([str(given), "--out", str(tmp_path / "report")])
        out, err = capsys.readouterr()
        assert code == 1, err  # fp32 only: nothing to compare, but no input error (exit 2)
        assert f"{runs / 'a'}: continued by a resumed run (trainer.resume); read as {runs / 'b'}" in out
        assert json.loads((tmp_path / "report" / "report.json").read_text())["set_aside"] == []


def test_a_guard_stopped_run_is_not_resumed_by_auto_and_the_report_sets_it_aside(tiny_cfg, tmp_path, caplog, capsys):
    caplog.set_level("INFO")
    runs = tmp_path / "runs"
    stop = ["amp=O1", "amp.init_loss_scaling=1e30", "amp.use_dynamic_loss_scaling=false",
            "amp.guard.max_consecutive_skips=2"]
    # tools/train.py's op locator, as a user's run has it: it must not turn the stop into a crash
    with pytest.raises(GuardStopped):
        train(tiny_cfg(*RUN, *stop), runs / "a", locate_nonfinite=locate_and_describe)
    assert _summary(runs / "a")["status"] == "stopped_by_guard"
    # the same run name with the scaler fixed: a fresh run, one line on the stopped one, no error
    fresh = train(tiny_cfg(*RUN, "amp=O1", "trainer.resume=auto"), runs / "b")
    assert fresh["resumed_from"] is None and fresh["status"] == "completed"
    (line,) = _said(caplog, "passing over a:")
    assert "stopped by the numerics guard at step 2" in line and f"trainer.resume={runs / 'a'}" in line
    capsys.readouterr()
    assert report_tool.main([str(runs), "--out", str(tmp_path / "report")]) == 1
    aside = json.loads((tmp_path / "report" / "report.json").read_text())["set_aside"]
    assert aside == [{"path": str(runs / "a"), "reason": "status 'stopped_by_guard', not completed"}]


def test_resume_keeps_the_run_length_unless_the_command_line_sets_it(tiny_cfg, tmp_path, monkeypatch, caplog):
    """train()'s command_line is what tools/train.py passes: Hydra's overrides as typed."""
    caplog.set_level("INFO")
    full = train(tiny_cfg(*RUN), tmp_path / "full")
    _killed(tiny_cfg, monkeypatch, tmp_path / "a" / "x", 5)
    # no trainer.max_steps on the command line (a fresh run would have 4): the killed run's 6 are kept
    kept = train(tiny_cfg("seed=2", "trainer.max_steps=4", "trainer.resume=auto"), tmp_path / "a" / "y",
                 command_line=["trainer.resume=auto"])
    assert kept["steps"] == 6 and kept["param_digests"] == full["param_digests"]
    assert "max_steps: 6" in (tmp_path / "a" / "y" / "config.yaml").read_text()
    (line,) = _said(caplog, "keeping the resumed run's length")
    assert "trainer.max_steps=6" in line and "trainer.max_steps=4" in line
    # set on the command line: taken, and said
    _killed(tiny_cfg, monkeypatch, tmp_path / "b" / "x", 5)
    longer = train(tiny_cfg("seed=2", "trainer.max_steps=8", "trainer.resume=auto"), tmp_path / "b" / "y",
                   command_line=["trainer.max_steps=8", "trainer.resume=auto"])
    assert longer["steps"] == 8
    (line,) = _said(caplog, "the run's length changes")
    assert "from trainer.max_steps=6 to trainer.max_steps=8 (set on the command line)" in line


def test_readme_lines_compose(tiny_cfg, tmp_path, monkeypatch, ampzoo_home):
    """README: `... trainer.max_steps=50` killed, then `... trainer.resume=auto` finishes that run
    (here 6 steps; resnet_tiny's own length is 200), through tools/train.py."""
    full = train(tiny_cfg(*RUN), tmp_path / "full")
    runs = tmp_path / "outputs" / "run_name"
    _killed(tiny_cfg, monkeypatch, runs / "2026-01-01_00-00-00", 5)
    args = [a for a in TINY if not a.startswith("trainer.max_steps=")] + ["trainer.ckpt_every=2", "seed=2"]
    env = dict(os.environ, PYTHONWARNINGS="ignore", AMPZOO_HOME=str(ampzoo_home), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), *args, "trainer.resume=auto",
                          f"hydra.run.dir={runs / '2026-01-01_00-01-00'}"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = _summary(runs / "2026-01-01_00-01-00")
    assert summary["steps"] == 6 and summary["param_digests"] == full["param_digests"]
    assert "keeping the resumed run's length, trainer.max_steps=6" in out.stdout + out.stderr
    assert "after 6 steps" in out.stdout


def test_keys_added_since_a_checkpoint_and_published_records_are_no_unsafe_change():
    """A checkpoint written before ``trainer.drop_last`` existed dropped the last batch, which is the key's
    default: resuming it with the default is no change, with ``false`` it is one. An experiment's
    ``published`` figure is a record, safe to change."""
    from zoo.engine.checkpoint import unsafe_changes

    saved = "trainer:\n  max_steps: 10\n"
    assert unsafe_changes(saved, "trainer:\n  max_steps: 10\n  drop_last: true\n") == {}
    assert unsafe_changes(saved, "trainer:\n  max_steps: 10\n  drop_last: false\n") == {
        "trainer.drop_last": (True, False)}
    assert unsafe_changes("published:\n  value: 75.1\n", "published:\n  value: 75.12\n") == {}
    assert "seed" in unsafe_changes("seed: 0\n", "seed: 1\n")
