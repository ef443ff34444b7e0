"""The emulation's op rule at O2, fp16 gradient storage, depthwise accumulation and tag survival.

References are independent of zoo/amp: hand-built cases, Paddle's own fp32 kernels on values where
fp32 is exact, and a scalar NumPy float16 re-statement of the CUDA kernel's loops.
"""
from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from zoo.amp import Amp, DeviceInfo
from zoo.amp.depthwise import Geometry, depthwise_low_accum, filter_grad_np
from zoo.amp.emulation import Emulation, is_low, mark_o2_parameters, round_to

CPU = DeviceInfo("cpu", "cpu")


def low(x):
    return round_to(paddle.to_tensor(np.asarray(x, np.float32)), "float16")


def test_o2_promote_rule_on_hand_built_cases():
    a, b = low([1.0, 2.0]), paddle.to_tensor(np.array([1.0 + 2**-12, 1.0], np.float32))
    with Emulation("O2", "float16")():
        mixed = a + b       # fp16 + fp32: promoted to fp32 at O2 as at O1
        both = a + low([1.0, 1.0])
        e = paddle.exp(b)   # gray with an fp32 input: fp32
    assert not is_low(mixed) and mixed.numpy()[0] == np.float32(2.0 + 2**-12)
    assert is_low(both) and not is_low(e)


def test_norm_is_judged_on_x_only_and_decorated_parameters_are_low():
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Conv2D(1, 2, 1), paddle.nn.BatchNorm2D(2), paddle.nn.LayerNorm(4))
    assert mark_o2_parameters(net, "float16") == 2  # conv weight and bias; BN and LayerNorm keep fp32
    assert not hasattr(net[1].weight, "_zoo_o2_low")
    x = paddle.to_tensor(np.random.default_rng(0).normal(size=(1, 1, 4, 4)).astype("float32"))
    with Emulation("O2", "float16")():
        bn_fp32_x = net[1](paddle.concat([x, x], axis=1))  # fp32 x, fp32 params: fp32
        y = net[0](x)           # conv2d white; its bias is a low parameter, so the add stays low
        bn_low_x = net[1](y)    # low x with fp32 scale/bias: low (only x is judged)
        ln = net[2](bn_low_x)   # LayerNorm: same rule
    assert not is_low(bn_fp32_x) and is_low(y) and is_low(bn_low_x) and is_low(ln)


def test_o1_keeps_the_conv_bias_add_fp32():
    conv = paddle.nn.Conv2D(1, 1, 1)
    with Emulation("O1", "float16")():
        assert not is_low(conv(paddle.ones([1, 1, 2, 2])))  # fp32 bias promotes the add


def test_linear_is_matmul_then_add_under_the_rule():
    lin = paddle.nn.Linear(4, 3)
    x = low(np.ones((2, 4)))
    with Emulation("O1", "float16")():
        o1 = lin(x)
    mark_o2_parameters(lin, "float16")
    with Emulation("O2", "float16")():
        o2 = lin(x)
    assert not is_low(o1) and is_low(o2)


def _grad_after_step(master_grad: bool) -> float:
    """Unscaled gradient of a weight whose true gradient is 1e-8 (below fp16's subnormals)."""
    lin = paddle.nn.Linear(1, 1, bias_attr=False)
    lin.weight.set_value(paddle.ones([1, 1]))
    amp = Amp(name="O2", enabled=True, level="O2", master_grad=master_grad, init_loss_scaling=65536.0,
              use_dynamic_loss_scaling=False, on_unsupported="emulate")
    opt = paddle.optimizer.SGD(0.0, parameters=lin.parameters())
    lin, opt = amp.setup(lin, opt, CPU)
    with amp.autocast():
        loss = lin(low([[1.0]])).astype("float32").sum() * 1e-8  # the loss in fp32, as the tasks do
    amp.backward(loss)
    assert amp.step(opt)
    return float(lin.weight.grad.numpy().ravel()[0])


