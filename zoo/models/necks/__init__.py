"""Necks: layers fusing a backbone's multi-scale maps for a dense head."""

from zoo.models.necks.custom_pan import CustomCSPPAN
from zoo.models.necks.db_fpn import DBFPN
from zoo.models.necks.lkpan import LKPAN
from zoo.models.necks.rse_fpn import RSEFPN

__all__ = ["CustomCSPPAN", "DBFPN", "LKPAN", "RSEFPN"]
