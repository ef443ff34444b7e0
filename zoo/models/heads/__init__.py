"""Task heads mapping fused features to predictions."""

from zoo.models.heads.db_head import DBHead

__all__ = ["DBHead"]
