"""PPLCNetV3 for text detection (PP-OCRv4/v5 mobile det), with PaddleOCR's state-dict names.

The layout follows PaddleOCR ``ppocr/modeling/backbones/rec_lcnetv3.py`` (class ``PPLCNetV3`` with
``det=True``), so ``PP-OCRv5_mobile_det_pretrained.pdparams`` loads without renaming:

- ``conv1.conv|bn``: the strided 3x3 stem (conv + BatchNorm, no activation);
- ``blocks{2..6}.{i}.dw_conv|pw_conv``: :class:`LearnableRepLayer` (depthwise kxk, pointwise 1x1),
  each with ``conv_kxk.{0..3}.conv|bn``, ``conv_1x1.conv|bn`` (kxk only), ``identity`` (a BatchNorm,
  when the shape is kept), ``lab.scale|bias`` and ``act.lab.scale|bias``;
- ``blocks6.{0,1}.se.conv1|conv2``: squeeze-excitation;
- ``layer_list.{0..3}``: biased 1x1 convs narrowing the four outputs to ``int(c * scale)`` of
  (16, 24, 56, 480), MobileNetV3's det widths.

The re-parameterisable layers train in their multi-branch form; :meth:`LearnableRepLayer.rep`
folds the branches into one conv with bias (``reparam_conv``), as PaddleOCR's export does
(``ppocr/utils/export_model.py`` calls ``rep()`` on every layer having one).
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn
from paddle.regularizer import L2Decay

from zoo.models.backbones.mobilenet_v3_det import SEModule, make_divisible

__all__ = ["DetPPLCNetV3", "LearnableAffineBlock", "LearnableRepLayer"]

# Per stage: (kernel, in, out, stride, SE) at scale 1 (upstream NET_CONFIG_det).
_DET_STAGES = {
    "blocks2": [(3, 16, 32, 1, False)],
    "blocks3": [(3, 32, 64, 2, False), (3, 64, 64, 1, False)],
    "blocks4": [(3, 64, 128, 2, False), (3, 128, 128, 1, False)],
    "blocks5": [(3, 128, 256, 2, False)] + [(5, 256, 256, 1, False)] * 4,
    "blocks6": [(5, 256, 512, 2, True), (5, 512, 512, 1, True), (5, 512, 512, 1, False),
                (5, 512, 512, 1, False)],
}
_DET_OUT = (16, 24, 56, 480)
# Paddle's default hard sigmoid slope: upstream's SELayer uses nn.Hardsigmoid() as is.
_SE_SLOPE = 0.1666667


def _div16(v):
    return make_divisible(v, divisor=16)


class LearnableAffineBlock(nn.Layer):
    """``scale * x + bias`` with two scalar parameters, trained at ``lab_lr`` times the base LR."""

    def __init__(self, scale_value=1.0, bias_value=0.0, lab_lr=0.1):
        super().__init__()
        self.scale = self.create_parameter([1], attr=paddle.ParamAttr(learning_rate=lab_lr),
                                           default_initializer=nn.initializer.Constant(scale_value))
        self.bias = self.create_parameter([1], attr=paddle.ParamAttr(learning_rate=lab_lr),
                                          default_initializer=nn.initializer.Constant(bias_value))

    def forward(self, x):
        return self.scale * x + self.bias


class ConvBN(nn.Layer):
    """Bias-free conv + BatchNorm (``conv.*`` / ``bn.*``); the BN's affine terms are not decayed."""

    def __init__(self, in_ch, out_ch, kernel, stride=1, groups=1):
        super().__init__()
        self.conv = nn.Conv2D(in_ch, out_ch, kernel, stride=stride, padding=(kernel - 1) // 2,
                              groups=groups, bias_attr=False,
                              weight_attr=paddle.ParamAttr(initializer=nn.initializer.KaimingNormal()))
        self.bn = nn.BatchNorm2D(out_ch, weight_attr=paddle.ParamAttr(regularizer=L2Decay(0.0)),
                                 bias_attr=paddle.ParamAttr(regularizer=L2Decay(0.0)))

    def forward(self, x):
        return self.bn(self.conv(x))


