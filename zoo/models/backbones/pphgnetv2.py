"""PP-HGNetV2 B4 for text detection (PP-OCRv5 server det), with PaddleOCR's state-dict names.

The layout follows PaddleOCR ``ppocr/modeling/backbones/rec_pphgnetv2.py`` (``PPHGNetV2_B4`` with
``det=True``), so ``PP-OCRv5_server_det_pretrained.pdparams`` and the backbone-only
``PPHGNetV2_B4_ocr_det.pdparams`` load without renaming:

- ``stem.stem1..stem4``: :class:`ConvBNAct` s; a 3x3 stride-2 conv, then two 2x2 convs ("SAME"
  padding) whose output is concatenated with a 2x2 stride-1 max pool of the first, a 3x3 stride-2
  conv and a 1x1 conv (stride 4 in all);
- ``stages.{0..3}``: an optional depthwise 3x3 stride-2 ``downsample`` (no activation; stage 0 has
  none in the det layout) and ``blocks.{j}`` (:class:`HGBlock`), each ``layer_num`` convs
  ``layers.{k}`` whose outputs are all concatenated with the block's input, then squeezed by two
  1x1 ``aggregation_*`` convs; blocks after the first add their input;
- ``last_conv``: a bias-free 2048->2048 1x1 conv that the det forward never uses, kept because
  upstream builds it (``use_last_conv`` defaults to True) and its checkpoints carry it.

The BatchNorms' affine terms are not decayed (``L2Decay(0)``), as upstream's ``ConvBNAct``.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn
from paddle.regularizer import L2Decay

__all__ = ["ConvBNAct", "DetPPHGNetV2", "HGBlock", "LightConvBNAct"]

# Per stage of B4 det: (in, mid, out, blocks, downsample, light, kernel, layer_num) (stride 2 each
# downsample); upstream's ``stage_config_det``.
_B4_DET_STAGES = (
    (48, 48, 128, 1, False, False, 3, 6),
    (128, 96, 512, 1, True, False, 3, 6),
    (512, 192, 1024, 3, True, True, 5, 6),
    (1024, 384, 2048, 1, True, True, 5, 6),
)
_B4_STEM = (32, 48)  # mid, out


class ConvBNAct(nn.Layer):
    """Bias-free conv + BatchNorm (``conv.*`` / ``bn.*``) + optional ReLU.

    ``padding="SAME"`` gives Paddle's asymmetric same padding (the stem's 2x2 convs); otherwise the
    padding is ``(kernel - 1) // 2``.
    """

    def __init__(self, in_ch, out_ch, kernel=3, stride=1, groups=1, act=True, padding=None):
        super().__init__()
        self.conv = nn.Conv2D(in_ch, out_ch, kernel, stride=stride,
                              padding=(kernel - 1) // 2 if padding is None else padding,
                              groups=groups, bias_attr=False,
                              weight_attr=paddle.ParamAttr(initializer=nn.initializer.KaimingNormal()))
        self.bn = nn.BatchNorm2D(out_ch, weight_attr=paddle.ParamAttr(regularizer=L2Decay(0.0)),
                                 bias_attr=paddle.ParamAttr(regularizer=L2Decay(0.0)))
        self.act = act

    def forward(self, x):
        x = self.bn(self.conv(x))
        return F.relu(x) if self.act else x


class LightConvBNAct(nn.Layer):
    """A 1x1 :class:`ConvBNAct` ``conv1`` (no activation), then a depthwise kxk one ``conv2``."""

    def __init__(self, in_ch, out_ch, kernel):
        super().__init__()
        self.conv1 = ConvBNAct(in_ch, out_ch, 1, act=False)
        self.conv2 = ConvBNAct(out_ch, out_ch, kernel, groups=out_ch)

    def forward(self, x):
        return self.conv2(self.conv1(x))


class StemBlock(nn.Layer):
    """The stride-4 stem (see the module doc)."""

    def __init__(self, in_ch, mid_ch, out_ch):
        super().__init__()
        self.stem1 = ConvBNAct(in_ch, mid_ch, 3, stride=2)
        self.stem2a = ConvBNAct(mid_ch, mid_ch // 2, 2, padding="SAME")
        self.stem2b = ConvBNAct(mid_ch // 2, mid_ch, 2, padding="SAME")
        self.stem3 = ConvBNAct(mid_ch * 2, mid_ch, 3, stride=2)
        self.stem4 = ConvBNAct(mid_ch, out_ch, 1)

    def forward(self, x):
        x = self.stem1(x)
        branch = self.stem2b(self.stem2a(x))
        pooled = F.max_pool2d(x, 2, stride=1, padding="SAME", ceil_mode=True)
        return self.stem4(self.stem3(paddle.concat([pooled, branch], axis=1)))


class HGBlock(nn.Layer):
    """``layer_num`` chained convs (:class:`LightConvBNAct` when ``light``), the input and every
    output concatenated, a 1x1 squeeze to ``out_ch // 2`` and a 1x1 excitation to ``out_ch``;
    ``identity`` adds the input (the shapes then agree)."""

    def __init__(self, in_ch, mid_ch, out_ch, kernel, layer_num, identity, light):
        super().__init__()
        self.identity = identity
        self.layers = nn.LayerList([
            LightConvBNAct(in_ch if i == 0 else mid_ch, mid_ch, kernel) if light
            else ConvBNAct(in_ch if i == 0 else mid_ch, mid_ch, kernel)
            for i in range(layer_num)])
        self.aggregation_squeeze_conv = ConvBNAct(in_ch + layer_num * mid_ch, out_ch // 2, 1)
        self.aggregation_excitation_conv = ConvBNAct(out_ch // 2, out_ch, 1)

    def forward(self, x):
        outs = [x]
        for layer in self.layers:
            outs.append(layer(outs[-1]))
        y = self.aggregation_excitation_conv(self.aggregation_squeeze_conv(paddle.concat(outs, axis=1)))
        return y + x if self.identity else y


class HGStage(nn.Layer):
    """Optional depthwise stride-2 ``downsample``, then ``blocks`` (a Sequential of :class:`HGBlock`)."""

    def __init__(self, in_ch, mid_ch, out_ch, block_num, downsample, light, kernel, layer_num):
        super().__init__()
        self.downsample = (ConvBNAct(in_ch, in_ch, 3, stride=2, groups=in_ch, act=False)
                           if downsample else None)
        self.blocks = nn.Sequential(*[
            HGBlock(in_ch if j == 0 else out_ch, mid_ch, out_ch, kernel, layer_num, j > 0, light)
            for j in range(block_num)])

    def forward(self, x):
        return self.blocks(self.downsample(x) if self.downsample is not None else x)


class DetPPHGNetV2(nn.Layer):
    """PP-HGNetV2 B4's detection layout: four maps at strides 4, 8, 16, 32.

    Args:
        in_channels: image channels.
        stages: per stage ``(in, mid, out, blocks, downsample, light, kernel, layer_num)``; B4 det
            by default (the only layout PaddleOCR's det configs use).
        last_conv: build the unused ``last_conv`` (True: upstream's checkpoints hold it).

    ``out_channels`` lists the four output widths: [128, 512, 1024, 2048] for B4.
    """

    def __init__(self, in_channels=3, stages=_B4_DET_STAGES, stem=_B4_STEM, last_conv=True):
        super().__init__()
        stages = [tuple(s) for s in stages]
        if len(stages) != 4 or any(len(s) != 8 for s in stages):
            raise ValueError(f"stages must be 4 rows of (in, mid, out, blocks, downsample, light, kernel, "
                             f"layer_num), got {stages!r}")
        self.stem = StemBlock(in_channels, stem[0], stem[1])
        self.stages = nn.LayerList([HGStage(*s) for s in stages])
        self.out_channels = [s[2] for s in stages]
        # Built, never called in det mode; the init matches the rest (Kaiming normal).
        self.last_conv = (nn.Conv2D(self.out_channels[-1], 2048, 1, bias_attr=False,
                                    weight_attr=paddle.ParamAttr(initializer=nn.initializer.KaimingNormal()))
                          if last_conv else None)

    def forward(self, x):
        """Return every stage's output, shallowest first."""
        x = self.stem(x)
        feats = []
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        return feats
