"""Numerics guard and loss-scale dynamics through the real engine under emulated fp16."""
from __future__ import annotations

import json

import numpy as np
import paddle
import pytest

from zoo.amp import Amp, DeviceInfo
from zoo.amp.numerics_guard import NumericsGuard, NumericsGuardStop
from zoo.engine import checkpoint as ckpt
from zoo.engine.metrics_log import read_metrics
from zoo.diagnostics.nonfinite_step import locate_and_describe
from zoo.engine.run import GuardStopped, train

HUGE = f"amp.init_loss_scaling={2.0**40}"


def test_absurd_loss_scale_skips_then_trains_normally(tiny_cfg, tmp_path):
    summary = train(tiny_cfg("amp=O1", HUGE, "trainer.max_steps=40"), tmp_path)
    recs = read_metrics(tmp_path / "metrics.jsonl", "train")
    scales = [r["loss_scale"] for r in recs]
    skipped = [r["skipped_steps"] for r in recs]
    assert scales[0] < 2.0**40 and scales[-1] <= 2.0**20  # halved on each overflow
    assert all(b <= a for a, b in zip(scales, scales[1:]) if a > 2.0**20)
    assert skipped[-1] == summary["skipped_steps"] >= 15
    assert skipped[-1] == skipped[-5]  # the last steps were taken: training proceeds normally
    assert np.isfinite([r["loss"] for r in recs[-5:]]).all()
    guard = read_metrics(tmp_path / "metrics.jsonl", "guard")
    assert len(guard) == summary["skipped_steps"] and guard[0]["event"] == "skipped_step"
    assert guard[0]["nonfinite_grads"]  # names the parameters with inf/nan gradients
    assert summary["final_loss_scale"] == scales[-1] and summary["guard_event_count"] == len(guard)


def test_consecutive_skips_stop_with_checkpoint_and_names(tiny_cfg, tmp_path):
    # A static scale never calibrates, so every skip counts (a dynamic one from 2^40 would be
    # calibrating: see test_calibration_from_an_absurd_scale_is_not_a_failure).
    cfg = tiny_cfg("amp=O1", HUGE, "amp.use_dynamic_loss_scaling=false", "trainer.max_steps=20",
                   "amp.guard.max_consecutive_skips=3")
    with pytest.raises(GuardStopped, match="3 consecutive steps skipped") as err:
        train(cfg, tmp_path)
    assert "non-finite gradients in:" in str(err.value) and "checkpoint saved" in str(err.value)
    assert "python tools/amp_doctor.py model=resnet_tiny amp=O1" in str(err.value)
    assert err.value.exit_status == 3
    assert ckpt.load(tmp_path / "checkpoints" / ckpt.LAST)["step"] == 3
    assert read_metrics(tmp_path / "metrics.jsonl", "guard")[-1]["consecutive"] == 3
    summary = json.loads((tmp_path / "summary.json").read_text())  # docs/bad_input.md: exit 3 + summary.json
    assert summary["status"] == "stopped_by_guard" and summary["steps"] == 3 and summary["skipped_steps"] == 3
    assert summary["all_steps_skipped"] and summary["primary_metric"]["value"] is None
    assert "3 consecutive steps skipped" in summary["stop_reason"]


