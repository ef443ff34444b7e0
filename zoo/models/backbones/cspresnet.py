"""CSPResNet, PP-YOLOE's backbone, with PaddleDetection's state-dict names.

Layout and defaults follow PaddleDetection ``ppdet/modeling/backbones/cspresnet.py``
(classes ``ConvBNLayer``, ``RepVggBlock``, ``BasicBlock``, ``EffectiveSELayer``,
``CSPResStage``, ``CSPResNet``), so ``backbone.stem.conv1.conv.weight``,
``backbone.stages.0.blocks.0.conv2.conv1.bn._mean`` etc. read as in the official
checkpoints. Channels and depths scale as upstream: ``max(round(c * width_mult), 1)``
(Python's ``round``). Differences: ``forward`` takes the image tensor (not a dict);
no re-parameterised deploy conv, no recompute. The layers are ``BatchNorm2D``, as upstream
builds them; upstream then trains PP-YOLOE with SyncBN (``norm_type: sync_bn`` in
``configs/ppyoloe/_base_/ppyoloe_crn.yml``: ``ppdet/engine/trainer.py`` converts every BatchNorm
with ``paddle.nn.SyncBatchNorm.convert_sync_batchnorm`` on more than one GPU). The zoo does the
same at run level, not here: ``trainer.sync_bn=true`` (on in ``experiment=ppyoloe_s_coco``;
:func:`zoo.utils.distributed.convert_sync_bn`). The state-dict names are the same either way.
"""

from __future__ import annotations

import paddle
from paddle import nn
from paddle.regularizer import L2Decay

__all__ = ["ConvBNLayer", "RepVggBlock", "BasicBlock", "EffectiveSELayer", "CSPResStage", "CSPResNet",
           "make_act"]


def make_act(act):
    """Activation layer by name: None -> identity, 'swish', 'relu', 'hardsigmoid', 'sigmoid'."""
    if act is None:
        return nn.Identity()
    if isinstance(act, nn.Layer):
        return act
    table = {"swish": nn.Swish, "silu": nn.Silu, "relu": nn.ReLU, "hardsigmoid": nn.Hardsigmoid,
             "sigmoid": nn.Sigmoid}
    if act not in table:
        raise ValueError(f"unknown activation {act!r}; expected one of {sorted(table)} or None")
    return table[act]()


class ConvBNLayer(nn.Layer):
    """Conv (no bias) -> BatchNorm -> activation; BN affine params carry no weight decay (upstream)."""

    def __init__(self, ch_in, ch_out, filter_size=3, stride=1, groups=1, padding=0, act=None):
        super().__init__()
        self.conv = nn.Conv2D(ch_in, ch_out, filter_size, stride=stride, padding=padding, groups=groups,
                              bias_attr=False)
        self.bn = nn.BatchNorm2D(ch_out, weight_attr=paddle.ParamAttr(regularizer=L2Decay(0.0)),
                                 bias_attr=paddle.ParamAttr(regularizer=L2Decay(0.0)))
        self.act = make_act(act)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class RepVggBlock(nn.Layer):
    """act(conv3x3-BN(x) + [alpha *] conv1x1-BN(x)); ``alpha`` is a trainable scalar when enabled."""

    def __init__(self, ch_in, ch_out, act="relu", alpha=False):
        super().__init__()
        self.conv1 = ConvBNLayer(ch_in, ch_out, 3, stride=1, padding=1, act=None)
        self.conv2 = ConvBNLayer(ch_in, ch_out, 1, stride=1, padding=0, act=None)
        self.act = make_act(act)
        if alpha:
            self.alpha = self.create_parameter(
                shape=[1], dtype="float32",
                attr=paddle.ParamAttr(initializer=nn.initializer.Constant(1.0)))
        else:
            self.alpha = None

    def forward(self, x):
        if self.alpha is not None:
            y = self.conv1(x) + self.alpha * self.conv2(x)
        else:
            y = self.conv1(x) + self.conv2(x)
        return self.act(y)


class BasicBlock(nn.Layer):
    """ConvBN 3x3 -> RepVggBlock, plus the input when ``shortcut``."""

    def __init__(self, ch_in, ch_out, act="relu", shortcut=True, use_alpha=False):
        super().__init__()
        if ch_in != ch_out:
            raise ValueError(f"BasicBlock needs ch_in == ch_out, got {ch_in} and {ch_out}")
        self.conv1 = ConvBNLayer(ch_in, ch_out, 3, stride=1, padding=1, act=act)
        self.conv2 = RepVggBlock(ch_out, ch_out, act=act, alpha=use_alpha)
        self.shortcut = shortcut

    def forward(self, x):
        y = self.conv2(self.conv1(x))
        return x + y if self.shortcut else y


