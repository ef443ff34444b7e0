"""Promised clean errors (one ``error:`` line naming the key or file, exit 2) and clean interruption."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import _entry
import pytest
from conftest import ROOT, TINY, compose

from zoo.engine import checkpoint as ckpt
from zoo.engine.metrics_log import read_metrics
from zoo.engine.run import train
from zoo.engine.trainer import Trainer


def _run(cfg, out_dir, capsys):
    """tools/train.py's body in-process: returns (exit status, stderr)."""
    with pytest.raises(SystemExit) as exit_:
        _entry.run_or_exit(train, cfg, out_dir)
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize("overrides, expect", [
    (["experiment=db_mv3_icdar2015"], "error: data.root: missing mandatory value"),
    ([*TINY, "seed=abc"], "error: seed: expected a non-negative integer, got 'abc'"),
    ([*TINY, "trainer.num_workers=-1"], "error: trainer.num_workers: expected an integer >= 0"),
    ([*TINY, "trainer.max_steps=abc"], "error: trainer.max_steps: expected a positive integer, got 'abc'"),
    ([*TINY, "trainer.epochs=soon"], "error: trainer.epochs: expected null or a finite number > 0"),
    (["model=db_det", "data.builder.keep_freed_memory=lots"], "error: data.builder.keep_freed_memory: expected true"),
])
def test_bad_values_are_one_line_with_status_2(tmp_path, capsys, overrides, expect):
    status, err = _run(compose(overrides), tmp_path / "run", capsys)
    assert status == 2 and err.strip().splitlines() == [err.strip().splitlines()[0]]
    assert err.startswith(expect), err


@pytest.mark.parametrize("overrides, message", [
    (["optim.lr=nan"], "optim.lr: expected a finite number > 0, got nan"),
    (["optim.lr=inf"], "optim.lr: expected a finite number > 0, got inf"),
    (["optim.lr=-inf"], "optim.lr: expected a finite number > 0, got -inf"),
    (["optim.grad_clip_norm=-1"], "optim.grad_clip_norm: expected null or a finite number > 0 (null = no clipping), got -1"),
    (["optim.grad_clip_norm=inf"], "optim.grad_clip_norm: expected null or a finite number > 0 (null = no clipping), got inf"),
    (["optim=momentum", "optim.optimizer.weight_decay=-1e-4"],
     "optim.optimizer.weight_decay: expected null or a finite number >= 0, got -0.0001"),
    (["optim=momentum", "optim.optimizer.momentum=nan"], "optim.optimizer.momentum: expected a finite number in [0, 1), got nan"),
    (["optim.optimizer.beta2=1"], "optim.optimizer.beta2: expected a finite number in [0, 1), got 1"),
    (["amp=O1", "amp.init_loss_scaling=inf"], "amp.init_loss_scaling: expected a finite number > 0, got inf"),
    (["amp=O1", "amp.incr_ratio=nan"], "amp.incr_ratio: expected a finite number > 1, got nan"),
    (["amp=O1", "amp.decr_ratio=1"], "amp.decr_ratio: expected a finite number in (0, 1), got 1"),
    (["amp=O1", "amp.incr_every_n_steps=2.5"], "amp.incr_every_n_steps: expected a positive integer, got 2.5"),
    (["amp=O1", "amp.decr_every_n_nan_or_inf=0"], "amp.decr_every_n_nan_or_inf: expected a positive integer, got 0"),
    (["amp=O1", "amp.guard.min_loss_scale=-1"], "amp.guard.min_loss_scale: expected a finite number >= 0, got -1"),
    (["trainer.ema_decay=1"], "trainer.ema_decay: expected null or a finite number in [0, 1) (null or 0 = no EMA), got 1"),
    (["trainer.epochs=inf"], "trainer.epochs: expected null or a finite number > 0, got inf"),
    (["sched.warmup_start_factor=nan"], "sched.warmup_start_factor: expected a finite number in [0, 1] (of the base LR), got nan"),
    (["sched.warmup_steps=-1"], "sched.warmup_steps: expected an integer >= 0, got -1"),
    (["sched.horizon=inf"], "sched.horizon: expected a finite number >= 1 (cosine period / run length), got inf"),
    (["model.task.label_smoothing=-0.1"], "model.task.label_smoothing: expected a finite number in [0, 1), got -0.1"),
    # a number without a rule of its own: still never nan or inf
    (["data.builder.image_size=inf"], "data.builder.image_size: expected a finite number, got inf"),
])
def test_non_finite_and_negative_settings_are_refused_by_key(tmp_path, capsys, overrides, message):
    """nan <= 0 is false: every numeric setting is checked for finiteness first, then its bounds."""
    status, err = _run(compose([*TINY, *overrides]), tmp_path / "run", capsys)
    assert (status, err.strip().splitlines()) == (2, [f"error: {message}"])
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before training


