"""PP-YOLOE detectors (CSPResNet + CustomCSPPAN + PPYOLOEHead), PaddleDetection-compatible names.

:class:`PPYOLOE` holds ``backbone``, ``neck`` and ``yolo_head`` as PaddleDetection's ``YOLOv3``
architecture does, so official checkpoints (e.g. ``ppyoloe_crn_s_300e_coco.pdparams``) load by
name; their extra ``yolo_head.anchor_points`` / ``yolo_head.stride_tensor`` entries are not
model state and are reported as unexpected. Configuration as ``configs/ppyoloe/_base_/ppyoloe_crn.yml``:
CSPResNet layers (3, 6, 6, 3), channels (64, ..., 1024), large stem; CustomCSPPAN out (768, 384, 192),
1 stage, 3 blocks, SPP; head strides (32, 16, 8), grid cell 5.0 / 0.5, reg_max 16; swish.

Registered: ``ppyoloe_s/m/l/x`` (width/depth 0.50/0.33, 0.75/0.67, 1.0/1.0, 1.25/1.33, as the
upstream ``ppyoloe_crn_{s,m,l,x}_300e_coco.yml``) and ``ppyoloe_tiny`` (width 0.25, depth 0.33,
for tests).

Outputs (see :class:`zoo.models.heads.PPYOLOEHead`): train mode ``cls_logits`` (pre-sigmoid, unlike
upstream), ``reg_distri``, anchors; eval mode ``boxes`` (xyxy, input pixels) and ``scores`` [N, C, A].
A loss decodes ``reg_distri`` with :func:`zoo.models.heads.ppyoloe_head.decode_distribution`.
"""

from __future__ import annotations

from paddle import nn

from zoo.models.backbones.cspresnet import CSPResNet
from zoo.models.heads.ppyoloe_head import PPYOLOEHead
from zoo.models.necks.custom_pan import CustomCSPPAN
from zoo.models.registry import register_model

__all__ = ["PPYOLOE", "build_ppyoloe", "ppyoloe_s", "ppyoloe_m", "ppyoloe_l", "ppyoloe_x", "ppyoloe_tiny"]


class PPYOLOE(nn.Layer):
    """Backbone -> neck -> head; ``forward(images [N, 3, H, W])`` with H, W multiples of 32."""

    def __init__(self, backbone: nn.Layer, neck: nn.Layer, yolo_head: nn.Layer):
        super().__init__()
        self.backbone = backbone
        self.neck = neck
        self.yolo_head = yolo_head

    def forward(self, x):
        h, w = x.shape[-2:]
        if (h > 0 and h % 32) or (w > 0 and w % 32):
            raise ValueError(f"PP-YOLOE input height and width must be multiples of 32, got {h}x{w}")
        return self.yolo_head(self.neck(self.backbone(x)))


def build_ppyoloe(width_mult=1.0, depth_mult=1.0, num_classes=80, act="swish", use_alpha=False,
                  reg_max=16, grid_cell_scale=5.0, grid_cell_offset=0.5, in_channels=3) -> PPYOLOE:
    """PP-YOLOE crn with the given width/depth multipliers; channels chained through ``out_channels``."""
    backbone = CSPResNet(layers=(3, 6, 6, 3), channels=(64, 128, 256, 512, 1024), act=act,
                         return_idx=(1, 2, 3), use_large_stem=True, width_mult=width_mult,
                         depth_mult=depth_mult, use_alpha=use_alpha, in_channels=in_channels)
    neck = CustomCSPPAN(backbone.out_channels, out_channels=(768, 384, 192), act=act, stage_num=1,
                        block_num=3, spp=True, width_mult=width_mult, depth_mult=depth_mult,
                        use_alpha=use_alpha)
    head = PPYOLOEHead(neck.out_channels, num_classes=num_classes, act=act, fpn_strides=(32, 16, 8),
                       grid_cell_scale=grid_cell_scale, grid_cell_offset=grid_cell_offset, reg_max=reg_max)
    return PPYOLOE(backbone, neck, head)


def _variant(name: str, width_mult: float, depth_mult: float, doc: str):
    """Register ``name(num_classes=80, **kw)``: :func:`build_ppyoloe` with these multipliers as defaults."""
    def build(num_classes=80, **kw):
        return build_ppyoloe(**{"width_mult": width_mult, "depth_mult": depth_mult, **kw}, num_classes=num_classes)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = doc
    return register_model(build)


ppyoloe_s = _variant("ppyoloe_s", 0.50, 0.33, "PP-YOLOE crn-s (ppyoloe_crn_s_300e_coco: width 0.50, depth 0.33).")
ppyoloe_m = _variant("ppyoloe_m", 0.75, 0.67, "PP-YOLOE crn-m (width 0.75, depth 0.67).")
ppyoloe_l = _variant("ppyoloe_l", 1.0, 1.0, "PP-YOLOE crn-l (width 1.0, depth 1.0).")
ppyoloe_x = _variant("ppyoloe_x", 1.25, 1.33, "PP-YOLOE crn-x (width 1.25, depth 1.33).")
ppyoloe_tiny = _variant("ppyoloe_tiny", 0.25, 0.33, "A small PP-YOLOE (width 0.25, depth 0.33) for tests.")
