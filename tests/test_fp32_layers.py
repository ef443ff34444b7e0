"""amp.fp32_layers: named sublayers run in fp32 under AMP (the emulation's and Paddle's), for a layer
that overflows fp16 where an op list cannot single it out (PP-OCRv4 det's head.binarize.conv1, issue 36)."""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from zoo.amp import Amp, DeviceInfo
from zoo.amp.amp import AmpConfigError
from zoo.amp.emulation import O2_PARAM

CPU = DeviceInfo("cpu", "cpu")


class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.pre = paddle.nn.Conv2D(2, 4, 1)
        self.big = paddle.nn.Conv2D(4, 4, 3, padding=1, bias_attr=False)
        self.bn = paddle.nn.BatchNorm2D(4)
        self.post = paddle.nn.Conv2D(4, 1, 1)

    def forward(self, x):
        return self.post(paddle.nn.functional.relu(self.bn(self.big(self.pre(x)))))


def _net(seed=0):
    paddle.seed(seed)
    net = Net()
    with paddle.no_grad():  # big's output reaches ~1e6, far past fp16's 65504; BatchNorm brings it back
        net.big.weight.set_value(net.big.weight * 3e4)
        net.bn._variance.set_value(paddle.full([4], 1e11))
    net.eval()
    return net


def _amp(level="O1", **kw):
    return Amp(name=level, enabled=True, level=level, dtype="float16", **kw)


def _x():
    return paddle.to_tensor(np.random.default_rng(0).normal(0, 1, (2, 2, 8, 8)).astype("float32"))


def test_an_overflowing_layer_kept_fp32_gives_finite_outputs_and_fp32s_numbers():
    x = _x()
    plain = _amp()
    net, _ = plain.setup(_net(), None, CPU)
    with plain.autocast():
        out = net(x)
    assert not np.isfinite(out.numpy()).all()  # the emulated fp16 conv overflows

    kept = _amp(fp32_layers=["big"])
    net, _ = kept.setup(_net(), None, CPU)
    with kept.autocast():
        out = net(x).numpy()
    assert np.isfinite(out).all()
    # independent reference: FP32 for big (and the fp32 BatchNorm), fp16 rounding of the convs around it
    ref = _net()
    with paddle.no_grad():
        h = ref.pre(paddle.to_tensor(x.numpy().astype(np.float16).astype(np.float32)))
        h = h.numpy().astype(np.float16).astype(np.float32)  # pre's fp16 output, cast up at big's input
        h = paddle.nn.functional.relu(ref.bn(ref.big(paddle.to_tensor(h))))
        want = ref.post(paddle.to_tensor(h.numpy().astype(np.float16).astype(np.float32))).numpy()
    np.testing.assert_allclose(out, want, rtol=2e-2, atol=2e-2)


def test_o2_leaves_the_kept_layers_parameters_fp32():
    amp = _amp("O2", fp32_layers=["big"])
    net, _ = amp.setup(_net(), None, CPU)
    tagged = {n for n, p in net.named_parameters() if getattr(p, O2_PARAM, False)}
    assert "big.weight" not in tagged and "pre.weight" in tagged and "post.weight" in tagged


def test_an_unknown_layer_is_one_error_naming_the_nearest():
    with pytest.raises(AmpConfigError, match=r"amp.fp32_layers: no sublayer 'bigg' in Net; nearest: big"):
        _amp(fp32_layers=["bigg"]).setup(_net(), None, CPU)
    with pytest.raises(AmpConfigError, match="amp.fp32_layers: expected a list of sublayer names"):
        _amp(fp32_layers="big")


def test_fp32_runs_ignore_the_setting():
    amp = Amp(name="fp32", enabled=False, fp32_layers=["big"])
    net = _net()
    forward = net.big.forward
    amp.setup(net, None, CPU)
    assert net.big.forward == forward


def test_the_doctor_names_few_compute_layers_and_black_lists_the_rest():
    """A conv overflowing in one layer gets amp.fp32_layers (the type's black list tried next); an
    elementwise op, or a conv in many layers, gets the black list (zoo/diagnostics/prescribe.py)."""
    from types import SimpleNamespace

    from zoo.diagnostics.prescribe import fix_lines

    amp = _amp(custom_black_list=["exp"], fp32_layers=["neck.a"])
    rec = lambda layer: SimpleNamespace(layer=layer)  # noqa: E731
    assert fix_lines(amp, "conv2d", [rec("head.binarize.conv1")]) == (
        "amp.fp32_layers=[neck.a,head.binarize.conv1]", ["amp.custom_black_list=[conv2d,exp]"])
    assert fix_lines(amp, "exp", [rec("head")]) == ("amp.custom_black_list=[exp]", [])
    many = [rec(f"b.{i}") for i in range(4)]
    assert fix_lines(amp, "conv2d", many) == ("amp.custom_black_list=[conv2d,exp]", [])
