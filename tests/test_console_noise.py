"""Console noise a newcomer reads (issue 40.8): each case runs the thing and expects the noise gone
and the useful line still there."""
from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess
import warnings

import numpy as np
import pytest
from conftest import ROOT, TINY, run_tool

from zoo.engine.metrics_log import read_metrics
from zoo.engine.run import train
from zoo.utils.progress import Progress, write_line
from zoo.utils.stderr_filter import PIR_OUT_TENSOR_WARNING, dropping_stderr_lines

BN_WARNING = "When training, we now always track global mean and variance"
PIR_WARNING = "not support input out tensor"


# ---- a + b: a short train run, then its export, as a user runs them ---------------------------
def test_train_and_export_print_no_batchnorm_or_pir_warning(tmp_path):
    shows = {"PYTHONWARNINGS": "default", "OMP_NUM_THREADS": "1"}  # run_tool ignores warnings otherwise
    run = tmp_path / "run"
    out = run_tool(["tools/train.py", *TINY, "trainer.max_steps=2", "data.builder.num_val=24",
                    f"hydra.run.dir={run}"], cwd=ROOT, env_extra=shows)
    assert out.returncode == 0, out.stderr[-3000:]
    assert BN_WARNING not in out.stderr + out.stdout
    assert re.search(r"top1 [\d.]+ after 2 steps", out.stdout)  # the useful line is still there

    exported = run_tool(["tools/export.py", f"run={run}", f"export.out_dir={tmp_path / 'deploy'}"], cwd=ROOT,
                        env_extra=shows)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert PIR_WARNING not in exported.stderr + exported.stdout
    assert f"exported to {tmp_path / 'deploy'}" in exported.stdout
    assert (tmp_path / "deploy" / "inference.json").is_file()


def test_the_batchnorm_filter_is_that_message_from_paddles_norm_module_only():
    import _entry

    def shown(message, module):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _entry.quiet_paddle_warnings()  # _entry's filters alone, on top of "show everything"
            warnings.warn_explicit(message, UserWarning, "norm.py", 885, module=module)
        return [str(w.message) for w in caught]

    assert shown(BN_WARNING + ".", "paddle.nn.layer.norm") == []
    assert shown(BN_WARNING + ".", "zoo.models.something") == [BN_WARNING + "."]
    assert shown("When training, something else.", "paddle.nn.layer.norm") == ["When training, something else."]


def test_the_glog_line_is_dropped_and_everything_else_written_to_fd_2_is_kept(capfd):
    glog = b"W1204 04:15:11.275440 28360 eager_utils.cc:3584] Paddle static graph(PIR) not support input out tensor for now!!!!!\n"
    with dropping_stderr_lines([PIR_OUT_TENSOR_WARNING]):
        os.write(2, b"before\n" + glog + b"W1204 04:15:11.3 28360 other.cc:1] another glog warning\n")
        os.write(2, b"a line of Python's (sys.stderr writes to fd 2 outside pytest's capture)\n")
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert PIR_WARNING not in err
    assert err == ("before\nW1204 04:15:11.3 28360 other.cc:1] another glog warning\n"
                   "a line of Python's (sys.stderr writes to fd 2 outside pytest's capture)\nafter\n")
    with pytest.raises(RuntimeError), dropping_stderr_lines([PIR_OUT_TENSOR_WARNING]):
        os.write(2, b"said before the error\n")
        raise RuntimeError("boom")
    assert capfd.readouterr().err == "said before the error\n"  # kept when the block raises


# ---- c: the depthwise emulation's NaN of an overflowing step ----------------------------------
def test_depthwise_emulation_gives_nan_for_inf_minus_inf_without_a_runtime_warning():
    from zoo.amp.depthwise import Geometry, filter_grad_np, forward_np, input_grad_np

    rng = np.random.default_rng(3)
    x = (rng.normal(size=(2, 2, 5, 40)) * 30).astype(np.float32)
    dy = (rng.normal(size=(2, 2, 5, 40)) * 30).astype(np.float32)
    dy[0, 0, 0, :3], dy[0, 0, 1, :3] = np.inf, -np.inf  # an overflowed gradient, both signs
    w = rng.normal(size=(2, 1, 3, 3)).astype(np.float32)
    g = Geometry(x.shape, w.shape, [1, 1], (1, 1, 1, 1), [1, 1])
    x_inf = x.copy()
    x_inf[0, 0, 2, 2], x_inf[0, 0, 2, 3] = np.inf, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would fail here
        dw = filter_grad_np(dy, x, g, "float16")
        dx = input_grad_np(dy, w, g, "float16")
        y = forward_np(x_inf, w, g, "float16")
    # NaN where fp16 on the GPU gives NaN (the scaler then skips the step); finite elsewhere
    assert np.isnan(dw[0]).all() and np.isfinite(dw[1]).all()
    assert np.isnan(dx[0, 0]).any() and np.isfinite(dx[1]).all()
    assert np.isnan(y[0, 0]).any() and np.isfinite(y[1]).all()


