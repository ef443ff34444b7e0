"""A second Ctrl-C during training stops at once and says so: the step whose checkpoint is kept and
the command that resumes it, never "outside the training loop" (issue 40.5)."""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, TINY

from zoo.engine import checkpoint as ckpt
from zoo.engine.metrics_log import read_metrics

OUTSIDE = "outside the training loop"


def _env(ampzoo_home) -> dict:
    return dict(os.environ, PYTHONWARNINGS="ignore", AMPZOO_HOME=str(ampzoo_home), OMP_NUM_THREADS="1")


def _resume_args(line: str) -> list[str]:
    """The arguments after ``python tools/train.py`` of the line's resume command."""
    command = line.split("resume with trainer.resume=auto: ", 1)[1]
    words = shlex.split(command)
    assert words[:2] == ["python", "tools/train.py"] and words[-1] == "trainer.resume=auto", command
    return words[2:]


# The second SIGINT lands while the checkpoint of the stop is written: before its rename (the file on
# disk is still step 2's, ckpt_every=2) or after it (step 3's is in place).
DRIVER = """
import os, runpy, signal, sys
sys.path[:0] = [{root!r}, {tools!r}]
from zoo.engine import checkpoint as ckpt
from zoo.engine.trainer import Trainer
real_step, real_save, when, saved = Trainer.train_step, ckpt.atomic_save, {when!r}, []
def train_step(self, batch):
    if self.step == 2:
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C, during step 3
    return real_step(self, batch)
def atomic_save(obj, path):
    if obj["step"] == 3 and when == "before the rename":
        os.kill(os.getpid(), signal.SIGINT)
    out = real_save(obj, path)
    saved.append(obj["step"])
    if obj["step"] == 3 and when == "after the rename":
        os.kill(os.getpid(), signal.SIGINT)
    return out
real_last = ckpt.last_checkpoint
def last_checkpoint(out_dir):  # called while the stop's line is put together
    if when == "while the line is written" and saved[-1:] == [3]:
        os.kill(os.getpid(), signal.SIGINT)
    return real_last(out_dir)
Trainer.train_step, ckpt.atomic_save, ckpt.last_checkpoint = train_step, atomic_save, last_checkpoint
sys.argv = [{train!r}, *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("when, kept", [("before the rename", 2), ("after the rename", 3),
                                        ("while the line is written", 3)])
def test_second_sigint_while_the_checkpoint_is_written_names_the_kept_step_and_the_command(
        tmp_path, ampzoo_home, when, kept):
    driver = tmp_path / "driver.py"
    tools = ROOT / "tools"
    driver.write_text(DRIVER.format(root=str(ROOT), tools=str(tools), train=str(tools / "train.py"), when=when))
    run = tmp_path / "run"
    args = [*TINY, "trainer.max_steps=6", "trainer.ckpt_every=2", f"hydra.run.dir={run}"]
    proc = subprocess.run([sys.executable, str(driver), *args], cwd=ROOT, env=_env(ampzoo_home),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert OUTSIDE not in proc.stderr and "Traceback" not in proc.stderr
    last = run / "checkpoints" / ckpt.LAST
    line = proc.stderr.strip().splitlines()[-1]
    where = (f"the checkpoint of step 2 is kept ({last}; step 3 not saved)" if kept == 2
             else f"checkpoint saved to {last}")
    # a signal after the checkpoint, while the line is written, changes nothing: the run stopped whole
    how = "" if when == "while the line is written" else " by a second SIGINT, at once"
    command = shlex.join(["python", "tools/train.py", *args, "trainer.resume=auto"])
    assert line == (f"interrupted at step 3{how}; {where}, resume with "
                    f"trainer.resume=auto: {command}")
    assert ckpt.load(last)["step"] == kept
    # the command as printed resumes from that step and finishes the run
    resumed = subprocess.run([sys.executable, "tools/train.py", *_resume_args(line)], cwd=ROOT,
                             env=_env(ampzoo_home), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {last} at step {kept}" in (run / "train.log").read_text()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl", "train")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("gap", [0.0, 0.02, 0.3])
def test_two_ctrl_c_to_a_real_training_process_name_the_kept_step(tmp_path, ampzoo_home, gap):
    """Two Ctrl-C from a terminal (the whole process group), ``gap`` seconds apart: wherever the second
    lands (in a step, in the checkpoint write, while the stop unwinds), the last line names the step of
    the checkpoint on disk and the resume command."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "tools/train.py", *TINY, "trainer.max_steps=100000",
                             "trainer.ckpt_every=3", f"hydra.run.dir={run}"], cwd=ROOT, env=_env(ampzoo_home),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(gap)
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:  # already gone: the first stop finished within the gap
            pass
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    # 130, or killed by the SIGINT itself when it lands as the interpreter shuts down (a shell says 130)
    assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
    assert OUTSIDE not in err and "Traceback" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    found = re.match(r"interrupted at step (\d+)(?: by a second SIGINT, at once)?; "
                     r"(?:checkpoint saved to ([^,]+),|the checkpoint of step (\d+) is kept \(([^;]+); step)", line)
    assert found, line
    step = int(found.group(1))
    kept, path = (step, found.group(2)) if found.group(2) else (int(found.group(3)), found.group(4))
    assert path == str(run / "checkpoints" / ckpt.LAST) and ckpt.load(path)["step"] == kept
    assert _resume_args(line)[:len(TINY)] == TINY