@pytest.mark.parametrize("overrides, message", [
    (["amp.custom_black_list=[exp,reduce_men]"], "amp.custom_black_list: unknown op 'reduce_men'; did you mean 'reduce_mean'?"),
    (["amp.custom_white_list=[conv2]"], "amp.custom_white_list: unknown op 'conv2'; did you mean 'conv2d'?"),
    (["amp.custom_black_list=[Exp]"], "amp.custom_black_list: unknown op 'Exp'; did you mean 'exp'?"),
    (["amp.custom_black_list=[anytypo]"], "amp.custom_black_list: unknown op 'anytypo'; "),
])
def test_unknown_op_names_in_the_amp_lists_are_refused(tmp_path, capsys, overrides, message):
    """auto_cast ignores an op name it never meets, so a typo in a recipe's list would change nothing."""
    status, err = _run(compose([*TINY, "amp=O1", *overrides]), tmp_path / "run", capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"error: {message}"), err


def test_lr_nan_from_the_command_line_is_one_line_and_exit_2(tmp_path, ampzoo_home):
    from conftest import run_tool

    out = run_tool(["tools/train.py", *TINY, "optim.lr=nan", f"hydra.run.dir={tmp_path / 'run'}"], ROOT,
                   {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1:] == [
        "error: optim.lr: expected a finite number > 0, got nan"], out.stderr[-2000:]
    assert "Traceback" not in out.stderr and not (tmp_path / "run").exists()


def test_disk_full_names_the_file(tiny_cfg, tmp_path, capsys):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full to emulate a full disk")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to("/dev/full")  # every write to it fails with ENOSPC
    status, err = _run(tiny_cfg(), run, capsys)
    assert status == 2 and f"{run / 'metrics.jsonl'}" in err and "No space left on device" in err, err


def _signal_at_step(monkeypatch, signum, at_step):
    real_step = Trainer.train_step

    def step(self, batch):
        if self.step == at_step:
            os.kill(os.getpid(), signum)  # delivered to the handler before the next bytecode
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", step)


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_a_checkpoint_at_the_end_of_the_step(tiny_cfg, tmp_path, capsys, monkeypatch,
                                                         signum, status):
    run = tmp_path / "run"
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # SIG_IGN under nohup ... &
    _signal_at_step(monkeypatch, signum, at_step=2)  # during step 3; ckpt_every=2 saved step 2
    code, err = _run(tiny_cfg("trainer.max_steps=6", "trainer.ckpt_every=4"), run, capsys)
    assert code == status
    assert err.strip().splitlines()[-1] == (f"interrupted at step 3; checkpoint saved to {run / 'checkpoints' / ckpt.LAST}, "
                           "resume with trainer.resume=auto")
    assert ckpt.load(run / "checkpoints" / ckpt.LAST)["step"] == 3 and not (run / "summary.json").exists()
    assert {s: signal.getsignal(s) for s in before} == before  # handlers restored
    monkeypatch.undo()
    resumed = train(tiny_cfg("trainer.max_steps=6", "trainer.ckpt_every=4", "trainer.resume=auto"), run)
    assert resumed["steps"] == 6 and resumed["resumed_from"].endswith(ckpt.LAST)


def _signal_in_eval_batch(monkeypatch, signum, call):
    """Send ``signum`` during the ``call``-th evaluation batch of the run (1-based, all evaluations)."""
    from zoo.tasks.classification import ClassificationTask

    real, calls = ClassificationTask.eval_stats, []

    def eval_stats(self, model, batch):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signum)
        return real(self, model, batch)

    monkeypatch.setattr(ClassificationTask, "eval_stats", eval_stats)


def _signal_while_drawing(monkeypatch, signum):
    import zoo.engine.trainer as trainer_module

    def draw(*args, **kwargs):
        os.kill(os.getpid(), signum)
        return []

    monkeypatch.setattr(trainer_module, "draw_samples", draw)


