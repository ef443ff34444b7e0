"""The run folder: no debris from killed writers, one run at a time, resume only with the same settings."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

from zoo.engine.run import train
from zoo.engine.runlock import LOCK_NAME, RunFolderBusy, RunLock
from zoo.utils.fileio import atomic_write


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_temp_files_of_killed_writers_are_removed_at_the_next_write(tmp_path):
    target = tmp_path / "checkpoints" / "last.pdckpt"
    target.parent.mkdir()
    dead = target.with_name(f".last.pdckpt.tmp{_dead_pid()}")
    live = target.with_name(f".last.pdckpt.tmp{os.getppid()}")  # a writer still at work: left alone
    other = target.with_name(f".best.pdparams.tmp{_dead_pid()}")  # another file's: not ours to judge
    for p in (dead, live, other):
        p.write_bytes(b"half a checkpoint")
    atomic_write(target, lambda tmp: tmp.write_bytes(b"complete"))
    assert target.read_bytes() == b"complete"
    assert not dead.exists() and live.exists() and other.exists()


def test_second_run_into_a_locked_folder_fails_naming_the_holder(tiny_cfg, tmp_path):
    run = tmp_path / "run"
    with RunLock(run):
        assert f"pid {os.getpid()}" in (run / LOCK_NAME).read_text()
        with pytest.raises(RunFolderBusy, match=f"{run} is in use by another run \\(pid {os.getpid()} "):
            train(tiny_cfg(), run)
        assert not (run / "metrics.jsonl").exists() and not (run / "config.yaml").exists()
    assert not (run / LOCK_NAME).exists()  # released at exit
    summary = train(tiny_cfg(), run)
    assert summary["status"] == "completed" and not (run / LOCK_NAME).exists()


def test_stale_lock_of_a_dead_run_is_taken_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text(f"pid {_dead_pid()} on host since then\n")  # left by kill -9
    with RunLock(run):
        assert f"pid {os.getpid()}" in (run / LOCK_NAME).read_text()


def test_lock_held_by_another_process_is_refused(tmp_path):
    run = tmp_path / "run"
    code = ("import sys, time; sys.path.insert(0, sys.argv[2]); from zoo.engine.runlock import RunLock; "
            "RunLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run), str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunFolderBusy, match=f"pid {holder.pid} "):
            RunLock(run).acquire()
    finally:
        holder.kill()
        holder.wait()
    with RunLock(run):  # the kernel dropped the dead holder's lock
        pass


def test_failed_start_leaves_no_empty_folder(tiny_cfg, tmp_path):
    run = tmp_path / "outputs" / "never"
    with pytest.raises(Exception, match="model.batch_size"):
        train(tiny_cfg("model.batch_size=-1"), run)
    assert not run.exists()


@pytest.mark.timeout(120)
def test_failed_start_from_the_command_line_leaves_no_outputs_folder(tmp_path):
    from conftest import TINY, run_tool

    out = run_tool([str(ROOT / "tools" / "train.py"), *TINY, "model.batch_size=-2"], tmp_path)
    assert out.returncode == 2 and "error: model.batch_size" in out.stderr
    assert not (tmp_path / "outputs").exists()
    (tmp_path / "outputs" / "keep").mkdir(parents=True)  # someone else's: the parent stays
    out = run_tool([str(ROOT / "tools" / "train.py"), *TINY, "seed=-1"], tmp_path)
    assert out.returncode == 2 and [p.name for p in (tmp_path / "outputs").iterdir()] == ["keep"]


def test_resume_refuses_changed_settings_and_lists_them(tiny_cfg, tmp_path, caplog):
    from zoo.engine.checkpoint import CheckpointError

    run = tmp_path / "runs" / "a"
    train(tiny_cfg("trainer.max_steps=2"), run)
    (run / "summary.json").unlink()  # as if killed after its last checkpoint
    before = (run / "checkpoints" / "last.pdckpt").read_bytes()
    changed = ("trainer.max_steps=4", "model.batch_size=8", "optim.lr=0.5")
    with pytest.raises(CheckpointError) as err:  # named explicitly: refused, the keys listed
        train(tiny_cfg(*changed, f"trainer.resume={run}"), tmp_path / "runs" / "b")
    msg = str(err.value)
    assert "model.batch_size: 16 -> 8" in msg and "optim.lr:" in msg and "-> 0.5" in msg
    assert "trainer.max_steps" not in msg and "trainer.resume:" not in msg  # safe to change: not listed
    assert "trainer.resume_allow_changes=true" in msg
    assert (run / "checkpoints" / "last.pdckpt").read_bytes() == before
    assert not (tmp_path / "runs" / "b").exists()  # a refused start leaves no folder

    # auto takes only a run with these settings: it passes over this one, saying why, and starts fresh
    caplog.set_level("INFO")
    fresh = train(tiny_cfg(*changed, "trainer.resume=auto"), tmp_path / "runs" / "c")
    assert fresh["resumed_from"] is None and fresh["steps"] == 4
    passed = [r.getMessage() for r in caplog.records if "passing over a:" in r.getMessage()]
    assert len(passed) == 1 and "model.batch_size: 16 -> 8" in passed[0] and "resume_allow_changes" in passed[0]
    assert not (run / "summary.json").exists()  # still unfinished: nothing continued it

    summary = train(tiny_cfg("trainer.max_steps=4", "trainer.resume=auto", "model.batch_size=8",
                             "trainer.resume_allow_changes=true", "trainer.log_every=2"), tmp_path / "runs" / "b")
    assert summary["resumed_from"].endswith("a/checkpoints/last.pdckpt") and summary["steps"] == 4
    changes = summary["resume_changes"]
    assert changes["overridden"] == {"model.batch_size": [16, 8]}
    assert changes["safe"]["trainer.log_every"] == [1, 2] and changes["safe"]["trainer.max_steps"] == [2, 4]


def test_resume_with_the_same_settings_records_no_changes(tiny_cfg, tmp_path):
    train(tiny_cfg("trainer.max_steps=2"), tmp_path)
    summary = train(tiny_cfg("trainer.max_steps=2", "trainer.resume=auto"), tmp_path)
    assert summary["resume_changes"] == {"safe": {"trainer.resume": [None, "auto"]}, "overridden": {},
                                         "checked": True}


def test_resume_auto_does_not_continue_a_run_that_is_still_alive(tiny_cfg, tmp_path):
    from zoo.engine import checkpoint as ckpt
    from zoo.engine.resume import find_resume

    live = tmp_path / "runs" / "a_live"
    train(tiny_cfg("trainer.max_steps=2"), live)
    (live / "summary.json").unlink()  # looks unfinished ...
    with RunLock(live):  # ... but its process is alive
        assert find_resume("auto", tmp_path / "runs" / "b") is None
    assert find_resume("auto", tmp_path / "runs" / "b") == live / "checkpoints" / ckpt.LAST
