"""CPU emulation of fp16/bf16 AMP numerics: it must change the numbers the way a GPU would."""
from __future__ import annotations

import numpy as np
import paddle

from zoo.amp import Amp, DeviceInfo
from zoo.amp.emulation import Emulation, is_low, round_to

CPU = DeviceInfo("cpu", "cpu")


def _amp(level="O1", dtype="float16", **kw):
    amp = Amp(name="x", enabled=True, level=level, dtype=dtype, on_unsupported="emulate", **kw)
    amp.resolve(CPU)
    return amp


def test_effective_precision_is_named_emulated():
    assert _amp().effective == "emulated-fp16-O1"
    assert _amp("O2", "bfloat16").effective == "emulated-bf16-O2"
    assert "emulate" in _amp().describe(CPU)


def test_round_trip_matches_ieee_half_and_bfloat16():
    x = paddle.to_tensor(np.array([1.0 + 2**-11, 70000.0, 1e-8, 65504.0, 3.0e38], np.float32))
    half = round_to(x, "float16").numpy()
    assert half[0] == 1.0 and np.isinf(half[1]) and half[2] == 0.0 and half[3] == 65504.0
    assert np.isinf(half[4])
    bf = round_to(x, "bfloat16").numpy()
    # bf16 keeps fp32's range (no overflow at 70000 or 3e38) but only 8 significant bits.
    assert np.isfinite(bf[1]) and np.isfinite(bf[4]) and bf[2] != 0.0
    assert bf[1] == 70144.0 and bf[0] == 1.0
    np.testing.assert_array_equal(half, x.numpy().astype(np.float16).astype(np.float32))


def test_white_listed_conv_overflows_to_inf_and_the_step_is_skipped():
    paddle.seed(0)
    conv = paddle.nn.Conv2D(1, 1, 1, bias_attr=False)
    conv.weight.set_value(paddle.full([1, 1, 1, 1], 2.0))
    net = paddle.nn.Sequential(conv, paddle.nn.BatchNorm2D(1))
    x = paddle.full([1, 1, 2, 2], 40000.0)  # 2 * 40000 = 80000 > 65504
    amp = _amp(init_loss_scaling=1.0)
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    net, opt = amp.setup(net, opt, CPU)
    with amp.autocast():
        y = conv(x)
    assert np.isinf(y.numpy()).all() and is_low(y)
    with paddle.no_grad():
        assert np.isfinite(conv(x).numpy()).all()  # the same conv outside emulation: fp32, finite
    before = conv.weight.numpy().copy()
    with amp.autocast():
        loss = net(x).mean()  # BatchNorm of inf gives NaN, as it would on a GPU
    amp.backward(loss)
    assert amp.step(opt) is False and amp.skipped_steps == 1
    np.testing.assert_array_equal(conv.weight.numpy(), before)
    assert amp.loss_scale == 0.5  # decr_ratio 0.5 after one overflow


def test_scaled_gradient_overflow_is_caught_in_the_backward():
    conv = paddle.nn.Conv2D(1, 1, 1, bias_attr=False)
    amp = _amp(init_loss_scaling=2.0**20)  # gradient 2^20 at the conv output: beyond fp16
    opt = paddle.optimizer.SGD(0.1, parameters=conv.parameters())
    conv, opt = amp.setup(conv, opt, CPU)
    with amp.autocast():
        loss = conv(paddle.ones([1, 1, 2, 2])).sum()
    amp.backward(loss)
    assert np.isinf(conv.weight.grad.numpy()).any()
    assert amp.step(opt) is False and amp.loss_scale == 2.0**19