def test_loss_scale_floor_stops_when_asked(tiny_cfg, tmp_path):
    cfg = tiny_cfg("amp=O1", HUGE, "trainer.max_steps=20", f"amp.guard.min_loss_scale={2.0**39}",
                   "amp.guard.on_min_loss_scale=stop")
    with pytest.raises(GuardStopped, match="fell below amp.guard.min_loss_scale"):
        train(cfg, tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "stopped_by_guard"


def test_fp16_stops_at_the_floor_by_default_and_warn_says_so_in_the_closing_line(tiny_cfg, tmp_path):
    """Below amp.guard.min_loss_scale fp16 training is lost (an O2 fine-tune went on at 7e-9 to hmean 0,
    issue 36): O1/O2 stop there unless told to warn, and a run that only warned says in its closing
    line where the scale fell, how long it stayed there and how low it went."""
    from omegaconf import OmegaConf

    from zoo.engine.run import result_line

    floor = f"amp.guard.min_loss_scale={2.0**30}"  # the dynamic scale from 2^40 passes under it calibrating
    for level in ("O1", "O2"):
        assert OmegaConf.load(f"configs/amp/{level}.yaml").guard.on_min_loss_scale == "stop"
    with pytest.raises(GuardStopped, match="fell below amp.guard.min_loss_scale"):
        train(tiny_cfg("amp=O1", HUGE, "trainer.max_steps=30", floor), tmp_path / "stop")
    summary = train(tiny_cfg("amp=O1", HUGE, "trainer.max_steps=30", floor, "amp.guard.on_min_loss_scale=warn"),
                    tmp_path / "warn")
    below = summary["loss_scale_below_floor"]
    scales = [r["loss_scale"] for r in read_metrics(tmp_path / "warn" / "metrics.jsonl", "train")]
    assert below["floor"] == 2.0**30 and below["lowest"] == min(scales)
    assert below["steps"] == 30 - below["first_step"] + 1  # it never came back above the floor
    line = result_line(summary, 30)
    assert (f"the loss scale fell below amp.guard.min_loss_scale={2.0**30:g} at step {below['first_step']} and "
            f"stayed under it for {below['steps']} steps, down to {below['lowest']:g}") in line
    assert f"{summary['skipped_steps']} steps skipped" in line
    unevaluated = dict(summary, primary_metric={"name": "top1", "value": None})  # trainer.final_eval=false
    assert result_line(unevaluated, 30).endswith(line[line.index("; the loss scale"):])
    quiet = train(tiny_cfg("amp=O1", "trainer.max_steps=4"), tmp_path / "quiet")
    assert quiet["loss_scale_below_floor"] is None and "loss scale" not in result_line(quiet, 4)


def test_first_nonfinite_layer_is_named():
    conv = paddle.nn.Conv2D(1, 1, 1, bias_attr=False)
    conv.weight.set_value(paddle.full([1, 1, 1, 1], 2.0))
    net = paddle.nn.Sequential(paddle.nn.ReLU(), conv, paddle.nn.BatchNorm2D(1))
    guard = NumericsGuard(find_nonfinite_layer=True)
    guard.attach(net)
    amp = Amp(name="O1", enabled=True)
    amp.resolve(DeviceInfo("cpu", "cpu"))
    guard.before_step()
    with amp.autocast():
        net(paddle.full([1, 1, 2, 2], 40000.0))  # conv output 80000: inf in fp16
    events = guard.after_step(1, False, 1.0, ["1.weight"])
    assert events[0]["first_nonfinite_layer"] == "1 (Conv2D)"


def test_guard_rejects_bad_settings():
    with pytest.raises(ValueError, match="amp.guard.on_min_loss_scale"):
        NumericsGuard(on_min_loss_scale="panic")
    with pytest.raises(ValueError, match="amp.guard.max_consecutive_skips"):
        NumericsGuard(max_consecutive_skips=-1)


def test_calibration_from_an_absurd_scale_is_not_a_failure(tiny_cfg, tmp_path):
    """1e30 needs ~85 halvings to reach a usable scale; the guard must let it get there."""
    cfg = tiny_cfg("amp=O1", "amp.init_loss_scaling=1e30", "trainer.max_steps=100",
                   "amp.guard.max_consecutive_skips=10", "trainer.ckpt_every=1000", "trainer.log_every=10")
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["steps"] == 100
    assert 80 <= summary["skipped_steps"] < 100 and summary["final_loss_scale"] <= 65536.0
    guard = read_metrics(tmp_path / "metrics.jsonl", "guard")
    assert guard[0].get("calibrating") and guard[0]["consecutive"] == 0


def test_guard_stops_paddleocr_static_scale_setup_on_db(tiny_cfg, tmp_path):
    """PaddleOCR's use_amp O2: no black list, static scale 1.0: DB's exp overflows every step."""
    cfg = tiny_cfg("model=db_det_tiny", "amp=O2", "amp.custom_black_list=[]",
                   "amp.use_dynamic_loss_scaling=false", "amp.init_loss_scaling=1.0",
                   "amp.guard.max_consecutive_skips=3", "trainer.max_steps=8", "model.batch_size=2",
                   "data.builder.num_train=16", "data.builder.num_val=4", "model.eval_batch_size=4")
    with pytest.raises(GuardStopped, match="3 consecutive steps skipped") as err:
        train(cfg, tmp_path, locate_nonfinite=locate_and_describe)
    # the cause, not the first parameters in model order: exp's fp16 output overflows in the head,
    # and its backward (computed from that inf) is where the NaN gradients start
    assert "first non-finite output in the forward: head:exp (DBHead)" in str(err.value)
    origin = json.loads((tmp_path / "summary.json").read_text())["nonfinite_origin"]
    assert origin["forward"] == {"op": "head:exp", "layer_type": "DBHead"}
    assert origin["backward"]["layer_type"] == "DBHead"


def test_locate_finds_a_backward_only_overflow():
    """Forward finite, gradient beyond fp16: the first non-finite gradient is named, the forward is clean."""
    amp = Amp(name="O1", enabled=True, use_dynamic_loss_scaling=False, init_loss_scaling=1.0)
    lin = paddle.nn.Linear(4, 4, bias_attr=False)  # its output stays fp16 (no fp32 bias to promote it)
    amp.setup(lin, paddle.optimizer.SGD(0.1, parameters=lin.parameters()), DeviceInfo("cpu", "cpu"))
    x = paddle.full([2, 4], 1.0)

    def forward():
        with amp.autocast():
            y = lin(x)
        return y.astype("float32").sum() * 1e6  # gradient 1e6 into the fp16 matmul output

    found, said = locate_and_describe(lin, forward, lambda loss: loss.backward())
    assert found["forward"] is None and found["backward"] is not None
    assert "first non-finite gradient in the backward" in said


def test_paddle_skip_print_is_silenced_and_the_console_is_rate_limited(capsys, caplog):
    guard = NumericsGuard(max_consecutive_skips=0, console_every_s=3600)
    for step in range(1, 21):
        guard.after_step(step, False, 2.0 ** (30 - step), ["w"])
    warned = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warned) == NumericsGuard.CONSOLE_FIRST and len(guard.events) == 20
    amp = Amp(name="O1", enabled=True, init_loss_scaling=2.0**40)
    lin = paddle.nn.Linear(2, 1)
    opt = paddle.optimizer.SGD(0.1, parameters=lin.parameters())
    lin, opt = amp.setup(lin, opt, DeviceInfo("cpu", "cpu"))
    with amp.autocast():
        loss = lin(paddle.full([1, 2], float("inf"))).mean()
    amp.backward(loss)
    assert amp.step(opt) is False
    assert "Found inf or nan" not in capsys.readouterr().out
