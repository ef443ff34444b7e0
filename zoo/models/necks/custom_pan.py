"""CustomCSPPAN, PP-YOLOE's neck, with PaddleDetection's state-dict names.

Follows PaddleDetection ``ppdet/modeling/necks/custom_pan.py`` (``SPP``, ``CSPStage``,
``CustomCSPPAN``) for the configuration PP-YOLOE uses (``stage_fn='CSPStage'``,
``block_fn='BasicBlock'``, no DropBlock, no transformer encoder). Output widths scale as
``max(round(c * width_mult), 1)``, block count as ``max(round(block_num * depth_mult), 1)``.

Input: backbone maps at strides (8, 16, 32); output: fused maps ordered strides (32, 16, 8)
(upstream's order, matching the head's ``fpn_strides``), widths ``out_channels``.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

from zoo.models.backbones.cspresnet import BasicBlock, ConvBNLayer

__all__ = ["SPP", "CSPStage", "CustomCSPPAN"]


class SPP(nn.Layer):
    """Concat of x and stride-1 max pools (same padding), then a ConvBN."""

    def __init__(self, ch_in, ch_out, k, pool_size, act="swish"):
        super().__init__()
        self.pool = []
        for i, size in enumerate(pool_size):
            pool = nn.MaxPool2D(kernel_size=size, stride=1, padding=size // 2, ceil_mode=False)
            self.add_sublayer(f"pool{i}", pool)
            self.pool.append(pool)
        self.conv = ConvBNLayer(ch_in, ch_out, k, padding=k // 2, act=act)

    def forward(self, x):
        return self.conv(paddle.concat([x] + [pool(x) for pool in self.pool], axis=1))


class CSPStage(nn.Layer):
    """Two 1x1 branches, one through ``n`` BasicBlocks (no shortcut, optional SPP in the middle), concat, 1x1."""

    def __init__(self, ch_in, ch_out, n, act="swish", spp=False, use_alpha=False):
        super().__init__()
        ch_mid = int(ch_out // 2)
        self.conv1 = ConvBNLayer(ch_in, ch_mid, 1, act=act)
        self.conv2 = ConvBNLayer(ch_in, ch_mid, 1, act=act)
        self.convs = nn.Sequential()
        for i in range(n):
            self.convs.add_sublayer(str(i), BasicBlock(ch_mid, ch_mid, act=act, shortcut=False,
                                                       use_alpha=use_alpha))
            if spp and i == (n - 1) // 2:
                self.convs.add_sublayer("spp", SPP(ch_mid * 4, ch_mid, 1, [5, 9, 13], act=act))
        self.conv3 = ConvBNLayer(ch_mid * 2, ch_out, 1, act=act)

    def forward(self, x):
        y = paddle.concat([self.conv1(x), self.convs(self.conv2(x))], axis=1)
        return self.conv3(y)


def _stage(ch_in, ch_out, block_num, stage_num, act, spp, use_alpha):
    stage = nn.Sequential()
    for j in range(stage_num):
        stage.add_sublayer(str(j), CSPStage(ch_in if j == 0 else ch_out, ch_out, block_num, act=act,
                                            spp=spp, use_alpha=use_alpha))
    return stage


class CustomCSPPAN(nn.Layer):
    """Top-down (FPN) then bottom-up (PAN) CSP fusion.

    Args:
        in_channels: backbone widths at strides (8, 16, 32).
        out_channels: base output widths at strides (32, 16, 8), scaled by ``width_mult``.
        stage_num, block_num: CSPStages per level and BasicBlocks per CSPStage (``block_num``
            scaled by ``depth_mult``).
        spp: SPP inside the first (stride-32) FPN stage.
    """

    def __init__(self, in_channels=(256, 512, 1024), out_channels=(1024, 512, 256), act="swish",
                 stage_num=1, block_num=3, spp=False, width_mult=1.0, depth_mult=1.0, use_alpha=False):
        super().__init__()
        out_channels = [max(round(c * width_mult), 1) for c in out_channels]
        block_num = max(round(block_num * depth_mult), 1)
        if len(in_channels) != len(out_channels):
            raise ValueError(f"CustomCSPPAN: {len(in_channels)} input widths but {len(out_channels)} outputs")
        self.num_blocks = len(in_channels)
        self.out_channels = out_channels
        fpn_stages, fpn_routes = [], []
        ch_pre = None
        for i, (ch_in, ch_out) in enumerate(zip(list(in_channels)[::-1], out_channels)):
            if i > 0:
                ch_in += ch_pre // 2
            fpn_stages.append(_stage(ch_in, ch_out, block_num, stage_num, act, spp and i == 0, use_alpha))
            if i < self.num_blocks - 1:
                fpn_routes.append(ConvBNLayer(ch_out, ch_out // 2, 1, stride=1, padding=0, act=act))
            ch_pre = ch_out
        self.fpn_stages = nn.LayerList(fpn_stages)
        self.fpn_routes = nn.LayerList(fpn_routes)

        pan_stages, pan_routes = [], []
        for i in reversed(range(self.num_blocks - 1)):
            pan_routes.append(ConvBNLayer(out_channels[i + 1], out_channels[i + 1], 3, stride=2, padding=1,
                                          act=act))
            pan_stages.append(_stage(out_channels[i] + out_channels[i + 1], out_channels[i], block_num,
                                     stage_num, act, False, use_alpha))
        self.pan_stages = nn.LayerList(pan_stages[::-1])
        self.pan_routes = nn.LayerList(pan_routes[::-1])

    def forward(self, blocks):
        blocks = list(blocks)[::-1]
        fpn_feats = []
        route = None
        for i, block in enumerate(blocks):
            if i > 0:
                block = paddle.concat([route, block], axis=1)
            route = self.fpn_stages[i](block)
            fpn_feats.append(route)
            if i < self.num_blocks - 1:
                route = self.fpn_routes[i](route)
                # Nearest x2 stated as an output size (the same values as scale_factor=2): paddle2onnx
                # 2.1 cannot convert Paddle 3.3's float64 `scale` attribute (as zoo/models/necks/db_fpn.py).
                shape = paddle.shape(route)
                route = F.interpolate(route, size=[shape[2] * 2, shape[3] * 2], mode="nearest")
        pan_feats = [fpn_feats[-1]]
        route = fpn_feats[-1]
        for i in reversed(range(self.num_blocks - 1)):
            route = self.pan_stages[i](paddle.concat([self.pan_routes[i](route), fpn_feats[i]], axis=1))
            pan_feats.append(route)
        return pan_feats[::-1]
