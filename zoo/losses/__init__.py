"""Losses that need more than a one-line functional call (detection and friends)."""
from zoo.losses.db_loss import MAIN_LOSS_TYPES, BalanceLoss, DBLoss, DiceLoss, MaskL1Loss

__all__ = ["MAIN_LOSS_TYPES", "BalanceLoss", "DBLoss", "DiceLoss", "MaskL1Loss"]
