"""The AMP component: validation, honest precision resolution, and FP32 equivalence when off."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from zoo.amp import Amp, AmpConfigError, AmpUnsupportedError, DeviceInfo, current_device

CPU = DeviceInfo("cpu", "cpu")
A100 = DeviceInfo("gpu", "gpu:0 (A100, sm80)", (8, 0))
T4 = DeviceInfo("gpu", "gpu:0 (T4, sm75)", (7, 5))
P100 = DeviceInfo("gpu", "gpu:0 (P100, sm60)", (6, 0))


@pytest.mark.parametrize("kwargs, key", [
    ({"level": "O3"}, "amp.level"),
    ({"dtype": "float8"}, "amp.dtype"),
    ({"on_unsupported": "ignore"}, "amp.on_unsupported"),
    ({"init_loss_scaling": -1}, "amp.init_loss_scaling"),
    ({"incr_ratio": 0.5}, "amp.incr_ratio"),
    ({"decr_ratio": 1.5}, "amp.decr_ratio"),
    ({"incr_every_n_steps": 0}, "amp.incr_every_n_steps"),
    ({"custom_black_list": [3]}, "amp.custom_black_list"),
])
def test_bad_amp_values_name_the_key(kwargs, key):
    with pytest.raises(AmpConfigError, match=key):
        Amp(enabled=True, **kwargs)


def test_capability_rules():
    assert CPU.supports("float16")[0] is False
    assert A100.supports("bfloat16")[0] and A100.supports("float16")[0]
    assert T4.supports("float16")[0] and not T4.supports("bfloat16")[0]
    assert not P100.supports("float16")[0]
    assert "7.0" in P100.supports("float16")[1]
    assert current_device().kind == paddle.device.get_device().split(":")[0]


def test_requested_vs_effective_on_cpu_is_recorded_not_hidden():
    amp = Amp(name="O1", enabled=True, level="O1", dtype="float16", on_unsupported="fp32")
    assert amp.resolve(CPU) == "fp32"
    assert amp.requested == "fp16-O1" and amp.effective == "fp32" and not amp.active
    line = amp.describe(CPU)
    assert "requested fp16-O1" in line and "effective fp32" in line and "on_unsupported=fp32" in line


def test_on_unsupported_error_refuses_and_emulate_is_the_default():
    with pytest.raises(AmpUnsupportedError, match="on_unsupported=error"):
        Amp(enabled=True, level="O2", on_unsupported="error").resolve(CPU)
    assert Amp(enabled=True, dtype="bfloat16").resolve(CPU) == "emulated-bf16-O1"
    # A GPU that can run the precision uses Paddle's AMP; emulation is only for devices that cannot.
    assert Amp(enabled=True).resolve(T4) == "fp16-O1"
    assert Amp(enabled=True).resolve(P100) == "emulated-fp16-O1"
    # On hardware that supports the request, on_unsupported plays no part.
    assert Amp(enabled=True, dtype="bfloat16", on_unsupported="error").resolve(A100) == "bf16-O1"
    with pytest.raises(AmpUnsupportedError, match="8.0"):
        Amp(enabled=True, dtype="bfloat16", on_unsupported="error").resolve(T4)


def test_fp32_and_level_O0_mean_amp_off():
    assert Amp(enabled=False).requested == "fp32"
    assert Amp(enabled=True, level="O0").requested == "fp32"


def _train(use_amp: Amp | None, steps=4):
    """A few SGD steps of a small conv net, through the Amp calls or as a bare Paddle loop."""
    paddle.seed(7)
    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3), paddle.nn.BatchNorm2D(8), paddle.nn.ReLU(),
                               paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Flatten(), paddle.nn.Linear(8, 5))
    opt = paddle.optimizer.Momentum(0.05, parameters=net.parameters(), weight_decay=1e-4)
    if use_amp is not None:
        net, opt = use_amp.setup(net, opt, CPU)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x = paddle.to_tensor(rng.normal(size=(4, 3, 12, 12)).astype("float32"))
        y = paddle.to_tensor(rng.integers(0, 5, size=(4,)))
        if use_amp is None:
            loss = paddle.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        else:
            with use_amp.autocast():
                loss = paddle.nn.functional.cross_entropy(net(x), y)
            use_amp.backward(loss)
            assert use_amp.step(opt) is True
        opt.clear_grad()
        losses.append(float(loss))
    return losses, {k: v.numpy() for k, v in net.state_dict().items()}


@pytest.mark.parametrize("amp", [Amp(enabled=False), Amp(name="O1", enabled=True, on_unsupported="fp32"),
                                 Amp(name="O2", enabled=True, level="O2", on_unsupported="fp32")],
                         ids=["fp32", "O1-on-cpu-as-fp32", "O2-on-cpu-as-fp32"])
def test_amp_off_equals_plain_fp32_bit_for_bit(amp):
    ref_losses, ref_state = _train(None)
    losses, state = _train(amp)
    assert losses == ref_losses
    for k in ref_state:
        np.testing.assert_array_equal(state[k], ref_state[k], err_msg=k)
    assert amp.effective == "fp32" and amp.loss_scale is None and amp.skipped_steps == 0


def test_state_dict_refuses_other_precision():
    a = Amp(enabled=False)
    a.resolve(CPU)
    state = a.state_dict()
    b = Amp(enabled=True)
    b.effective = "fp16-O1"  # as it would be on a GPU
    with pytest.raises(AmpConfigError, match="effective precision fp32"):
        b.set_state_dict(state)


@pytest.mark.gpu
@pytest.mark.skipif(not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0,
                    reason="needs a CUDA GPU: Paddle's GradScaler is disabled on CPU")
def test_gpu_scaler_state_round_trip():
    amp = Amp(name="O1", enabled=True, init_loss_scaling=1024.0, incr_every_n_steps=3)
    net = paddle.nn.Linear(4, 4)
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    net, opt = amp.setup(net, opt, current_device())
    for _ in range(4):
        with amp.autocast():
            loss = net(paddle.ones([2, 4])).mean()
        amp.backward(loss)
        amp.step(opt)
        opt.clear_grad()
    state = amp.state_dict()
    other = Amp(name="O1", enabled=True)
    other.setup(paddle.nn.Linear(4, 4), paddle.optimizer.SGD(0.1, parameters=net.parameters()),
                current_device())
    other.set_state_dict(state)
    assert other.loss_scale == amp.loss_scale == 2048.0
    assert other.scaler.state_dict()["incr_count"] == amp.scaler.state_dict()["incr_count"]
