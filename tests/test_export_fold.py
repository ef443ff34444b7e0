"""issue 35.6: folding a BatchNorm into its convolution keeps the activation the BatchNorm fused.

``paddle.nn.BatchNorm(C, act="relu")`` (the fluid-style layer PaddleOCR's DBHead uses) applies its
activation itself; replacing it by an identity after folding dropped the ReLU, and the deployed
probability map differed from FP32 by up to 1.0."""
from __future__ import annotations

import numpy as np
import paddle
import pytest
from conftest import conv_bn_net

from zoo.export.deployed import fold_batch_norms


@pytest.mark.parametrize("act", ["relu", "hard_swish", None])
def test_folding_keeps_a_batchnorms_fused_activation(act):
    paddle.seed(0)
    net = conv_bn_net(paddle.nn.BatchNorm(4, act=act))
    x = paddle.randn([2, 3, 8, 8])
    folded, n = fold_batch_norms(net, x)
    assert n == 1
    expected = net(x).numpy()
    if act == "relu":  # independent of the layer: the folded conv's output, ReLU in NumPy
        conv = folded[0](x).numpy()
        np.testing.assert_allclose(expected, np.maximum(conv, 0), rtol=1e-5, atol=1e-5)
        assert (expected == 0).mean() > 0.2  # the ReLU had something to do
    np.testing.assert_allclose(folded(x).numpy(), expected, rtol=1e-5, atol=1e-5)
