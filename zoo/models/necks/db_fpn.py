"""DBFPN: the feature pyramid of DB text detection, with PaddleOCR's names.

The layout follows PaddleOCR ``ppocr/modeling/necks/db_fpn.py`` (class
``DBFPN``, without the optional ASF block): bias-free 1x1 lateral convs
``in2_conv`` .. ``in5_conv`` to ``out_channels``, a top-down sum with nearest
upsampling, then bias-free 3x3 convs ``p2_conv`` .. ``p5_conv`` to
``out_channels // 4`` each, upsampled to stride 4 and concatenated
(deepest first: p5, p4, p3, p2).
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

__all__ = ["DBFPN", "top_down", "upsample_nearest"]


def _conv(in_ch, out_ch, kernel):
    # Kaiming-uniform weights, as upstream, so a fresh neck trains alike.
    return nn.Conv2D(in_ch, out_ch, kernel, padding=kernel // 2, bias_attr=False,
                     weight_attr=paddle.ParamAttr(initializer=nn.initializer.KaimingUniform()))


def upsample_nearest(x, factor):
    """Nearest upsampling by an integer factor, stated as an output size (the same values as
    ``scale_factor=factor``): paddle2onnx 2.1 cannot convert Paddle 3.3's float64 ``scale``
    attribute of nearest_interp, but converts the size form, dynamic input sizes included."""
    shape = paddle.shape(x)
    return F.interpolate(x, size=[shape[2] * factor, shape[3] * factor], mode="nearest")


def top_down(lateral, feats):
    """The lateral convs ``lateral[0..3]`` on ``feats`` = [c2, c3, c4, c5], called deepest first (as
    upstream calls them: the order a traced program uses the weights in), summed top-down with 2x
    nearest upsampling; returns (in5, out4, out3, out2). RSEFPN and LKPAN share it."""
    c2, c3, c4, c5 = feats
    in5, in4, in3, in2 = lateral[3](c5), lateral[2](c4), lateral[1](c3), lateral[0](c2)
    out4 = in4 + upsample_nearest(in5, 2)
    out3 = in3 + upsample_nearest(out4, 2)
    return in5, out4, out3, in2 + upsample_nearest(out3, 2)


class DBFPN(nn.Layer):
    """Fuse four maps at strides 4, 8, 16, 32 into one map at stride 4.

    Args:
        in_channels: channels of the four inputs, shallowest first.
        out_channels: lateral width; the fused output has
            ``4 * (out_channels // 4)`` channels (``out_channels`` when it is
            divisible by 4), exposed as ``self.out_channels``.

    The input size must be a multiple of 32 so that the upsampled maps line up
    (as upstream, which the DB recipes resize images to).
    """

    def __init__(self, in_channels, out_channels=256):
        super().__init__()
        in_channels = list(in_channels)
        if len(in_channels) != 4:
            raise ValueError(f"DBFPN needs 4 input channel counts, got {in_channels!r}")
        if out_channels < 4:
            raise ValueError(f"out_channels must be >= 4, got {out_channels!r}")
        self.in2_conv = _conv(in_channels[0], out_channels, 1)
        self.in3_conv = _conv(in_channels[1], out_channels, 1)
        self.in4_conv = _conv(in_channels[2], out_channels, 1)
        self.in5_conv = _conv(in_channels[3], out_channels, 1)
        self.p5_conv = _conv(out_channels, out_channels // 4, 3)
        self.p4_conv = _conv(out_channels, out_channels // 4, 3)
        self.p3_conv = _conv(out_channels, out_channels // 4, 3)
        self.p2_conv = _conv(out_channels, out_channels // 4, 3)
        self.out_channels = 4 * (out_channels // 4)

    def forward(self, feats):
        """``feats`` = [c2, c3, c4, c5]; returns [N, out_channels, H/4, W/4]."""
        c2, c3, c4, c5 = feats
        in5 = self.in5_conv(c5)
        out4 = self.in4_conv(c4) + upsample_nearest(in5, 2)
        out3 = self.in3_conv(c3) + upsample_nearest(out4, 2)
        out2 = self.in2_conv(c2) + upsample_nearest(out3, 2)
        p5 = upsample_nearest(self.p5_conv(in5), 8)
        p4 = upsample_nearest(self.p4_conv(out4), 4)
        p3 = upsample_nearest(self.p3_conv(out3), 2)
        p2 = self.p2_conv(out2)
        return paddle.concat([p5, p4, p3, p2], axis=1)