# ---- d: log records while a bar is drawn --------------------------------------------------------
class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_records_and_plain_lines_are_written_through_tqdm_while_a_bar_is_drawn():
    term = _Terminal()
    root = logging.getLogger()
    console = logging.StreamHandler(term)
    console.setFormatter(logging.Formatter("[%(name)s][%(levelname)s] - %(message)s"))
    root.addHandler(console)
    try:
        bar = Progress(total=5, desc="train", stream=term, every=0)
        bar.update(1)
        assert console not in root.handlers  # swapped while the bar is live
        logging.getLogger("zoo.engine.trainer").warning("the loss scale fell below 1")
        write_line("warning: a plain line", term)
        bar.update(1)
        bar.close()
        assert console in root.handlers and len([h for h in root.handlers if getattr(h, "stream", None) is term]) == 1
        logging.getLogger("zoo.engine.trainer").warning("after the bar")
    finally:
        root.removeHandler(console)
    text = term.getvalue()
    for line in ("[zoo.engine.trainer][WARNING] - the loss scale fell below 1", "warning: a plain line"):
        before = text[:text.index(line)]
        # the bar was cleared first: what precedes the line on its row is blanks after a carriage return
        assert re.search(r"\r *\r$", before), repr(before[-80:])
        assert text[text.index(line) + len(line)] == "\n"
    assert text.endswith("[zoo.engine.trainer][WARNING] - after the bar\n")


# ---- e: what the README writes into the checkout ------------------------------------------------
@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_readme_output_folders_are_ignored_and_zoo_deploy_is_not():
    readme = (ROOT / "README.md").read_text()
    assert "export.out_dir=deploy/" in readme and "photos photos/" in readme

    def ignored(path):
        return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0

    for path in ("deploy/db_det/inference.json", "photos/a.jpg", "outputs/x/summary.json", "multirun/x/y"):
        assert ignored(path), path
    for path in ("zoo/deploy/check.py", "tests/test_deploy_check.py"):
        assert not ignored(path), path


# ---- f + g: the skipped steps themselves, and a resumed log equal to an uninterrupted one -------
SKIPPING = ["trainer.max_steps=6", "trainer.ckpt_every=2", "trainer.log_every=3", "seed=2", "amp=O1",
            "amp.init_loss_scaling=1e12", "amp.decr_ratio=1e-4"]  # steps 1 and 2 overflow: skipped


def _deterministic(recs):
    return [{k: v for k, v in r.items() if k not in ("time", "images_per_s")} for r in recs]


def test_skipped_steps_are_logged_and_a_resumed_log_equals_an_uninterrupted_one(tiny_cfg, tmp_path, monkeypatch):
    from test_resume_auto import _killed

    from zoo.report.render import skip_marks

    full = train(tiny_cfg(*SKIPPING), tmp_path / "full")
    recs = read_metrics(tmp_path / "full" / "metrics.jsonl", "train")
    assert [r["step"] for r in recs] == [3, 6] and recs[0]["skipped_steps"] == 2 and "window_steps" not in recs[0]
    # the plot's marks: the skipped steps 1 and 2 themselves (not log step 3), at the scale each lowered to
    guard = read_metrics(tmp_path / "full" / "metrics.jsonl", "guard")
    assert skip_marks(recs, guard) == [(1, pytest.approx(1e8, rel=1e-6)), (2, pytest.approx(1e4, rel=1e-6))]

    runs = tmp_path / "runs"
    monkeypatch.setattr("test_resume_auto.RUN", SKIPPING)
    _killed(tiny_cfg, monkeypatch, runs / "a", 3)  # checkpoint of step 2: steps 1-2 of the first window
    resumed = train(tiny_cfg(*SKIPPING, "trainer.resume=auto"), runs / "b")
    assert resumed["param_digests"] == full["param_digests"]
    assert _deterministic(read_metrics(runs / "b" / "metrics.jsonl", "train")) == _deterministic(recs)


def test_a_checkpoint_without_the_window_says_the_first_line_averages_fewer_steps(tiny_cfg, tmp_path, monkeypatch):
    from test_resume_auto import _killed

    from zoo.engine import checkpoint as ckpt

    runs = tmp_path / "runs"
    monkeypatch.setattr("test_resume_auto.RUN", SKIPPING)
    _killed(tiny_cfg, monkeypatch, runs / "a", 3)
    last = runs / "a" / "checkpoints" / ckpt.LAST
    state = ckpt.load(last)
    del state["log_window"]  # as written before the window was checkpointed
    ckpt.atomic_save(state, last)
    train(tiny_cfg(*SKIPPING, "trainer.resume=auto"), runs / "b")
    recs = read_metrics(runs / "b" / "metrics.jsonl", "train")
    assert recs[0]["step"] == 3 and recs[0]["window_steps"] == 1 and "window_steps" not in recs[1]


def test_the_loss_scale_plot_marks_the_skipped_steps_and_reads_logs_without_guard_lines_as_before():
    from zoo.report.render import skip_marks

    train_recs = [{"step": 10, "loss_scale": 8.0, "skipped_steps": 2}, {"step": 20, "loss_scale": 8.0, "skipped_steps": 2},
                  {"step": 30, "loss_scale": 4.0, "skipped_steps": 3}]
    guard = [{"step": 3, "event": "skipped_step", "loss_scale": 16.0},
             {"step": 7, "event": "skipped_step", "loss_scale": 8.0},
             {"step": 25, "event": "loss_scale_below_floor", "loss_scale": 4.0},
             {"step": 26, "event": "skipped_step", "loss_scale": 4.0}]
    assert skip_marks(train_recs, guard) == [(3, 16.0), (7, 8.0), (26, 4.0)]
    assert skip_marks(train_recs, []) == [(10, 8.0), (30, 4.0)]  # the window's log step: all such a log knows
