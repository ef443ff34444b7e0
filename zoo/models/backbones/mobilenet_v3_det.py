"""PaddleOCR's detection MobileNetV3, with PaddleOCR's state-dict names.

The layout follows PaddleOCR ``ppocr/modeling/backbones/det_mobilenet_v3.py``
(class ``MobileNetV3``), so its DB checkpoints (e.g. ``det_mv3_db_v2.0_train``)
and the ``MobileNetV3_large_x0_5_pretrained`` backbone load without renaming:

- ``conv.conv.weight`` / ``conv.bn.{weight,bias,_mean,_variance}``: the strided
  3x3 stem, hardswish;
- ``stage{s}.{i}.expand_conv|bottleneck_conv|linear_conv.conv|bn``: inverted
  residual units (1x1 expand, depthwise kxk, 1x1 project), numbered from 0 in
  every stage;
- ``stage{s}.{i}.mid_se.conv1|conv2.{weight,bias}``: squeeze-excitation;
- ``stage3.{last}.conv|bn``: the final 1x1 conv to ``cls_ch_squeeze * scale``
  channels, appended to the last stage.

Stages are cut in front of every stride-2 unit, except the early ones of the
large model (the second unit is strided but stays in stage 0), so the four
outputs are at strides 4, 8, 16 and 32.
"""

from __future__ import annotations

import paddle.nn.functional as F
from paddle import nn

__all__ = ["DetMobileNetV3", "SEModule", "make_divisible"]

# Rows: kernel, expanded channels, output channels, SE, activation, stride
# (the standard MobileNetV3 tables, as in the upstream file).
_CONFIGS = {
    "large": ([
        (3, 16, 16, False, "relu", 1),
        (3, 64, 24, False, "relu", 2),
        (3, 72, 24, False, "relu", 1),
        (5, 72, 40, True, "relu", 2),
        (5, 120, 40, True, "relu", 1),
        (5, 120, 40, True, "relu", 1),
        (3, 240, 80, False, "hardswish", 2),
        (3, 200, 80, False, "hardswish", 1),
        (3, 184, 80, False, "hardswish", 1),
        (3, 184, 80, False, "hardswish", 1),
        (3, 480, 112, True, "hardswish", 1),
        (3, 672, 112, True, "hardswish", 1),
        (5, 672, 160, True, "hardswish", 2),
        (5, 960, 160, True, "hardswish", 1),
        (5, 960, 160, True, "hardswish", 1),
    ], 960),
    "small": ([
        (3, 16, 16, True, "relu", 2),
        (3, 72, 24, False, "relu", 2),
        (3, 88, 24, False, "relu", 1),
        (5, 96, 40, True, "hardswish", 2),
        (5, 240, 40, True, "hardswish", 1),
        (5, 240, 40, True, "hardswish", 1),
        (5, 120, 48, True, "hardswish", 1),
        (5, 144, 48, True, "hardswish", 1),
        (5, 288, 96, True, "hardswish", 2),
        (5, 576, 96, True, "hardswish", 1),
        (5, 576, 96, True, "hardswish", 1),
    ], 576),
}
# A stride-2 unit at index <= this stays in the current stage (see module doc).
_FIRST_CUT_AFTER = {"large": 2, "small": 0}
_ACTS = {"relu": F.relu, "hardswish": F.hardswish, None: None}


def make_divisible(v, divisor=8, min_value=None):
    """Round ``v`` to the nearest multiple of ``divisor`` (never below it), losing < 10 %."""
    min_value = divisor if min_value is None else min_value
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class ConvBNAct(nn.Layer):
    """Conv (no bias) + BatchNorm + optional activation, persisted as ``conv.*`` / ``bn.*``."""

    def __init__(self, in_ch, out_ch, kernel, stride=1, groups=1, act=None):
        super().__init__()
        if act not in _ACTS:
            raise ValueError(f"unknown activation {act!r}; allowed: relu, hardswish, None")
        self.conv = nn.Conv2D(in_ch, out_ch, kernel, stride=stride, padding=(kernel - 1) // 2,
                              groups=groups, bias_attr=False)
        self.bn = nn.BatchNorm2D(out_ch)
        self._act = _ACTS[act]

    def forward(self, x):
        x = self.bn(self.conv(x))
        return self._act(x) if self._act is not None else x