# (phase, extra overrides, how to hit it, the step it stops at, the phase named in the line, signal).
# TINY evaluates 48 images in batches of 24: two batches per evaluation.
STOP_PHASES = [
    ("periodic evaluation", ["trainer.eval_every=2"], lambda mp, s: _signal_in_eval_batch(mp, s, 1), 2,
     " (evaluation)", signal.SIGTERM),
    ("final evaluation", [], lambda mp, s: _signal_in_eval_batch(mp, s, 1), 4, " (final evaluation)", signal.SIGTERM),
    ("final evaluation, ctrl-c", [], lambda mp, s: _signal_in_eval_batch(mp, s, 2), 4, " (final evaluation)",
     signal.SIGINT),
    ("fp32 evaluation", ["amp=O1"], lambda mp, s: _signal_in_eval_batch(mp, s, 3), 4, " (FP32 evaluation)",
     signal.SIGTERM),
    ("drawing", ["trainer.draw_samples=2"], _signal_while_drawing, 4, " (drawing)", signal.SIGTERM),
]


@pytest.mark.parametrize("phase, extra, hit, step, named, signum", STOP_PHASES, ids=[p[0] for p in STOP_PHASES])
def test_signal_in_every_phase_saves_the_last_step_and_resume_finishes_the_run(
        tiny_cfg, tmp_path, capsys, monkeypatch, phase, extra, hit, step, named, signum):
    """SIGTERM (or Ctrl-C) in an evaluation or the drawings: one line, exit 143 (130), the checkpoint
    of the last completed step; resume=auto finishes the run (redoing the evaluation, not the steps)
    and ends where an uninterrupted run ends."""
    over = ["trainer.max_steps=4", "trainer.ckpt_every=50", *extra]
    full = train(tiny_cfg(*over), tmp_path / "full")
    run = tmp_path / "runs" / "a_stopped"
    hit(monkeypatch, signum)
    code, err = _run(tiny_cfg(*over), run, capsys)
    last = run / "checkpoints" / ckpt.LAST
    assert code == 128 + signum, err
    assert err.strip().splitlines()[-1] == (f"interrupted at step {step}{named}; checkpoint saved to {last}, "
                                            "resume with trainer.resume=auto")
    assert "Traceback" not in err
    state = ckpt.load(last)
    assert state["step"] == step and not (run / "summary.json").exists()
    # unfinished in the checkpoint: the evaluation it stopped in (not one that ended with its last
    # batch, as the Ctrl-C case's, which stops before the bootstrap that follows)
    assert state["eval_pending"] is (phase in ("periodic evaluation", "final evaluation"))
    monkeypatch.undo()
    resumed = train(tiny_cfg(*over, "trainer.resume=auto"), tmp_path / "runs" / "b_resumed")
    assert resumed["status"] == "completed" and resumed["steps"] == 4
    assert resumed["resumed_from"] == str(last)
    assert resumed["metrics"] == full["metrics"] and resumed["param_digests"] == full["param_digests"]
    assert resumed.get("metrics_fp32_eval") == full.get("metrics_fp32_eval")
    records = [(r["kind"], r["step"]) for r in read_metrics(tmp_path / "runs" / "b_resumed" / "metrics.jsonl")
               if r["kind"] in ("train", "eval")]
    assert records == [(r["kind"], r["step"]) for r in read_metrics(tmp_path / "full" / "metrics.jsonl")
                       if r["kind"] in ("train", "eval")]  # every step and evaluation once


