"""What every exporter shares: the error type whose message names the key, and number checks."""
from __future__ import annotations

__all__ = ["PRECISION_REPORT", "PRECISION_PLOT", "ExportError", "floats"]

# The precision check's files beside an fp16 / bf16 export (zoo/export/checked_export.py)
PRECISION_REPORT, PRECISION_PLOT = "precision_report.json", "precision_layers.png"


class ExportError(ValueError):
    """An export setting or input cannot be used; the message names the key."""


def floats(values, key: str, n: int = 3) -> list[float]:
    values = [float(v) for v in values]
    if len(values) != n:
        raise ExportError(f"{key}: expected {n} numbers, got {values}")
    return values
