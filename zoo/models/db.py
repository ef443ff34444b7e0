"""DB (Differentiable Binarization) text detectors, PaddleOCR-compatible.

:class:`DBNet` chains backbone -> neck -> head under the attribute names
PaddleOCR's ``BaseModel`` uses (``ppocr/modeling/architectures/base_model.py``),
so state-dict keys read ``backbone.*``, ``neck.*`` and ``head.*`` exactly as
in PaddleOCR's DB checkpoints, and a backbone-only checkpoint (keys without the
``backbone.`` prefix) loads with ``model.backbone.set_state_dict(state)``.

Registered models (each keyword can be overridden through ``create_model``):

- ``db_det``: PaddleOCR ``configs/det/det_mv3_db.yml`` (MobileNetV3 large x0.5
  with SE, DBFPN 256, DBHead k=50);
- ``db_det_r50``: ``configs/det/det_r50_vd_db.yml`` (ResNet50_vd);
- ``db_det_r18``: ``configs/det/det_res18_db_v2.0.yml`` (ResNet18_vd; its
  ``disable_se`` entry is ignored by upstream's ResNet_vd);
- ``db_det_tiny``: MobileNetV3 small x0.35 with a 32-channel neck, for tests;
- ``ppocrv5_mobile_det``: ``configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml`` (PPLCNetV3 x0.75 det,
  RSEFPN 96 with shortcut, DBHead k=50 with fix_nan);
- ``ppocrv4_mobile_det``: the same network (``PP-OCRv4_mobile_det.yml``), other weights;
- ``ppocrv5_server_det``: ``configs/det/PP-OCRv5/PP-OCRv5_server_det.yml`` (PPHGNetV2_B4 det,
  LKPAN 256 large with IntraCL blocks, PFHeadLocal k=50 mode large).

The PPLCNetV3 models train in their multi-branch form; :meth:`DBNet.rep` switches them to the
deploy form PaddleOCR exports (``zoo.create_model`` does so itself for a deploy-form
``inference.pdiparams``).
"""

from __future__ import annotations

from paddle import nn

from zoo.models.backbones import DetMobileNetV3, DetPPHGNetV2, DetPPLCNetV3, DetResNetVd
from zoo.models.heads import DBHead, PFHeadLocal
from zoo.models.necks import DBFPN, LKPAN, RSEFPN
from zoo.models.registry import register_model

__all__ = ["DBNet", "db_det", "db_det_r18", "db_det_r50", "db_det_tiny", "ppocrv4_mobile_det",
           "ppocrv5_mobile_det", "ppocrv5_server_det"]


class DBNet(nn.Layer):
    """Backbone (list of 4 maps) -> neck (one stride-4 map) -> DB head.

    Args:
        backbone: layer returning four maps at strides 4..32, with an
            ``out_channels`` list.
        neck: layer fusing them, with an int ``out_channels``.
        head: :class:`~zoo.models.heads.DBHead` (or any layer with its contract).

    ``forward`` returns the head's dict: ``{"maps": [N, 3, H, W]}`` (shrink,
    threshold, binary) in training mode, ``{"maps": [N, 1, H, W]}`` (shrink)
    in eval mode (:class:`~zoo.models.heads.PFHeadLocal` adds ``cbn_maps`` in
    training). H and W must be multiples of 32.
    """

    def __init__(self, backbone: nn.Layer, neck: nn.Layer, head: nn.Layer):
        super().__init__()
        self.backbone = backbone
        self.neck = neck
        self.head = head

    def forward(self, x):
        return self.head(self.neck(self.backbone(x)))

    def rep(self):
        """Switch every re-parameterisable layer to its deploy form (one conv with bias) and return
        the model; PaddleOCR's export does the same before saving (``ppocr/utils/export_model.py``).
        The eval-mode outputs do not change; the branches, and training them, are gone."""
        for layer in self.sublayers():
            if hasattr(layer, "rep") and not getattr(layer, "is_repped", False):
                layer.rep()
        return self


def _assemble(backbone, neck_channels, k):
    """Put a DBFPN and a DBHead on ``backbone``, wiring channels through ``out_channels``."""
    neck = DBFPN(backbone.out_channels, out_channels=neck_channels)
    return DBNet(backbone, neck, DBHead(neck.out_channels, k=k))


@register_model
def db_det(scale=0.5, model_name="large", disable_se=False, neck_channels=256, k=50,
           in_channels=3):
    """DB with PaddleOCR's detection MobileNetV3 (det_mv3_db: large x0.5, SE on)."""
    backbone = DetMobileNetV3(in_channels, model_name=model_name, scale=scale,
                              disable_se=disable_se)
    return _assemble(backbone, neck_channels, k)


@register_model
def db_det_r50(layers=50, neck_channels=256, k=50, in_channels=3):
    """DB with PaddleOCR's detection ResNet50_vd (det_r50_vd_db)."""
    return _assemble(DetResNetVd(in_channels, layers=layers), neck_channels, k)


@register_model
def db_det_r18(layers=18, neck_channels=256, k=50, in_channels=3):
    """DB with PaddleOCR's detection ResNet18_vd (det_res18_db_v2.0)."""
    return _assemble(DetResNetVd(in_channels, layers=layers), neck_channels, k)


@register_model
def db_det_tiny(scale=0.35, model_name="small", disable_se=False, neck_channels=32, k=50,
                in_channels=3):
    """A very small DB (MobileNetV3 small x0.35, 32-channel neck) for tests and smoke runs."""
    backbone = DetMobileNetV3(in_channels, model_name=model_name, scale=scale,
                              disable_se=disable_se)
    return _assemble(backbone, neck_channels, k)


def _lcnetv3_db(scale, conv_kxk_num, neck_channels, shortcut, k, fix_nan, in_channels):
    backbone = DetPPLCNetV3(in_channels, scale=scale, conv_kxk_num=conv_kxk_num)
    neck = RSEFPN(backbone.out_channels, out_channels=neck_channels, shortcut=shortcut)
    return DBNet(backbone, neck, DBHead(neck.out_channels, k=k, fix_nan=fix_nan))


@register_model
def ppocrv5_mobile_det(scale=0.75, conv_kxk_num=4, neck_channels=96, shortcut=True, k=50, fix_nan=True,
                       in_channels=3):
    """PP-OCRv5 mobile det: PPLCNetV3 x0.75 (det) + RSEFPN 96 + DBHead k=50, fix_nan."""
    return _lcnetv3_db(scale, conv_kxk_num, neck_channels, shortcut, k, fix_nan, in_channels)


@register_model
def ppocrv4_mobile_det(scale=0.75, conv_kxk_num=4, neck_channels=96, shortcut=True, k=50, fix_nan=True,
                       in_channels=3):
    """PP-OCRv4 mobile det: the network of :func:`ppocrv5_mobile_det` (PaddleOCR trained other weights)."""
    return _lcnetv3_db(scale, conv_kxk_num, neck_channels, shortcut, k, fix_nan, in_channels)


@register_model
def ppocrv5_server_det(neck_channels=256, intracl=True, k=50, mode="large", in_channels=3):
    """PP-OCRv5 server det: PPHGNetV2_B4 (det) + LKPAN 256 (large, IntraCL) + PFHeadLocal k=50 (large)."""
    backbone = DetPPHGNetV2(in_channels)
    neck = LKPAN(backbone.out_channels, out_channels=neck_channels, intracl=intracl)
    return DBNet(backbone, neck, PFHeadLocal(neck.out_channels, k=k, mode=mode))
