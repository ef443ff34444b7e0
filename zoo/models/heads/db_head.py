"""DBHead: Differentiable Binarization (https://arxiv.org/abs/1911.08947), PaddleOCR's names.

The layout follows PaddleOCR ``ppocr/modeling/heads/det_db_head.py`` (classes
``Head`` and ``DBHead``): two identical branches, ``binarize`` (shrink /
probability map P) and ``thresh`` (threshold map T), each

    conv1 (3x3, no bias) -> conv_bn1 -> ReLU
    -> conv2 (2x2 transposed, stride 2, bias) -> conv_bn2 -> ReLU
    -> conv3 (2x2 transposed, stride 2, bias, 1 channel) -> sigmoid

taking the stride-4 neck output back to the input resolution.
"""

from __future__ import annotations

import math

import paddle
import paddle.nn.functional as F
from paddle import nn

__all__ = ["DBBranch", "DBHead"]


def _bn(channels):
    # Upstream initialises these BN biases to 1e-4 rather than 0.
    return nn.BatchNorm2D(
        channels,
        weight_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(1.0)),
        bias_attr=paddle.ParamAttr(initializer=nn.initializer.Constant(1e-4)),
    )


def _up_conv(in_ch, out_ch, fan_in):
    """2x2 stride-2 transposed conv; upstream's init: Kaiming weights, U(+-1/sqrt(fan_in)) bias."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Conv2DTranspose(
        in_ch, out_ch, 2, stride=2,
        weight_attr=paddle.ParamAttr(initializer=nn.initializer.KaimingUniform()),
        bias_attr=paddle.ParamAttr(initializer=nn.initializer.Uniform(-bound, bound)),
    )


def _zero_nan(x):
    return paddle.where(paddle.isnan(x), paddle.zeros_like(x), x)


class DBBranch(nn.Layer):
    """One head branch: [N, C, h, w] -> sigmoid map [N, 1, 4h, 4w].

    ``fix_nan`` (PaddleOCR's ``Head(fix_nan=True)``, set by the PP-OCRv4/v5 det configs) zeroes NaNs
    after each BatchNorm + ReLU, in training mode only.
    """

    def __init__(self, in_channels, fix_nan=False):
        super().__init__()
        self.fix_nan = fix_nan
        mid = in_channels // 4
        if mid < 1:
            raise ValueError(f"DBHead needs in_channels >= 4, got {in_channels!r}")
        self.conv1 = nn.Conv2D(in_channels, mid, 3, padding=1, bias_attr=False)
        self.conv_bn1 = _bn(mid)
        self.conv2 = _up_conv(mid, mid, mid)
        self.conv_bn2 = _bn(mid)
        self.conv3 = _up_conv(mid, 1, mid)

    def features(self, x):
        """The [N, C/4, 2h, 2w] map ``conv3`` reads (PFHeadLocal refines the shrink map with it)."""
        fix = self.fix_nan and self.training
        x = F.relu(self.conv_bn1(self.conv1(x)))
        x = _zero_nan(x) if fix else x
        x = F.relu(self.conv_bn2(self.conv2(x)))
        return _zero_nan(x) if fix else x

    def forward(self, x):
        return F.sigmoid(self.conv3(self.features(x)))


class DBHead(nn.Layer):
    """DB head producing shrink, threshold and approximate binary maps.

    Args:
        in_channels: channels of the neck output.
        k: amplification factor of the differentiable step function.
        fix_nan: zero NaNs inside both branches in training (see :class:`DBBranch`).

    In training mode ``forward`` returns ``{"maps": [N, 3, H, W]}``, the
    concatenation of the shrink map P, threshold map T and binary map
    ``1 / (1 + exp(-k (P - T)))``. In eval mode only the ``binarize`` branch
    runs and ``{"maps": P}`` ([N, 1, H, W]) is returned, as PaddleOCR's
    post-processing expects.
    """

    def __init__(self, in_channels, k=50, fix_nan=False):
        super().__init__()
        self.k = k
        self.binarize = DBBranch(in_channels, fix_nan)
        self.thresh = DBBranch(in_channels, fix_nan)

    def step_function(self, p, t):
        """Differentiable binarization ``1 / (1 + exp(-k (p - t)))``.

        Written with an explicit ``paddle.exp`` (not ``F.sigmoid``) on purpose:
        in fp16, exp(k * |p - t|) overflows for k = 50, and the AMP recipes fix
        that by black-listing the ``exp`` op, which only works if the op is
        actually emitted here.
        """
        return paddle.reciprocal(1 + paddle.exp(-self.k * (p - t)))

    def forward(self, x):
        shrink = self.binarize(x)
        if not self.training:
            return {"maps": shrink}
        thresh = self.thresh(x)
        binary = self.step_function(shrink, thresh)
        return {"maps": paddle.concat([shrink, thresh, binary], axis=1)}
