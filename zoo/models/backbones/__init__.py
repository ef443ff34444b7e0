"""Feature-extracting backbones returning multi-scale maps (for detection necks)."""

from zoo.models.backbones.cspresnet import CSPResNet
from zoo.models.backbones.lcnetv3 import DetPPLCNetV3
from zoo.models.backbones.mobilenet_v3_det import DetMobileNetV3
from zoo.models.backbones.pphgnetv2 import DetPPHGNetV2
from zoo.models.backbones.resnet_vd_det import DetResNetVd

__all__ = ["CSPResNet", "DetMobileNetV3", "DetPPHGNetV2", "DetPPLCNetV3", "DetResNetVd"]