def test_fp16_gradient_storage_flushes_tiny_unscaled_gradients_without_master_grad():
    assert _grad_after_step(master_grad=False) == 0.0  # stored and unscaled in fp16: flushed
    assert _grad_after_step(master_grad=True) == pytest.approx(1e-8, rel=2e-3)


# ---- depthwise convolution -----------------------------------------------------------------
CASES = [((2, 3, 7, 6), 3, 1, [1, 1], 1), ((1, 2, 9, 9), 3, 2, [1, 1], 1), ((1, 2, 8, 8), 5, 1, [2, 2], 1),
         ((2, 2, 9, 8), 3, 1, [2, 2], 2), ((1, 1, 6, 6), 3, 2, [0, 1, 1, 0], 1)]


@pytest.mark.parametrize("shape,k,stride,pad,dil", CASES)
def test_depthwise_geometry_matches_paddle_on_exact_values(shape, k, stride, pad, dil):
    """Small integers: every partial sum is exact in fp16, so fp16 accumulation equals fp32's."""
    rng = np.random.default_rng(1)
    x = paddle.to_tensor(rng.integers(-3, 4, shape).astype("float32"), stop_gradient=False)
    w = paddle.to_tensor(rng.integers(-2, 3, (shape[1], 1, k, k)).astype("float32"), stop_gradient=False)
    padding = pad if len(pad) == 2 else [pad[0], pad[1], pad[2], pad[3]]
    ref = F.conv2d(x, w, stride=stride, padding=padding, dilation=dil, groups=shape[1])
    out = depthwise_low_accum([x, w, [stride] * 2, padding, "EXPLICIT", shape[1], [dil] * 2, "NCHW"],
                              "float16")
    np.testing.assert_array_equal(out.numpy(), ref.numpy())
    dy = rng.integers(-2, 3, ref.shape).astype("float32")
    gx_ref, gw_ref = paddle.grad(ref, [x, w], paddle.to_tensor(dy))
    gx, gw = paddle.grad(out, [x, w], paddle.to_tensor(dy))
    np.testing.assert_array_equal(gx.numpy(), gx_ref.numpy())
    np.testing.assert_array_equal(gw.numpy(), gw_ref.numpy())


def test_depthwise_forward_accumulates_in_fp16():
    """Taps 2048, 1, 1, ... : in fp16 each +1 rounds back to 2048 (ulp 2); fp32 keeps 2056."""
    x = np.ones((1, 1, 3, 3), np.float32)
    x[0, 0, 0, 0] = 2048.0
    w = np.ones((1, 1, 3, 3), np.float32)
    out = depthwise_low_accum([paddle.to_tensor(x), paddle.to_tensor(w), [1, 1], [0, 0], "EXPLICIT", 1,
                               [1, 1], "NCHW"], "float16")
    fp32_then_round = np.float16(x.sum())
    assert out.numpy().item() == 2048.0 and fp32_then_round == 2056.0


