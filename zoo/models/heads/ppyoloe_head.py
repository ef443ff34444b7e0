"""PPYOLOEHead (network part), with PaddleDetection's state-dict names.

Follows PaddleDetection ``ppdet/modeling/heads/ppyoloe_head.py`` (``ESEAttn``, ``PPYOLOEHead``
with ``attn_conv='convbn'``, ``use_shared_conv=True``) and
``ppdet/modeling/assigners/utils.py::generate_anchors_for_grid_cell``:

- per level: ``avg = adaptive_avg_pool(feat)``; ``cls = pred_cls(stem_cls(feat, avg) + feat)``;
  ``reg = pred_reg(stem_reg(feat, avg))`` with ``4 * (reg_max + 1)`` channels, side-major
  (channel ``side * (reg_max + 1) + bin``, sides l, t, r, b);
- init: ESE fc weights N(0, 0.001); pred convs weight 0, cls bias ``-log((1 - 0.01) / 0.01)``,
  reg bias 1.0; ``proj_conv.weight`` = linspace(0, reg_max, reg_max + 1), stop_gradient (it is in
  the official checkpoints, so it is a parameter; keep it out of EMA/weight decay as upstream);
- anchors: centres ``(i + grid_cell_offset) * stride``, ATSS boxes centre +- ``grid_cell_scale *
  stride / 2``, levels in ``fpn_strides`` order (32, 16, 8), row-major (y, then x) inside a level.

Differences from upstream: the loss and assigners are not here; training mode returns
**pre-sigmoid** ``cls_logits`` (upstream returns sigmoid scores) so the loss can apply the sigmoid
in fp32 under AMP; eval mode returns boxes in input pixels (no rescale to the source image, no NMS).
"""

from __future__ import annotations

import math

import paddle
import paddle.nn.functional as F
from paddle import nn

from zoo.models.backbones.cspresnet import ConvBNLayer

__all__ = ["ESEAttn", "PPYOLOEHead", "generate_anchors", "expected_distances", "decode_distribution"]


class ESEAttn(nn.Layer):
    """ConvBN(feat * sigmoid(fc(avg_feat)))."""

    def __init__(self, feat_channels, act="swish"):
        super().__init__()
        self.fc = nn.Conv2D(feat_channels, feat_channels, 1,
                            weight_attr=paddle.ParamAttr(initializer=nn.initializer.Normal(0.0, 0.001)))
        self.conv = ConvBNLayer(feat_channels, feat_channels, 1, act=act)

    def forward(self, feat, avg_feat):
        return self.conv(feat * F.sigmoid(self.fc(avg_feat)))


def generate_anchors(feat_sizes, strides, grid_cell_scale=5.0, grid_cell_offset=0.5):
    """Anchors for feature maps of sizes ``[(h, w), ...]`` with ``strides``.

    Returns ``(anchors [A, 4] xyxy, anchor_points [A, 2] xy, num_anchors_list, stride_tensor [A, 1])``,
    all float32 in input pixels, levels concatenated in the given order, each level row-major.
    """
    anchors, points, strides_out, num_list = [], [], [], []
    for (h, w), stride in zip(feat_sizes, strides):
        half = grid_cell_scale * stride * 0.5
        shift_x = (paddle.arange(end=w, dtype="float32") + grid_cell_offset) * stride
        shift_y = (paddle.arange(end=h, dtype="float32") + grid_cell_offset) * stride
        yy, xx = paddle.meshgrid(shift_y, shift_x)
        point = paddle.stack([xx, yy], axis=-1).reshape([-1, 2])
        points.append(point)
        anchors.append(paddle.concat([point - half, point + half], axis=-1))
        num_list.append(int(h) * int(w))
        strides_out.append(paddle.full([int(h) * int(w), 1], stride, dtype="float32"))
    # Written out (no loop over the three tensors) so that paddle.jit's AST conversion can export it.
    anchors, points, stride_tensor = paddle.concat(anchors), paddle.concat(points), paddle.concat(strides_out)
    anchors.stop_gradient = points.stop_gradient = stride_tensor.stop_gradient = True
    return anchors, points, num_list, stride_tensor


def expected_distances(reg_distri, proj=None, reg_max=16):
    """``[N, A, 4 * (reg_max + 1)]`` logits -> ``[N, A, 4]`` ltrb distances in units of stride (fp32).

    Softmax over the bins of each side, then the expectation against ``proj`` (default
    ``0, 1, ..., reg_max``). Computed in float32 whatever the input dtype.
    """
    bins = reg_max + 1
    c = reg_distri.shape[-1]
    if c != 4 * bins:
        raise ValueError(f"reg_distri has {c} channels in its last axis, expected 4 * (reg_max + 1) = {4 * bins}")
    if proj is None:
        proj = paddle.arange(bins, dtype="float32")
    prob = F.softmax(reg_distri.astype("float32").reshape([0, 0, 4, bins]), axis=-1)
    return (prob * proj.astype("float32").reshape([bins])).sum(-1)


