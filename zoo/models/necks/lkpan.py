"""LKPAN: DB's large-kernel path-aggregation neck (PP-OCRv4/v5 server det), PaddleOCR's names.

The layout follows PaddleOCR ``ppocr/modeling/necks/db_fpn.py`` (class ``LKPAN``, mode "large")
and ``ppocr/modeling/necks/intracl.py`` (``IntraCLBlock``):

- ``ins_conv.{0..3}``: bias-free 1x1 laterals to ``out_channels``, summed top-down (nearest 2x);
- ``inp_conv.{0..3}``: bias-free 9x9 convs to ``out_channels // 4``;
- ``pan_head_conv.{0..2}``: bias-free 3x3 stride-2 convs carrying the stride-4 map bottom-up;
- ``pan_lat_conv.{0..3}``: bias-free 9x9 convs on each bottom-up sum;
- ``incl1..incl4`` (``intracl``): :class:`IntraCLBlock` on the stride 4, 8, 16, 32 maps;

then the four maps upsampled to stride 4 and concatenated deepest first, as DBFPN. Only the
"large" mode (plain convs) is built; PaddleOCR's "lite" mode (depthwise-separable ``DSConv``) is
used by no PP-OCR det config.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

from zoo.models.necks.db_fpn import top_down, upsample_nearest

__all__ = ["IntraCLBlock", "LKPAN"]


def _conv(in_ch, out_ch, kernel, stride=1):
    # Kaiming-uniform, bias-free, as upstream's LKPAN convs.
    return nn.Conv2D(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, bias_attr=False,
                     weight_attr=paddle.ParamAttr(initializer=nn.initializer.KaimingUniform()))


class IntraCLBlock(nn.Layer):
    """Intra-instance collaborative learning (I3CL, https://arxiv.org/abs/2108.01343) on one map.

    A 1x1 reduction to ``channels // reduce_factor``, three rounds (kernel 7, 5, 3) each summing a
    square kxk, a vertical kx1 and a horizontal 1xk conv of the previous round, a 1x1 return to
    ``channels``, BatchNorm and ReLU, added to the input. Every conv has a bias (Paddle's default
    init), as upstream.
    """

    def __init__(self, channels, reduce_factor=2):
        super().__init__()
        mid = channels // reduce_factor
        if mid < 1:
            raise ValueError(f"IntraCLBlock needs channels >= reduce_factor, got {channels!r}, {reduce_factor!r}")
        # Declaration order is the state-dict order of upstream's checkpoints.
        self.conv1x1_reduce_channel = nn.Conv2D(channels, mid, 1)
        self.conv1x1_return_channel = nn.Conv2D(mid, channels, 1)
        for k in (7, 5, 3):
            setattr(self, f"v_layer_{k}x1", nn.Conv2D(mid, mid, (k, 1), padding=(k // 2, 0)))
        for k in (7, 5, 3):
            setattr(self, f"q_layer_1x{k}", nn.Conv2D(mid, mid, (1, k), padding=(0, k // 2)))
        for k in (7, 5, 3):
            setattr(self, f"c_layer_{k}x{k}", nn.Conv2D(mid, mid, k, padding=k // 2))
        self.bn = nn.BatchNorm2D(channels)

    def forward(self, x):
        y = self.conv1x1_reduce_channel(x)
        for k in (7, 5, 3):
            y = (getattr(self, f"c_layer_{k}x{k}")(y) + getattr(self, f"v_layer_{k}x1")(y)
                 + getattr(self, f"q_layer_1x{k}")(y))
        return x + F.relu(self.bn(self.conv1x1_return_channel(y)))


class LKPAN(nn.Layer):
    """Fuse four maps at strides 4, 8, 16, 32 into one map at stride 4 (top-down, then bottom-up).

    Args:
        in_channels: channels of the four inputs, shallowest first.
        out_channels: lateral width (PP-OCRv5 server det: 256); the output has
            ``4 * (out_channels // 4)`` channels, exposed as ``self.out_channels``.
        intracl: add the four :class:`IntraCLBlock` s (PP-OCRv4/v5 server det: True).
        mode: "large" only (see the module doc).
    """

    def __init__(self, in_channels, out_channels=256, intracl=False, mode="large"):
        super().__init__()
        in_channels = list(in_channels)
        if len(in_channels) != 4:
            raise ValueError(f"LKPAN needs 4 input channel counts, got {in_channels!r}")
        if str(mode).lower() != "large":
            raise ValueError(f"LKPAN: only mode 'large' is built, got {mode!r}")
        if out_channels < 8:
            raise ValueError(f"out_channels must be >= 8, got {out_channels!r}")
        q = out_channels // 4
        self.ins_conv = nn.LayerList([_conv(c, out_channels, 1) for c in in_channels])
        self.inp_conv = nn.LayerList([_conv(out_channels, q, 9) for _ in in_channels])
        self.pan_head_conv = nn.LayerList([_conv(q, q, 3, stride=2) for _ in in_channels[1:]])
        self.pan_lat_conv = nn.LayerList([_conv(q, q, 9) for _ in in_channels])
        self.intracl = bool(intracl)
        if self.intracl:
            for i in range(1, 5):
                setattr(self, f"incl{i}", IntraCLBlock(q, reduce_factor=2))
        self.out_channels = 4 * q

    def forward(self, feats):
        """``feats`` = [c2, c3, c4, c5]; returns [N, out_channels, H/4, W/4]."""
        in5, out4, out3, out2 = top_down(self.ins_conv, feats)
        f5 = self.inp_conv[3](in5)
        f4 = self.inp_conv[2](out4)
        f3 = self.inp_conv[1](out3)
        f2 = self.inp_conv[0](out2)
        pan3 = f3 + self.pan_head_conv[0](f2)
        pan4 = f4 + self.pan_head_conv[1](pan3)
        pan5 = f5 + self.pan_head_conv[2](pan4)
        p2 = self.pan_lat_conv[0](f2)
        p3 = self.pan_lat_conv[1](pan3)
        p4 = self.pan_lat_conv[2](pan4)
        p5 = self.pan_lat_conv[3](pan5)
        if self.intracl:
            p5, p4, p3, p2 = self.incl4(p5), self.incl3(p4), self.incl2(p3), self.incl1(p2)
        return paddle.concat([upsample_nearest(p5, 8), upsample_nearest(p4, 4), upsample_nearest(p3, 2), p2],
                             axis=1)
