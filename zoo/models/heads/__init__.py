"""Task heads mapping fused features to predictions."""

from zoo.models.heads.db_head import DBHead
from zoo.models.heads.pf_head_local import PFHeadLocal
from zoo.models.heads.ppyoloe_head import PPYOLOEHead

__all__ = ["DBHead", "PFHeadLocal", "PPYOLOEHead"]