def decode_distribution(reg_distri, anchor_points, stride_tensor, proj=None, reg_max=16):
    """Raw distribution logits -> ``[N, A, 4]`` xyxy boxes in input pixels (float32).

    Convention (as upstream's ``_bbox_decode`` + ``batch_distance2bbox`` + ``* stride``): distances
    d = (l, t, r, b) in units of stride; ``p = anchor_points / stride``;
    box = ``(p - d[:2], p + d[2:]) * stride``.
    """
    dist = expected_distances(reg_distri, proj, reg_max)
    points = anchor_points / stride_tensor
    boxes = paddle.concat([points - dist[..., :2], points + dist[..., 2:]], axis=-1)
    return boxes * stride_tensor


_decode_distribution = decode_distribution


class PPYOLOEHead(nn.Layer):
    """ESE-attention stems and 3x3 prediction convs per level (no loss, no NMS).

    Args:
        in_channels: widths of the neck maps, in ``fpn_strides`` order.
        num_classes: number of classes C.
        fpn_strides: stride of each input map (upstream: 32, 16, 8).
        grid_cell_scale, grid_cell_offset: ATSS anchor size (in strides) and centre offset.
        reg_max: DFL bins are ``0..reg_max``.

    ``forward(feats)`` returns, in training mode, ``cls_logits [N, A, C]`` (pre-sigmoid),
    ``reg_distri [N, A, 4 * (reg_max + 1)]``, ``anchors``, ``anchor_points``, ``stride_tensor``,
    ``num_anchors_list``; in eval mode ``boxes [N, A, 4]`` (xyxy, input pixels) and
    ``scores [N, C, A]`` (sigmoid).
    """

    def __init__(self, in_channels=(1024, 512, 256), num_classes=80, act="swish", fpn_strides=(32, 16, 8),
                 grid_cell_scale=5.0, grid_cell_offset=0.5, reg_max=16, prior_prob=0.01):
        super().__init__()
        if len(in_channels) != len(fpn_strides):
            raise ValueError(f"PPYOLOEHead: {len(in_channels)} in_channels but {len(fpn_strides)} fpn_strides")
        self.in_channels = list(in_channels)
        self.num_classes = num_classes
        self.fpn_strides = list(fpn_strides)
        self.grid_cell_scale = grid_cell_scale
        self.grid_cell_offset = grid_cell_offset
        self.reg_max = reg_max
        self.stem_cls = nn.LayerList([ESEAttn(c, act=act) for c in in_channels])
        self.stem_reg = nn.LayerList([ESEAttn(c, act=act) for c in in_channels])
        zero = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0))
        cls_bias = paddle.ParamAttr(initializer=nn.initializer.Constant(-math.log((1 - prior_prob) / prior_prob)))
        reg_bias = paddle.ParamAttr(initializer=nn.initializer.Constant(1.0))
        self.pred_cls = nn.LayerList([
            nn.Conv2D(c, num_classes, 3, padding=1, weight_attr=zero, bias_attr=cls_bias) for c in in_channels])
        self.pred_reg = nn.LayerList([
            nn.Conv2D(c, 4 * (reg_max + 1), 3, padding=1, weight_attr=zero, bias_attr=reg_bias)
            for c in in_channels])
        self.proj_conv = nn.Conv2D(reg_max + 1, 1, 1, bias_attr=False)
        self.proj_conv.weight.set_value(paddle.linspace(0, reg_max, reg_max + 1).reshape([1, reg_max + 1, 1, 1]))
        self.proj_conv.weight.stop_gradient = True

    def forward(self, feats):
        if len(feats) != len(self.fpn_strides):
            raise ValueError(f"PPYOLOEHead got {len(feats)} maps, expected {len(self.fpn_strides)}")
        cls_list, reg_list, sizes = [], [], []
        for i, feat in enumerate(feats):
            sizes.append(tuple(feat.shape[2:]))
            avg = F.adaptive_avg_pool2d(feat, (1, 1))
            cls_logit = self.pred_cls[i](self.stem_cls[i](feat, avg) + feat)
            reg = self.pred_reg[i](self.stem_reg[i](feat, avg))
            cls_list.append(cls_logit.flatten(2).transpose([0, 2, 1]))
            reg_list.append(reg.flatten(2).transpose([0, 2, 1]))
        cls_logits = paddle.concat(cls_list, axis=1)
        reg_distri = paddle.concat(reg_list, axis=1)
        anchors, points, num_list, stride_tensor = generate_anchors(
            sizes, self.fpn_strides, self.grid_cell_scale, self.grid_cell_offset)
        if self.training:
            return {"cls_logits": cls_logits, "reg_distri": reg_distri, "anchors": anchors,
                    "anchor_points": points, "stride_tensor": stride_tensor, "num_anchors_list": num_list}
        boxes = self.decode_distribution(reg_distri, points, stride_tensor)
        return {"boxes": boxes, "scores": F.sigmoid(cls_logits.astype("float32")).transpose([0, 2, 1])}

    def decode_distribution(self, reg_distri, anchor_points, stride_tensor):
        """:func:`decode_distribution` with this head's ``proj_conv`` weights as the bin values."""
        # Through an alias: paddle.jit's AST conversion takes the same-named function for this method.
        return _decode_distribution(reg_distri, anchor_points, stride_tensor,
                                    proj=self.proj_conv.weight.reshape([-1]), reg_max=self.reg_max)
