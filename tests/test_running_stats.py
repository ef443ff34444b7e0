"""A step the loss scaler skips also drops the BatchNorm running statistics its forward wrote.

Issue 36: the mobile det's fp16 O1 parity run (seed 3) evaluated to hmean 0 because one skipped
step's overflowing forward had written NaN into two head BatchNorms' running statistics. The
references here are NumPy copies of the statistics taken outside the zoo's code, and BatchNorm's
own update rule (momentum 0.9) computed in NumPy from the layer's input.
"""
from __future__ import annotations

import json

import numpy as np
import paddle
import pytest

from zoo.amp.numerics_guard import NumericsGuard
from zoo.amp.running_stats import RunningStats, nonfinite_stats, stat_layers
from zoo.engine import trainer as trainer_mod
from zoo.engine.metrics_log import read_metrics
from zoo.engine.run import result_line, train
from zoo.utils import distributed as dist

POISONED = 3  # the train-mode forward (1-based) whose first BatchNorm input is made non-finite


def _stats(layer) -> tuple[np.ndarray, np.ndarray]:
    return layer._mean.numpy().copy(), layer._variance.numpy().copy()


@pytest.fixture
def planted(monkeypatch):
    """Every Trainer built in the test gets, on its first BatchNorm, a pre-hook that turns the input
    of train-mode forward number POISONED into inf (the overflow of a fp16 conv before it), and a
    record of that layer's statistics before and after each step plus its inputs."""
    seen = {"steps": [], "inputs": []}
    init, step = trainer_mod.Trainer.__init__, trainer_mod.Trainer.train_step

    def patched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        name, bn = stat_layers(dist.unwrap(self.model))[0]
        seen["name"], seen["layer"], seen["calls"] = name, bn, 0

        def pre(layer, inputs):
            if not layer.training:
                return None
            seen["calls"] += 1
            x = inputs[0]
            if seen["calls"] == POISONED:
                x = x * float("inf")  # every value +-inf (or nan where the input was 0)
            seen["inputs"].append(x.astype("float32").numpy().copy())
            return (x,)
        bn.register_forward_pre_hook(pre)

    def patched_step(self, batch):
        before = _stats(seen["layer"])
        out = step(self, batch)
        seen["steps"].append((before, _stats(seen["layer"]), out[1]))
        return out

    monkeypatch.setattr(trainer_mod.Trainer, "__init__", patched_init)
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", patched_step)
    return seen


def _momentum_update(before, x, momentum=0.9):
    """BatchNorm's running-statistics update, in NumPy (Paddle: unbiased=False batch variance)."""
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    return momentum * before[0] + (1 - momentum) * mean, momentum * before[1] + (1 - momentum) * var