def _kernel_filter_grad(dy, x, k, stride, pad):
    """Scalar float16 re-statement of KernelDepthwiseConvFilterGradNCHW + BlockReduceSum."""
    n, c, ho, wo = dy.shape
    h, w = x.shape[2:]
    bdx, bdy = min(wo, 512), min(max(512 // wo, 1), ho)
    out = np.zeros((c, 1, k, k), np.float16)
    for ch in range(c):
        for i in range(k):
            for j in range(k):
                partial = []
                for ty in range(bdy):
                    for tx in range(bdx):
                        s = np.float16(0)
                        for iw in range(tx, wo, bdx):
                            for b in range(n):
                                for ih in range(ty, ho, bdy):
                                    hk, wk = ih * stride + i - pad, iw * stride + j - pad
                                    if 0 <= hk < h and 0 <= wk < w:
                                        s = np.float16(s + np.float16(dy[b, ch, ih, iw] * x[b, ch, hk, wk]))
                        partial.append(s)
                def warp(vals):
                    vals = list(vals) + [np.float16(0)] * (32 - len(vals))
                    while len(vals) > 1:
                        vals = [np.float16(vals[t] + vals[t + 1]) for t in range(0, len(vals), 2)]
                    return vals[0]
                sums = [warp(partial[t:t + 32]) for t in range(0, len(partial), 32)]
                out[ch, 0, i, j] = warp(sums)
    return out.astype(np.float32)


def test_depthwise_filter_gradient_follows_the_kernel_order():
    rng = np.random.default_rng(3)
    dy = rng.normal(size=(2, 2, 5, 40)).astype(np.float16).astype(np.float32) * 30
    x = rng.normal(size=(2, 2, 5, 40)).astype(np.float16).astype(np.float32) * 30
    g = Geometry(x.shape, (2, 1, 3, 3), [1, 1], (1, 1, 1, 1), [1, 1])
    got = filter_grad_np(dy, x, g, "float16")
    np.testing.assert_array_equal(got, _kernel_filter_grad(dy, x, 3, 1, 1))
    fp32_accum = np.stack([np.float16(sum(
        float(dy[b, ch, ih, iw]) * float(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))[b, ch, ih + i, iw + j])
        for b in range(2) for ih in range(5) for iw in range(40))) for ch in range(2) for i in range(3)
        for j in range(3)]).reshape(2, 1, 3, 3).astype(np.float32)
    assert np.abs(got - fp32_accum).max() > 0  # fp16 accumulation is visibly different


def test_o2_depthwise_conv_uses_low_accumulation_and_o1_promotes_it():
    conv = paddle.nn.Conv2D(2, 2, 3, padding=1, groups=2, bias_attr=False)
    x = low(np.random.default_rng(0).normal(size=(1, 2, 6, 6)))
    with Emulation("O1", "float16")():
        o1 = conv(x)           # fp32 filter at O1: promoted to fp32
    mark_o2_parameters(conv, "float16")
    with Emulation("O2", "float16")():
        o2 = conv(x)
    with Emulation("O2", "float16", depthwise_accumulation=False)():
        o2_fp32_accum = conv(x)
    assert not is_low(o1) and is_low(o2) and is_low(o2_fp32_accum)
    np.testing.assert_array_equal(o2.numpy(), o2.numpy().astype(np.float16).astype(np.float32))


# ---- tags --------------------------------------------------------------------------------------
def test_tags_survive_shape_ops_and_adaptive_pooling():
    x = low(np.random.default_rng(0).normal(size=(2, 4, 4, 4)))
    with Emulation("O1", "float16")():
        outs = {"reshape": x.reshape([2, -1]), "transpose": x.transpose([0, 2, 3, 1]),
                "slice": x[:, :2], "flatten": x.flatten(1), "squeeze": x[:, :1].squeeze(1),
                "unsqueeze": x.unsqueeze(0), "split": paddle.split(x, 2, axis=1)[1],
                "pool": F.adaptive_avg_pool2d(x, 1), "gather": paddle.gather(x, paddle.to_tensor([0, 1]), axis=1),
                "expand": x[:, :1].expand([2, 3, 4, 4]), "tile": paddle.tile(x, [1, 2, 1, 1])}
        after = F.relu(outs["pool"])  # a gray op after the pool still sees a low input
        back = x.astype("float32")     # an explicit cast to fp32 gives fp32
    lost = [k for k, v in outs.items() if not is_low(v)]
    assert not lost and is_low(after) and not is_low(back)


