"""Losses that need more than a one-line functional call (detection and friends)."""
from zoo.losses.assigners import ATSSAssigner, TaskAlignedAssigner
from zoo.losses.db_loss import MAIN_LOSS_TYPES, BalanceLoss, DBLoss, DiceLoss, MaskL1Loss
from zoo.losses.ppyoloe_loss import PPYOLOELoss

__all__ = ["MAIN_LOSS_TYPES", "ATSSAssigner", "BalanceLoss", "DBLoss", "DiceLoss", "MaskL1Loss", "PPYOLOELoss",
           "TaskAlignedAssigner"]