def test_the_skipped_steps_statistics_are_the_ones_before_it(tiny_cfg, tmp_path, planted):
    summary = train(tiny_cfg("amp=O1", "trainer.max_steps=5"), tmp_path)
    steps = planted["steps"]
    assert len(steps) == 5 and summary["skipped_steps"] == 1
    for i, (before, after, stepped) in enumerate(steps, start=1):
        if i == POISONED:  # skipped, and the statistics are bit for bit those before it
            assert not stepped
            np.testing.assert_array_equal(after[0], before[0])
            np.testing.assert_array_equal(after[1], before[1])
        else:  # taken: BatchNorm's own momentum update from this step's input
            assert stepped
            mean, var = _momentum_update(before, planted["inputs"][i - 1])
            np.testing.assert_allclose(after[0], mean, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(after[1], var, rtol=1e-4, atol=1e-5)
    name = planted["name"]
    event = [e for e in read_metrics(tmp_path / "metrics.jsonl", "guard") if e["event"] == "nonfinite_running_stats"]
    assert [(e["step"], e["layers"], e["restored"], e["stepped"]) for e in event] == [(POISONED, [name], True, False)]
    assert summary["nonfinite_running_stats"] == {"steps": 1, "layers": [name], "restored": True}
    assert f"left non-finite BatchNorm running statistics ({name}), restored" in result_line(summary, 5)
    weights = paddle.load(str(tmp_path / "checkpoints" / "best.pdparams"))
    assert all(np.isfinite(v.numpy()).all() for v in weights.values())
    assert not any("nonfinite_running_stats" in r for r in read_metrics(tmp_path / "metrics.jsonl", "eval"))


def test_without_the_restore_the_statistics_stay_poisoned_and_every_line_says_so(tiny_cfg, tmp_path, planted):
    """amp.guard.restore_running_stats=false is Paddle's behaviour: the control for the test above."""
    summary = train(tiny_cfg("amp=O1", "trainer.max_steps=5", "amp.guard.restore_running_stats=false"), tmp_path)
    before, after, stepped = planted["steps"][POISONED - 1]
    assert not stepped and not np.isfinite(after[0]).any() and not np.isfinite(after[1]).all()
    name = planted["name"]
    assert summary["nonfinite_running_stats"] == {"steps": 1, "layers": [name], "restored": False}
    line = result_line(summary, 5)
    assert f"({name}), KEPT (amp.guard.restore_running_stats=false), so the evaluation used them" in line
    evals = read_metrics(tmp_path / "metrics.jsonl", "eval")
    assert evals and evals[-1]["nonfinite_running_stats"][0] == name


def test_a_step_that_moved_the_parameters_but_left_a_statistic_nonfinite_is_restored_too():
    """An op such as DBHead's fix_nan can hide the overflow from the gradients: finite gradients, a
    step taken, NaN in the running statistics. They go back to the copy and are named."""
    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4), paddle.nn.ReLU(),
                               paddle.nn.Conv2D(4, 2, 1), paddle.nn.BatchNorm2D(2))
    keep = RunningStats(net)
    assert [n for n, _ in keep.layers] == ["1", "4"]
    ref = {n: _stats(layer) for n, layer in keep.layers}
    keep.snapshot()
    net[4]._variance.set_value(paddle.to_tensor([1.0, float("nan")]))
    net[1]._mean.set_value(paddle.to_tensor([1.0, 2.0, 3.0, 4.0]))  # finite: a normal update
    assert nonfinite_stats(net) == ["4"]
    assert keep.after_step(stepped=True) == ["4"]
    for n, layer in keep.layers:  # all restored, the finite change too: one step, one copy
        np.testing.assert_array_equal(_stats(layer)[0], ref[n][0])
        np.testing.assert_array_equal(_stats(layer)[1], ref[n][1])
    keep.snapshot()
    net[1]._mean.set_value(paddle.to_tensor([1.0, 2.0, 3.0, 4.0]))
    assert keep.after_step(stepped=True) == []  # a normal step keeps its update
    np.testing.assert_array_equal(net[1]._mean.numpy(), [1.0, 2.0, 3.0, 4.0])
    assert keep.summary() == {"steps": 1, "layers": ["4"], "restored": True}
    with pytest.raises(RuntimeError, match="without snapshot"):
        keep.after_step(stepped=True)


def test_the_guard_names_the_layers_and_checks_its_setting(caplog):
    guard = NumericsGuard()
    with caplog.at_level("WARNING"):
        events = guard.after_step(7, False, 1024.0, ["w"], ["head.binarize.conv_bn1", "head.thresh.conv_bn1"])
    assert events[0] == {"step": 7, "event": "nonfinite_running_stats", "restored": True, "stepped": False,
                         "layers": ["head.binarize.conv_bn1", "head.thresh.conv_bn1"]}
    assert "step 7: a skipped step left non-finite BatchNorm running statistics in head.binarize.conv_bn1, " \
           "head.thresh.conv_bn1; restored to the step before" in caplog.text
    with pytest.raises(ValueError, match="amp.guard.restore_running_stats: expected true or false"):
        NumericsGuard(restore_running_stats="yes")
    json.dumps(events)  # metrics.jsonl takes them as they are


@pytest.mark.gpu
@pytest.mark.skipif(not (paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0),
                    reason="needs a CUDA GPU: Paddle's own GradScaler skips the step there")
def test_on_a_gpu_paddles_gradscaler_skip_is_dropped_whole_too(tiny_cfg, tmp_path, planted):
    summary = train(tiny_cfg("amp=O1", "amp.on_unsupported=error", "trainer.max_steps=5"), tmp_path)
    assert summary["effective_precision"] == "fp16-O1"  # real AMP, not the emulation
    before, after, stepped = planted["steps"][POISONED - 1]
    assert not stepped
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])
    assert summary["nonfinite_running_stats"]["layers"] == [planted["name"]]
