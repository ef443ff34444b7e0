"""What every exporter shares: the error type whose message names the key, number checks, and the
network in the form it is deployed in."""
from __future__ import annotations

import copy

from paddle import nn

__all__ = ["PRECISION_REPORT", "PRECISION_PLOT", "ExportError", "floats", "in_deploy_form"]

# The precision check's files beside an fp16 / bf16 export (zoo/export/checked_export.py)
PRECISION_REPORT, PRECISION_PLOT = "precision_report.json", "precision_layers.png"


class ExportError(ValueError):
    """An export setting or input cannot be used; the message names the key."""


def floats(values, key: str, n: int = 3) -> list[float]:
    values = [float(v) for v in values]
    if len(values) != n:
        raise ExportError(f"{key}: expected {n} numbers, got {values}")
    return values


def _unfused(net: nn.Layer) -> list[nn.Layer]:
    """Re-parameterisable layers still in their training form: PaddleOCR's test, a ``rep()`` method and
    a false ``is_repped`` (``ppocr/utils/export_model.py``)."""
    return [layer for layer in net.sublayers(include_self=True)
            if callable(getattr(layer, "rep", None)) and getattr(layer, "is_repped", True) is False]


def in_deploy_form(net: nn.Layer) -> tuple[nn.Layer, int]:
    """``(network to export, layers fused)``: a copy of ``net`` whose re-parameterisable layers have
    called ``rep()`` (one conv with bias each, as PaddleOCR exports PP-OCRv4/v5), or ``net`` itself
    when it has none left to fuse. The copy leaves the caller's model trainable in its own form; its
    eval-mode outputs are the same (to float rounding)."""
    if not _unfused(net):
        return net, 0
    net = copy.deepcopy(net)
    pending = _unfused(net)
    for layer in pending:
        layer.rep()
    return net, len(pending)