class Act(nn.Layer):
    """Hardswish (or ReLU) followed by a :class:`LearnableAffineBlock` ``lab``."""

    def __init__(self, act="hswish", lab_lr=0.1):
        super().__init__()
        if act not in ("hswish", "relu"):
            raise ValueError(f"act must be 'hswish' or 'relu', got {act!r}")
        self._fn = F.hardswish if act == "hswish" else F.relu
        self.lab = LearnableAffineBlock(lab_lr=lab_lr)

    def forward(self, x):
        return self.lab(self._fn(x))


def _fuse_bn(kernel, bn):
    """``(kernel * gamma / std, beta - mean * gamma / std)``: a conv followed by ``bn`` as one conv."""
    std = paddle.sqrt(bn._variance + bn._epsilon)
    return kernel * (bn.weight / std).reshape([-1, 1, 1, 1]), bn.bias - bn._mean * bn.weight / std


class LearnableRepLayer(nn.Layer):
    """A MobileOne-style re-parameterisable conv: the sum of ``num_conv_branches`` kxk conv+BN
    branches, a 1x1 conv+BN branch (when k > 1) and a BatchNorm identity branch (when the shape is
    kept), then ``lab``, then ``act`` unless the layer is strided.

    :meth:`rep` replaces the branches by ``reparam_conv`` (one kxk conv with bias) computing the
    same eval-mode function; ``is_repped`` says which form the layer is in.
    """

    def __init__(self, in_ch, out_ch, kernel, stride=1, groups=1, num_conv_branches=1, lab_lr=0.1):
        super().__init__()
        self.is_repped = False
        self.in_ch, self.out_ch, self.kernel, self.stride, self.groups = in_ch, out_ch, kernel, stride, groups
        self.identity = nn.BatchNorm2D(in_ch) if in_ch == out_ch and stride == 1 else None
        self.conv_kxk = nn.LayerList([ConvBN(in_ch, out_ch, kernel, stride, groups)
                                      for _ in range(num_conv_branches)])
        self.conv_1x1 = ConvBN(in_ch, out_ch, 1, stride, groups) if kernel > 1 else None
        self.lab = LearnableAffineBlock(lab_lr=lab_lr)
        # Built for every layer (its names are in upstream's checkpoints) but used only at stride 1.
        self.act = Act(lab_lr=lab_lr)

    def forward(self, x):
        if self.is_repped:
            out = self.reparam_conv(x)
        else:
            out = 0  # summed in upstream's order: identity, 1x1, kxk
            if self.identity is not None:
                out = out + self.identity(x)
            if self.conv_1x1 is not None:
                out = out + self.conv_1x1(x)
            for conv in self.conv_kxk:
                out = out + conv(x)
        out = self.lab(out)
        return self.act(out) if self.stride != 2 else out

    def _kernel_bias(self):
        """The fused kxk kernel and bias of all branches (upstream's ``_get_kernel_bias``)."""
        kernel = bias = 0
        for branch in self.conv_kxk:
            k, b = _fuse_bn(branch.conv.weight, branch.bn)
            kernel, bias = kernel + k, bias + b
        pad = self.kernel // 2
        if self.conv_1x1 is not None:
            k, b = _fuse_bn(self.conv_1x1.conv.weight, self.conv_1x1.bn)
            kernel, bias = kernel + F.pad(k, [pad, pad, pad, pad]), bias + b
        if self.identity is not None:
            # The identity as a kxk conv: a 1 at the centre, on each channel's own input channel.
            per_group = self.in_ch // self.groups
            eye = np.zeros([self.in_ch, per_group, self.kernel, self.kernel], dtype=np.float32)
            eye[np.arange(self.in_ch), np.arange(self.in_ch) % per_group, pad, pad] = 1.0
            k, b = _fuse_bn(paddle.to_tensor(eye, dtype=self.identity.weight.dtype), self.identity)
            kernel, bias = kernel + k, bias + b
        return kernel, bias

    @paddle.no_grad()
    def rep(self):
        """Switch to the deploy form: one conv with bias, the branches deleted. Idempotent."""
        if self.is_repped:
            return
        kernel, bias = self._kernel_bias()
        self.reparam_conv = nn.Conv2D(self.in_ch, self.out_ch, self.kernel, stride=self.stride,
                                      padding=(self.kernel - 1) // 2, groups=self.groups)
        self.reparam_conv.weight.set_value(kernel)
        self.reparam_conv.bias.set_value(bias)
        # Unlike upstream, which keeps the dead branches, drop them: the state dict then holds what
        # the deploy form computes with, as the exported inference.pdiparams does.
        for name in ("conv_kxk", "conv_1x1", "identity"):
            delattr(self, name)
        self.is_repped = True


class LCNetV3Block(nn.Layer):
    """Depthwise :class:`LearnableRepLayer` ``dw_conv``, optional ``se``, pointwise ``pw_conv``."""

    def __init__(self, in_ch, out_ch, stride, dw_size, use_se=False, conv_kxk_num=4, lab_lr=0.1):
        super().__init__()
        self.dw_conv = LearnableRepLayer(in_ch, in_ch, dw_size, stride, groups=in_ch,
                                         num_conv_branches=conv_kxk_num, lab_lr=lab_lr)
        self.se = SEModule(in_ch, slope=_SE_SLOPE) if use_se else None
        self.pw_conv = LearnableRepLayer(in_ch, out_ch, 1, 1, num_conv_branches=conv_kxk_num, lab_lr=lab_lr)

    def forward(self, x):
        x = self.dw_conv(x)
        if self.se is not None:
            x = self.se(x)
        return self.pw_conv(x)


class DetPPLCNetV3(nn.Layer):
    """PPLCNetV3's detection layout: four maps at strides 4, 8, 16, 32.

    Args:
        in_channels: image channels.
        scale: width multiplier (PP-OCRv4/v5 mobile det: 0.75); widths round to multiples of 16.
        conv_kxk_num: kxk branches per re-parameterisable layer (upstream: 4).
        lab_lr: learning-rate factor of the learnable affine blocks (upstream: 0.1).

    ``out_channels`` lists the four output widths, e.g. [12, 18, 42, 360] at scale 0.75.
    """

    def __init__(self, in_channels=3, scale=0.75, conv_kxk_num=4, lab_lr=0.1):
        super().__init__()
        if not (isinstance(scale, (int, float)) and scale > 0):
            raise ValueError(f"scale must be a positive number, got {scale!r}")
        self.scale = scale
        self.conv1 = ConvBN(in_channels, _div16(16 * scale), 3, stride=2)
        widths = []
        for name, rows in _DET_STAGES.items():
            blocks = [LCNetV3Block(_div16(i * scale), _div16(o * scale), s, k, se, conv_kxk_num, lab_lr)
                      for k, i, o, s, se in rows]
            self.add_sublayer(name, nn.Sequential(*blocks))
            widths.append(_div16(rows[-1][2] * scale))
        self.out_channels = [int(c * scale) for c in _DET_OUT]
        self.layer_list = nn.LayerList([nn.Conv2D(w, c, 1) for w, c in zip(widths[1:], self.out_channels)])

    def forward(self, x):
        """Return the narrowed outputs of blocks3..blocks6, shallowest first."""
        x = self.blocks2(self.conv1(x))
        feats = []
        for name in ("blocks3", "blocks4", "blocks5", "blocks6"):
            x = getattr(self, name)(x)
            feats.append(x)
        # Narrowed after all blocks ran, as upstream: the order an exported program uses the weights in.
        return [narrow(f) for narrow, f in zip(self.layer_list, feats)]
