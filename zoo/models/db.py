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
- ``db_det_tiny``: MobileNetV3 small x0.35 with a 32-channel neck, for tests.
"""

from __future__ import annotations

from paddle import nn

from zoo.models.backbones import DetMobileNetV3, DetResNetVd
from zoo.models.heads import DBHead
from zoo.models.necks import DBFPN
from zoo.models.registry import register_model

__all__ = ["DBNet", "db_det", "db_det_r18", "db_det_r50", "db_det_tiny"]


class DBNet(nn.Layer):
    """Backbone (list of 4 maps) -> neck (one stride-4 map) -> DB head.

    Args:
        backbone: layer returning four maps at strides 4..32, with an
            ``out_channels`` list.
        neck: layer fusing them, with an int ``out_channels``.
        head: :class:`~zoo.models.heads.DBHead` (or any layer with its contract).

    ``forward`` returns the head's dict: ``{"maps": [N, 3, H, W]}`` (shrink,
    threshold, binary) in training mode, ``{"maps": [N, 1, H, W]}`` (shrink)
    in eval mode. H and W must be multiples of 32.
    """

    def __init__(self, backbone: nn.Layer, neck: nn.Layer, head: nn.Layer):
        super().__init__()
        self.backbone = backbone
        self.neck = neck
        self.head = head

    def forward(self, x):
        return self.head(self.neck(self.backbone(x)))


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