def test_o1_promote_rule_and_black_list():
    emu = Emulation("O1", "float16")
    x = paddle.full([1, 1, 4, 4], 3.0)
    conv = paddle.nn.Conv2D(1, 1, 1)
    conv.weight.set_value(paddle.ones([1, 1, 1, 1]))
    with emu():
        y = paddle.nn.functional.conv2d(x, conv.weight)  # white: low precision
        relu = paddle.nn.functional.relu(y)  # gray, low input: follows it
        with_bias = y + paddle.full([1], 1.0 + 2**-12)  # gray with an fp32 input: promoted
        e = paddle.exp(y)  # exp is on Paddle's fp16 O1 black list: fp32
    assert is_low(y) and is_low(relu) and not is_low(with_bias) and not is_low(e)
    # 3 + (1 + 2^-12) kept in fp32; fp16 (ulp 2^-8 at 4) would have rounded it to 4.
    assert with_bias.numpy().flat[0] == np.float32(4.0 + 2**-12)


def test_custom_black_list_keeps_an_op_fp32_under_o2():
    x = round_to(paddle.full([4], 20.0), "float16")  # an fp16 activation, as after a conv at O2
    with Emulation("O2", "float16")():
        overflowed = paddle.exp(x)  # exp(20) = 4.9e8: O2 runs exp in fp16 on an fp16 input
    with Emulation("O2", "float16", custom_black_list=["exp"])():
        kept = paddle.exp(x)
    assert np.isinf(overflowed.numpy()).all() and np.isfinite(kept.numpy()).all()


def test_auto_cast_disabled_region_is_fp32_inside_emulation():
    x = round_to(paddle.full([4], 20.0), "float16")
    with Emulation("O2", "float16")():
        with paddle.amp.auto_cast(enable=False):
            inside = paddle.exp(x)
    assert np.isfinite(inside.numpy()).all()


def _tiny_grad(scale: float) -> np.ndarray:
    """Gradient of a linear layer's weight for a loss whose true gradient is ~1e-8 (fp16 underflow)."""
    lin = paddle.nn.Linear(4, 1, bias_attr=False)
    lin.weight.set_value(paddle.ones([4, 1]))
    amp = _amp(init_loss_scaling=scale, use_dynamic_loss_scaling=False)
    opt = paddle.optimizer.SGD(0.0, parameters=lin.parameters())
    lin, opt = amp.setup(lin, opt, CPU)
    with amp.autocast():
        loss = lin(paddle.ones([1, 4])).sum() * 1e-8
    amp.backward(loss)
    amp.scaler.unscale_(opt)
    return lin.weight.grad.numpy()


def test_tiny_gradients_underflow_without_scaling_and_survive_with_it():
    assert (_tiny_grad(1.0) == 0).all()  # 1e-8 < fp16's smallest subnormal (6e-8): flushed
    np.testing.assert_allclose(_tiny_grad(65536.0), 1e-8, rtol=2e-3)


def _reference_scale_trajectory(finite, init, incr_ratio, decr_ratio, incr_n, decr_n):
    """GradScaler's documented rule, written independently: returns (scales after update, skipped)."""
    scale, good, bad, out = init, 0, 0, []
    for ok in finite:
        if ok:
            bad, good = 0, good + 1
            if good == incr_n:
                scale, good = scale * incr_ratio, 0
        else:
            good, bad = 0, bad + 1
            if bad == decr_n:
                scale, bad = scale * decr_ratio, 0
        out.append((scale, not ok))
    return out


def test_scripted_overflow_sequence_follows_gradscaler_rule():
    finite = [True, True, True, False, True, False, False, True, True, True, True]
    args = dict(init_loss_scaling=1024.0, incr_ratio=2.0, decr_ratio=0.5, incr_every_n_steps=3,
                decr_every_n_nan_or_inf=2)
    amp = _amp(**args)
    lin = paddle.nn.Linear(2, 1)
    opt = paddle.optimizer.SGD(0.01, parameters=lin.parameters())
    lin, opt = amp.setup(lin, opt, CPU)
    got = []
    for ok in finite:
        with amp.autocast():
            loss = lin(paddle.ones([1, 2]) * (1.0 if ok else float("inf"))).mean()
        amp.backward(loss)
        stepped = amp.step(opt)
        opt.clear_grad()
        got.append((amp.loss_scale, not stepped))
    assert got == _reference_scale_trajectory(finite, 1024.0, 2.0, 0.5, 3, 2)
    assert amp.skipped_steps == 3
    # The scaler state survives a checkpoint round trip (0-d scale, Paddle's keys).
    state = amp.state_dict()
    other = _amp(**args)
    other.setup(paddle.nn.Linear(2, 1), paddle.optimizer.SGD(0.01, parameters=lin.parameters()), CPU)
    other.set_state_dict(state)
    assert other.loss_scale == amp.loss_scale and other.skipped_steps == 3
    assert other.scaler.state_dict()["incr_count"] == amp.scaler.state_dict()["incr_count"]


