"""ResNet 18/34/50/101 in the "b" and "vd" flavours, PaddleClas-compatible.

Layer names and shapes follow PaddleClas's legendary ResNet
(``ppcls/arch/backbone/legendary_models/resnet.py``, class ``ResNet``), so its
published ``.pdparams`` load with ``set_state_dict`` without renaming:

- ``stem.{i}.conv.weight`` / ``stem.{i}.bn.{weight,bias,_mean,_variance}``:
  one 7x7 conv (b) or three 3x3 convs 32, 32, 64 (vd), first one strided;
- ``blocks.{k}.conv{0,1[,2]}.conv|bn``: one flat ``blocks`` sequence, the index
  ``k`` running on across stages (blocks.0..15 for ResNet50);
- ``blocks.{k}.short.conv|bn``: a projection on the first block of *every*
  stage, including stage 0 of ResNet18/34 where the channel count does not
  change (PaddleClas always builds it there);
- ``fc.weight [C, num_classes]`` (Paddle ``Linear`` is in x out), ``fc.bias``.

Variants: in "b" the projection is a strided 1x1 conv; in "vd" it is a 2x2
average pool (ceil mode) followed by a stride-1 1x1 conv, except for the very
first block, which keeps a plain 1x1 conv. In both, the bottleneck's 3x3 conv
(conv1) carries the stride.
"""

from __future__ import annotations

import math

import paddle
from paddle import nn

from zoo.models.registry import register_model

__all__ = ["ResNet", "BasicBlock", "BottleneckBlock", "ConvBN"]

# depth -> (block kind, blocks per stage), as in PaddleClas NET_CONFIG.
_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
}
_VARIANTS = ("b", "vd")
_DEFAULT_WIDTHS = (64, 128, 256, 512)


class ConvBN(nn.Layer):
    """Conv (no bias) + BatchNorm + optional ReLU, persisted as ``conv.*`` / ``bn.*``.

    With ``avg_down`` the spatial stride is taken by a 2x2 average pool in
    front of a stride-1 conv (the "vd" shortcut). ``exclusive`` averaging in
    ceil mode matches PaddleClas's SAME-padded pool on odd sizes too.
    """

    def __init__(self, in_ch, out_ch, kernel, stride=1, act=True, avg_down=False):
        super().__init__()
        use_pool = avg_down and stride > 1
        self.pool = nn.AvgPool2D(2, stride, ceil_mode=True) if use_pool else None
        self.conv = nn.Conv2D(
            in_ch, out_ch, kernel, stride=1 if use_pool else stride,
            padding=(kernel - 1) // 2, bias_attr=False,
        )
        self.bn = nn.BatchNorm2D(out_ch)
        self.act = nn.ReLU() if act else None

    def forward(self, x):
        if self.pool is not None:
            x = self.pool(x)
        x = self.bn(self.conv(x))
        return self.act(x) if self.act is not None else x


class BasicBlock(nn.Layer):
    """Two 3x3 convs; the first one carries the stride."""

    expansion = 1

    def __init__(self, in_ch, width, stride=1, project=False, avg_down=False):
        super().__init__()
        self.conv0 = ConvBN(in_ch, width, 3, stride)
        self.conv1 = ConvBN(width, width, 3, act=False)
        self.short = (
            ConvBN(in_ch, width, 1, stride, act=False, avg_down=avg_down)
            if project else None
        )
        self.relu = nn.ReLU()

    def forward(self, x):
        identity = x if self.short is None else self.short(x)
        return self.relu(self.conv1(self.conv0(x)) + identity)