def test_train_tool_stopped_in_the_final_evaluation_exits_143_and_resume_only_evaluates(tmp_path, ampzoo_home):
    """The reported case, as processes: SIGTERM when the final evaluation starts."""
    driver = tmp_path / "train_with_sigterm_in_final_eval.py"
    driver.write_text(f"""
import os, runpy, signal, sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tools')!r}]  # this checkout's zoo, installed or not
from zoo.engine.trainer import Trainer
real = Trainer.evaluate
def evaluate(self, phase="evaluation"):
    if phase == "final evaluation":
        os.kill(os.getpid(), signal.SIGTERM)
    return real(self, phase)
Trainer.evaluate = evaluate
sys.argv = [{str(ROOT / 'tools' / 'train.py')!r}, *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
""")
    env = dict(os.environ, PYTHONWARNINGS="ignore", AMPZOO_HOME=str(ampzoo_home))
    args = [*TINY, "trainer.max_steps=2", "trainer.ckpt_every=50"]
    runs = tmp_path / "runs"
    first = subprocess.run([sys.executable, str(driver), *args, f"hydra.run.dir={runs / 'a'}"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    last = runs / "a" / "checkpoints" / ckpt.LAST
    assert first.returncode == 143, first.stderr[-3000:]
    command = shlex.join(["python", "tools/train.py", *args, f"hydra.run.dir={runs / 'a'}", "trainer.resume=auto"])
    assert first.stderr.strip().splitlines()[-1] == (  # the whole command: the run's overrides repeated
        f"interrupted at step 2 (final evaluation); checkpoint saved to {last}, resume with trainer.resume=auto: "
        f"{command}")
    assert ckpt.load(last)["step"] == 2
    second = subprocess.run([sys.executable, "tools/train.py", *args, "trainer.resume=auto",
                             f"hydra.run.dir={runs / 'b'}"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads((runs / "b" / "summary.json").read_text())
    assert summary["resumed_from"] == str(last) and summary["steps"] == 2
    assert summary["primary_metric"]["value"] is not None
    train_lines = [r for r in read_metrics(runs / "b" / "metrics.jsonl", "train")]
    assert [r["step"] for r in train_lines] == [1, 2]  # carried over, not trained again
    assert "resumed from" in (runs / "b" / "train.log").read_text()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_ctrl_c_in_a_real_process_prints_one_line_and_exits_130(tmp_path, ampzoo_home, workers):
    """Ctrl-C in a terminal signals the whole process group, loader workers included."""
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONWARNINGS="ignore", AMPZOO_HOME=str(ampzoo_home))
    proc = subprocess.Popen([sys.executable, "tools/train.py", *TINY, "trainer.max_steps=100000",
                             "trainer.ckpt_every=100000", f"trainer.num_workers={workers}",
                             f"hydra.run.dir={run}"], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while not (run / "metrics.jsonl").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted at step ") and "resume with trainer.resume=auto" in last
    assert "Traceback" not in err
    step = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    assert ckpt.load(run / "checkpoints" / ckpt.LAST)["step"] >= step


def test_missing_image_file_in_a_list_is_one_line_naming_it(tmp_path, capsys):
    import cv2
    import numpy as np

    root = tmp_path / "imagenet"
    (root / "img").mkdir(parents=True)
    for i in range(3):
        cv2.imwrite(str(root / "img" / f"{i}.png"), np.full((40, 40, 3), 60 * i, np.uint8))
    lines = [f"img/{i % 3}.png {i % 2}" for i in range(7)] + ["img/gone.png 1"]
    (root / "train_list.txt").write_text("\n".join(lines) + "\n")
    (root / "val_list.txt").write_text("\n".join(lines[:4]) + "\n")
    tiny = [o for o in TINY if not o.startswith("data.builder.num_")]
    cfg = compose([*tiny, "data=imagenet", f"data.root={root}", "data.num_classes=2", "model.batch_size=4",
                   "model.eval_batch_size=2", "data.builder.image_size=32", "data.builder.resize_size=36",
                   "trainer.max_steps=4"])
    status, err = _run(cfg, tmp_path / "run", capsys)
    assert status == 2 and "Traceback" not in err
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and f"image file not found: {root / 'img' / 'gone.png'}" in line[0]


def test_a_run_whose_every_step_was_skipped_says_so_and_exits_3(tiny_cfg, tmp_path, capsys):
    # A loss scale of 1e30 overflows fp16 at every one of the 4 steps (halving per skip leaves it
    # at 1.25e29): the weights never move. The run completes, but must not look like a result.
    run = tmp_path / "run"
    status, err = _run(tiny_cfg("amp=O1", "amp.init_loss_scaling=1e30"), run, capsys)
    summary = json.loads((run / "summary.json").read_text())
    assert status == 3, err
    assert summary["skipped_steps"] == summary["steps"] == 4 and summary["all_steps_skipped"] is True
    assert "error: every one of the 4 steps was skipped" in err and "never updated" in err
    # the report sets such a run aside as no evidence
    from zoo.report.runs import load_runs, set_aside_reason
    (reason,) = [set_aside_reason(r) for r in load_runs([run])]
    assert "every one of its 4 steps was skipped" in reason


def test_a_run_with_some_skipped_steps_is_an_ordinary_result(tiny_cfg, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = tiny_cfg("amp=O1", "amp.init_loss_scaling=2.5e5")  # 2.5e5 and 1.25e5 overflow (measured)
    train(cfg, run)
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < summary["skipped_steps"] < summary["steps"] and summary["all_steps_skipped"] is False
