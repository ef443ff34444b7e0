"""RSEFPN: DB's feature pyramid with residual squeeze-excitation convs (PP-OCRv3..v5 mobile det).

The layout follows PaddleOCR ``ppocr/modeling/necks/db_fpn.py`` (classes ``RSELayer`` and
``RSEFPN``, without the optional ``intracl`` blocks): ``ins_conv.{i}`` (1x1 to ``out_channels``)
and ``inp_conv.{i}`` (3x3 to ``out_channels // 4``) are :class:`RSELayer` s, each a bias-free conv
``in_conv`` and a squeeze-excitation ``se_block`` (``conv1``/``conv2``, hard sigmoid slope 0.2)
added to the conv's output when ``shortcut``. The fusion is :class:`~zoo.models.necks.DBFPN`'s:
top-down sums with nearest upsampling, then the four maps upsampled to stride 4 and concatenated
deepest first.
"""

from __future__ import annotations

import paddle
from paddle import nn

from zoo.models.backbones.mobilenet_v3_det import SEModule
from zoo.models.necks.db_fpn import top_down, upsample_nearest

__all__ = ["RSEFPN", "RSELayer"]


class RSELayer(nn.Layer):
    """``in_conv`` then ``se_block``; with ``shortcut`` the SE output is added to the conv's."""

    def __init__(self, in_channels, out_channels, kernel, shortcut=True):
        super().__init__()
        self.in_conv = nn.Conv2D(in_channels, out_channels, kernel, padding=kernel // 2, bias_attr=False,
                                 weight_attr=paddle.ParamAttr(initializer=nn.initializer.KaimingUniform()))
        self.se_block = SEModule(out_channels)
        self.shortcut = shortcut

    def forward(self, x):
        x = self.in_conv(x)
        return x + self.se_block(x) if self.shortcut else self.se_block(x)


class RSEFPN(nn.Layer):
    """Fuse four maps at strides 4, 8, 16, 32 into one map at stride 4.

    Args:
        in_channels: channels of the four inputs, shallowest first.
        out_channels: lateral width (PP-OCRv4/v5 mobile det: 96); the output has
            ``4 * (out_channels // 4)`` channels, exposed as ``self.out_channels``.
        shortcut: the residual around each squeeze-excitation.
    """

    def __init__(self, in_channels, out_channels=96, shortcut=True):
        super().__init__()
        in_channels = list(in_channels)
        if len(in_channels) != 4:
            raise ValueError(f"RSEFPN needs 4 input channel counts, got {in_channels!r}")
        if out_channels < 4:
            raise ValueError(f"out_channels must be >= 4, got {out_channels!r}")
        self.ins_conv = nn.LayerList([RSELayer(c, out_channels, 1, shortcut) for c in in_channels])
        self.inp_conv = nn.LayerList([RSELayer(out_channels, out_channels // 4, 3, shortcut)
                                      for _ in in_channels])
        self.out_channels = 4 * (out_channels // 4)

    def forward(self, feats):
        """``feats`` = [c2, c3, c4, c5]; returns [N, out_channels, H/4, W/4]."""
        in5, out4, out3, out2 = top_down(self.ins_conv, feats)
        p5 = upsample_nearest(self.inp_conv[3](in5), 8)
        p4 = upsample_nearest(self.inp_conv[2](out4), 4)
        p3 = upsample_nearest(self.inp_conv[1](out3), 2)
        p2 = self.inp_conv[0](out2)
        return paddle.concat([p5, p4, p3, p2], axis=1)