class BottleneckBlock(nn.Layer):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4."""

    expansion = 4

    def __init__(self, in_ch, width, stride=1, project=False, avg_down=False):
        super().__init__()
        out_ch = width * self.expansion
        self.conv0 = ConvBN(in_ch, width, 1)
        self.conv1 = ConvBN(width, width, 3, stride)
        self.conv2 = ConvBN(width, out_ch, 1, act=False)
        self.short = (
            ConvBN(in_ch, out_ch, 1, stride, act=False, avg_down=avg_down)
            if project else None
        )
        self.relu = nn.ReLU()

    def forward(self, x):
        identity = x if self.short is None else self.short(x)
        return self.relu(self.conv2(self.conv1(self.conv0(x))) + identity)


def _check_int_list(name, value, length=4):
    """Return ``value`` as a tuple of ``length`` positive ints, or raise ValueError."""
    items = tuple(value)
    if len(items) != length or not all(isinstance(v, int) and v > 0 for v in items):
        raise ValueError(f"{name} must be {length} positive ints, got {value!r}")
    return items


class ResNet(nn.Layer):
    """ResNet classifier with PaddleClas state-dict names.

    Args:
        depth: 18, 34, 50 or 101; picks the block type and default stage depths.
        variant: "b" (7x7 stem, strided 1x1 shortcut) or "vd" (3x3x3 stem,
            avg-pool shortcut).
        num_classes: size of the ``fc`` output.
        in_channels: image channels.
        widths: per-stage block width (default 64, 128, 256, 512); the stem
            ends with ``widths[0]`` channels, as upstream.
        stage_depths: blocks per stage, overriding the depth's default.

    ``out_channels`` is the channel count of the final feature map.
    """

    def __init__(self, depth, variant="b", num_classes=1000, in_channels=3,
                 widths=None, stage_depths=None):
        super().__init__()
        if depth not in _DEPTHS:
            raise ValueError(f"unknown ResNet depth {depth!r}; allowed: {sorted(_DEPTHS)}")
        if variant not in _VARIANTS:
            raise ValueError(f"unknown ResNet variant {variant!r}; allowed: {list(_VARIANTS)}")
        for name, val in (("num_classes", num_classes), ("in_channels", in_channels)):
            if not isinstance(val, int) or val <= 0:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        kind, default_depths = _DEPTHS[depth]
        widths = _check_int_list("widths", _DEFAULT_WIDTHS if widths is None else widths)
        stage_depths = _check_int_list(
            "stage_depths", default_depths if stage_depths is None else stage_depths)
        block_cls = BasicBlock if kind == "basic" else BottleneckBlock

        self.depth, self.variant = depth, variant
        self.stem = self._make_stem(variant, in_channels, widths[0])
        self.max_pool = nn.MaxPool2D(kernel_size=3, stride=2, padding=1)
        self.blocks, self.out_channels = self._make_blocks(
            block_cls, widths, stage_depths, variant, in_ch=widths[0])
        self.avg_pool = nn.AdaptiveAvgPool2D(1)
        self.flatten = nn.Flatten()
        # Same uniform fan-in init as upstream, so fresh heads train alike.
        bound = 1.0 / math.sqrt(self.out_channels)
        self.fc = nn.Linear(
            self.out_channels, num_classes,
            weight_attr=paddle.ParamAttr(initializer=nn.initializer.Uniform(-bound, bound)),
        )

    @staticmethod
    def _make_stem(variant, in_ch, out_ch):
        if variant == "b":
            return nn.Sequential(ConvBN(in_ch, out_ch, 7, stride=2))
        mid = max(1, out_ch // 2)  # 32 for the standard 64-wide stem
        return nn.Sequential(
            ConvBN(in_ch, mid, 3, stride=2),
            ConvBN(mid, mid, 3),
            ConvBN(mid, out_ch, 3),
        )

    @staticmethod
    def _make_blocks(block_cls, widths, stage_depths, variant, in_ch):
        """One flat Sequential so block indices continue across stages."""
        blocks = []
        for stage, (width, count) in enumerate(zip(widths, stage_depths)):
            for i in range(count):
                first = i == 0
                blocks.append(block_cls(
                    in_ch, width,
                    stride=2 if first and stage > 0 else 1,
                    project=first,
                    # The very first block has no stride, so no pool either.
                    avg_down=variant == "vd" and not (first and stage == 0),
                ))
                in_ch = width * block_cls.expansion
        return nn.Sequential(*blocks), in_ch

    def forward_features(self, x):
        """Return the last feature map, [N, out_channels, H/32, W/32]."""
        return self.blocks(self.max_pool(self.stem(x)))

    def forward(self, x):
        """Return logits [N, num_classes]."""
        return self.fc(self.flatten(self.avg_pool(self.forward_features(x))))


@register_model
def resnet18(**kwargs):
    """ResNet-18 (b); kwargs go to :class:`ResNet`."""
    return ResNet(18, "b", **kwargs)


@register_model
def resnet34(**kwargs):
    """ResNet-34 (b); kwargs go to :class:`ResNet`."""
    return ResNet(34, "b", **kwargs)


@register_model
def resnet50(**kwargs):
    """ResNet-50 (b), PaddleClas ``ResNet50`` layout; kwargs go to :class:`ResNet`."""
    return ResNet(50, "b", **kwargs)


@register_model
def resnet101(**kwargs):
    """ResNet-101 (b); kwargs go to :class:`ResNet`."""
    return ResNet(101, "b", **kwargs)


@register_model
def resnet18_vd(**kwargs):
    """ResNet-18-vd; kwargs go to :class:`ResNet`."""
    return ResNet(18, "vd", **kwargs)


@register_model
def resnet34_vd(**kwargs):
    """ResNet-34-vd; kwargs go to :class:`ResNet`."""
    return ResNet(34, "vd", **kwargs)


@register_model
def resnet50_vd(**kwargs):
    """ResNet-50-vd, PaddleClas ``ResNet50_vd`` layout; kwargs go to :class:`ResNet`."""
    return ResNet(50, "vd", **kwargs)


@register_model
def resnet101_vd(**kwargs):
    """ResNet-101-vd; kwargs go to :class:`ResNet`."""
    return ResNet(101, "vd", **kwargs)


@register_model
def resnet_tiny(**kwargs):
    """A ~80k-parameter vd ResNet (basic blocks, one per stage) for tests.

    Every argument of :class:`ResNet` may be overridden through kwargs.
    """
    config = dict(depth=18, variant="vd", widths=(8, 16, 32, 64), stage_depths=(1, 1, 1, 1))
    config.update(kwargs)
    return ResNet(**config)