def test_bf16_keeps_range_loses_precision_and_has_no_scaler():
    amp = _amp(dtype="bfloat16")
    lin = paddle.nn.Linear(1, 1, bias_attr=False)
    lin.weight.set_value(paddle.full([1, 1], 1.0))
    opt = paddle.optimizer.SGD(0.0, parameters=lin.parameters())
    lin, opt = amp.setup(lin, opt, CPU)
    assert amp.scaler is None and amp.loss_scale is None
    with amp.autocast():
        big = lin(paddle.full([1, 1], 1e30))
        fine = lin(paddle.full([1, 1], 1.0 + 2**-10))
    assert np.isfinite(big.numpy()).all() and fine.numpy().flat[0] == 1.0


def test_emulated_o2_trains_a_classifier_with_fp32_master_weights():
    paddle.seed(1)
    net = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 3))
    amp = _amp("O2", init_loss_scaling=1024.0)
    opt = paddle.optimizer.Adam(1e-2, parameters=net.parameters())
    net, opt = amp.setup(net, opt, CPU)
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.normal(size=(64, 8)).astype("float32"))
    y = paddle.to_tensor((rng.normal(size=64) > 0).astype("int64") + (x.numpy()[:, 0] > 1))
    first = None
    for _ in range(40):
        with amp.autocast():
            loss = paddle.nn.functional.cross_entropy(net(x), y)
        amp.backward(loss)
        amp.step(opt)
        opt.clear_grad()
        first = first if first is not None else float(loss)
    assert float(loss) < 0.8 * first
    assert all(p.dtype == paddle.float32 for p in net.parameters())


def test_overflowed_exp_gives_nan_gradient_as_on_a_gpu():
    """DB's step function 1/(1+exp(-k(P-T))) in fp16: exp overflows, its backward is inf * 0."""
    x = paddle.to_tensor(np.array([20.0, 1.0], np.float32), stop_gradient=False)
    with Emulation("O2", "float16")():
        y = paddle.reciprocal(1 + paddle.exp(round_to(x, "float16")))
    y.sum().backward()
    assert y.numpy()[0] == 0.0 and np.isnan(x.grad.numpy()[0]) and np.isfinite(x.grad.numpy()[1])
    x.clear_gradient()
    with Emulation("O2", "float16", custom_black_list=["exp"])():
        y = paddle.reciprocal(1 + paddle.exp(round_to(x, "float16")))
    y.sum().backward()
    assert np.isfinite(x.grad.numpy()).all()  # the recipe's black list keeps the gradient finite
    x.clear_gradient()
    with Emulation("O2", "float16")():
        s = paddle.nn.functional.sigmoid(round_to(x, "float16"))
    s.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), (s * (1 - s)).numpy(), rtol=1e-3, atol=1e-7)


def test_value_preserving_ops_stay_representable_without_extra_casts():
    x = paddle.to_tensor(np.linspace(-3, 3, 16, dtype=np.float32).reshape(1, 1, 4, 4) + 1e-4)
    w = paddle.ones([1, 1, 1, 1])
    with Emulation("O1", "float16")():
        y = paddle.nn.functional.conv2d(x, w)
        r = paddle.nn.functional.relu(y)
        c = paddle.concat([r, y], axis=1)
    for t in (r, c):
        assert is_low(t)
        np.testing.assert_array_equal(t.numpy(), t.numpy().astype(np.float16).astype(np.float32))