def test_fast_fp16_rounding_equals_the_cast_on_every_value_midpoint_and_neighbour():
    from zoo.amp.depthwise import round_np

    h = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16)          # every finite fp16 >= 0
    up = np.nextafter(h, np.float16(np.inf)).astype(np.float64)
    mid = ((h.astype(np.float64) + up) / 2).astype(np.float32)             # ties: round to even
    vals = np.concatenate([h.astype(np.float32), mid, np.nextafter(mid, np.float32(0)),
                           np.nextafter(mid, np.float32(np.inf)), np.float32([65519.99, 65520, 1e38, np.inf])])
    vals = np.concatenate([vals, -vals, np.float32([np.nan])])
    with np.errstate(over="ignore", invalid="ignore"):
        ref = vals.astype(np.float16).astype(np.float32)
    got = round_np(vals, "float16")
    np.testing.assert_array_equal(got, ref)
    rng = np.random.default_rng(0)
    x = (rng.normal(size=100_000) * 10.0 ** rng.integers(-30, 30, 100_000)).astype(np.float32)
    ties = (rng.integers(0, 2**15, 1000).astype(np.uint32) << 16 | 0x8000).view(np.float32)  # exact ties
    x = np.concatenate([x, ties[np.isfinite(ties)]])
    paddle_bf16 = paddle.to_tensor(x).astype("bfloat16").astype("float32").numpy()  # Paddle's own cast
    np.testing.assert_array_equal(round_np(x, "bfloat16"), paddle_bf16)


@pytest.mark.parametrize("forward,backward", [(True, False), (False, True), (False, False)])
def test_ablation_switches_round_only_what_they_say(forward, backward):
    x = paddle.to_tensor(np.array([[1.0 + 2**-12]], np.float32), stop_gradient=False)
    w = paddle.to_tensor(np.array([[1.0]], np.float32), stop_gradient=False)
    with Emulation("O1", "float16", forward=forward, backward=backward)():
        y = paddle.matmul(x, w)  # white: inputs and output rounded (when forward is on)
    (y * (1.0 + 2**-12)).sum().backward()  # incoming gradient 1 + 2^-12: fp16 rounds it to 1
    assert is_low(y)
    assert (y.numpy().item() == 1.0) == forward
    assert (x.grad.numpy().item() == 1.0) == backward
    amp = Amp(name="O1", enabled=True, emulation={"forward": forward, "backward": backward})
    amp.resolve(CPU)
    assert amp.effective.startswith("emulated-fp16-O1-ablation-")


def test_unknown_emulation_switch_is_refused():
    from zoo.amp import AmpConfigError

    with pytest.raises(AmpConfigError, match="amp.emulation"):
        Amp(name="O1", enabled=True, emulation={"forwards": False})


def test_tensors_passed_by_keyword_follow_the_rule():
    """issue 35.6: ``paddle.multiply(x=a, y=b)`` (PaddleOCR's LCNetV3 SELayer) escaped the rule:
    ``Emulation.run`` read only positional tensors, so the op computed in fp32. By keyword it must
    round and tag exactly as by position, and an fp32 keyword input must still promote."""
    import numpy as np
    import paddle

    from zoo.amp.emulation import Emulation, is_low

    emu = Emulation("O1", "float16")
    a = paddle.to_tensor(np.linspace(0.1, 3.0, 12, dtype=np.float32).reshape(3, 4))
    b = paddle.to_tensor(np.linspace(1.0, 2.0, 20, dtype=np.float32).reshape(4, 5))
    with emu():
        low = paddle.matmul(a, b)                    # white list: fp16
        by_position = paddle.multiply(low, low)
        by_keyword = paddle.multiply(x=low, y=low)
        promoted = paddle.multiply(x=low, y=paddle.ones_like(low).astype("float32"))
    assert is_low(low) and is_low(by_position) and is_low(by_keyword) and not is_low(promoted)
    ref = (low.numpy().astype(np.float16) * low.numpy().astype(np.float16)).astype(np.float32)  # NumPy fp16
    np.testing.assert_array_equal(by_keyword.numpy(), ref)
    np.testing.assert_array_equal(by_keyword.numpy(), by_position.numpy())