class EffectiveSELayer(nn.Layer):
    """Effective SE (CenterMask): x * hardsigmoid(fc(mean_hw(x))).

    The spatial mean is ``reduce_mean`` as upstream, so an AMP black list naming
    ``reduce_mean`` (PaddleDetection's PP-YOLOE recipe) applies to it.
    """

    def __init__(self, channels, act="hardsigmoid"):
        super().__init__()
        self.fc = nn.Conv2D(channels, channels, kernel_size=1, padding=0)
        self.act = make_act(act)

    def forward(self, x):
        return x * self.act(self.fc(x.mean((2, 3), keepdim=True)))


class CSPResStage(nn.Layer):
    """Strided ConvBN down, split into two 1x1 branches (one through ``n`` BasicBlocks), concat, ESE, 1x1."""

    def __init__(self, block_fn, ch_in, ch_out, n, stride, act="relu", attn="eca", use_alpha=False):
        super().__init__()
        ch_mid = (ch_in + ch_out) // 2
        self.conv_down = ConvBNLayer(ch_in, ch_mid, 3, stride=2, padding=1, act=act) if stride == 2 else None
        self.conv1 = ConvBNLayer(ch_mid, ch_mid // 2, 1, act=act)
        self.conv2 = ConvBNLayer(ch_mid, ch_mid // 2, 1, act=act)
        self.blocks = nn.Sequential(*[
            block_fn(ch_mid // 2, ch_mid // 2, act=act, shortcut=True, use_alpha=use_alpha) for _ in range(n)])
        self.attn = EffectiveSELayer(ch_mid, act="hardsigmoid") if attn else None
        self.conv3 = ConvBNLayer(ch_mid, ch_out, 1, act=act)

    def forward(self, x):
        if self.conv_down is not None:
            x = self.conv_down(x)
        y = paddle.concat([self.conv1(x), self.blocks(self.conv2(x))], axis=1)
        if self.attn is not None:
            y = self.attn(y)
        return self.conv3(y)


class CSPResNet(nn.Layer):
    """Stem (stride 2) + four stride-2 CSPResStages; returns the maps of ``return_idx`` stages.

    Args:
        layers, channels: base depths per stage and widths (stem, stage 0..3), scaled by
            ``depth_mult`` / ``width_mult`` as upstream.
        use_large_stem: three 3x3 stem convs (PP-YOLOE) instead of two.
        in_channels: image channels.

    ``out_channels`` lists the returned maps' widths (strides 8, 16, 32 for the default ``return_idx``).
    """

    def __init__(self, layers=(3, 6, 6, 3), channels=(64, 128, 256, 512, 1024), act="swish",
                 return_idx=(1, 2, 3), use_large_stem=False, width_mult=1.0, depth_mult=1.0,
                 use_alpha=False, in_channels=3):
        super().__init__()
        channels = [max(round(c * width_mult), 1) for c in channels]
        layers = [max(round(n * depth_mult), 1) for n in layers]
        if len(layers) != len(channels) - 1:
            raise ValueError(f"CSPResNet: len(layers)={len(layers)} must be len(channels)-1={len(channels) - 1}")
        c0 = channels[0]
        stem = [("conv1", ConvBNLayer(in_channels, c0 // 2, 3, stride=2, padding=1, act=act))]
        if use_large_stem:
            stem += [("conv2", ConvBNLayer(c0 // 2, c0 // 2, 3, stride=1, padding=1, act=act)),
                     ("conv3", ConvBNLayer(c0 // 2, c0, 3, stride=1, padding=1, act=act))]
        else:
            stem += [("conv2", ConvBNLayer(c0 // 2, c0, 3, stride=1, padding=1, act=act))]
        self.stem = nn.Sequential(*stem)
        n = len(channels) - 1
        self.stages = nn.Sequential(*[
            (str(i), CSPResStage(BasicBlock, channels[i], channels[i + 1], layers[i], 2, act=act,
                                 use_alpha=use_alpha)) for i in range(n)])
        self.return_idx = list(return_idx)
        self.out_channels = [channels[i + 1] for i in self.return_idx]
        self.out_strides = [4 * 2 ** i for i in self.return_idx]

    def forward(self, x):
        x = self.stem(x)
        outs = []
        for idx, stage in enumerate(self.stages):
            x = stage(x)
            if idx in self.return_idx:
                outs.append(x)
        return outs