class SEModule(nn.Layer):
    """Squeeze-excitation with biased 1x1 convs ``conv1``/``conv2`` and hard sigmoid gating.

    ``slope`` is the hard sigmoid's: 0.2 in PaddleOCR's MobileNetV3 and DB necks (what their
    released weights were trained with), Paddle's default 0.1666667 in PPLCNetV3's ``SELayer``.
    """

    def __init__(self, channels, reduction=4, slope=0.2):
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2D(1)
        self.conv1 = nn.Conv2D(channels, channels // reduction, 1)
        self.conv2 = nn.Conv2D(channels // reduction, channels, 1)
        self.slope = slope

    def forward(self, x):
        w = F.relu(self.conv1(self.avg_pool(x)))
        return x * F.hardsigmoid(self.conv2(w), slope=self.slope, offset=0.5)


class ResidualUnit(nn.Layer):
    """Inverted residual: 1x1 expand, depthwise kxk (strided), optional SE, 1x1 linear."""

    def __init__(self, in_ch, mid_ch, out_ch, kernel, stride, use_se, act):
        super().__init__()
        self.use_shortcut = stride == 1 and in_ch == out_ch
        self.expand_conv = ConvBNAct(in_ch, mid_ch, 1, act=act)
        self.bottleneck_conv = ConvBNAct(mid_ch, mid_ch, kernel, stride, groups=mid_ch, act=act)
        self.mid_se = SEModule(mid_ch) if use_se else None
        self.linear_conv = ConvBNAct(mid_ch, out_ch, 1, act=None)

    def forward(self, x):
        y = self.bottleneck_conv(self.expand_conv(x))
        if self.mid_se is not None:
            y = self.mid_se(y)
        y = self.linear_conv(y)
        return x + y if self.use_shortcut else y


class DetMobileNetV3(nn.Layer):
    """MobileNetV3 feature extractor returning four maps (strides 4, 8, 16, 32).

    Args:
        in_channels: image channels.
        model_name: "large" or "small".
        scale: width multiplier; PaddleOCR ships 0.35, 0.5, 0.75, 1.0 and 1.25,
            any positive value builds.
        disable_se: drop every squeeze-excitation block (PaddleOCR's option for
            faster inference; changes the state-dict keys accordingly).

    ``out_channels`` lists the channels of the four outputs, e.g. [16, 24, 56,
    480] for large x0.5.
    """

    def __init__(self, in_channels=3, model_name="large", scale=0.5, disable_se=False):
        super().__init__()
        if model_name not in _CONFIGS:
            raise ValueError(f"unknown model_name {model_name!r}; allowed: {sorted(_CONFIGS)}")
        if not (isinstance(scale, (int, float)) and scale > 0):
            raise ValueError(f"scale must be a positive number, got {scale!r}")
        cfg, last_ch = _CONFIGS[model_name]
        self.model_name, self.scale, self.disable_se = model_name, scale, disable_se

        in_ch = make_divisible(16 * scale)
        self.conv = ConvBNAct(in_channels, in_ch, 3, stride=2, act="hardswish")

        stages, units = [], []
        self.out_channels = []
        for i, (k, exp, c, se, act, s) in enumerate(cfg):
            if s == 2 and i > _FIRST_CUT_AFTER[model_name]:
                stages.append(units)
                self.out_channels.append(in_ch)
                units = []
            out_ch = make_divisible(scale * c)
            units.append(ResidualUnit(in_ch, make_divisible(scale * exp), out_ch, k, s,
                                      use_se=se and not disable_se, act=act))
            in_ch = out_ch
        last = make_divisible(scale * last_ch)
        units.append(ConvBNAct(in_ch, last, 1, act="hardswish"))
        stages.append(units)
        self.out_channels.append(last)
        self._num_stages = len(stages)
        for s, stage_units in enumerate(stages):
            self.add_sublayer(f"stage{s}", nn.Sequential(*stage_units))

    def forward(self, x):
        """Return the list of the stage outputs, shallowest first."""
        x = self.conv(x)
        outs = []
        for s in range(self._num_stages):
            x = getattr(self, f"stage{s}")(x)
            outs.append(x)
        return outs
