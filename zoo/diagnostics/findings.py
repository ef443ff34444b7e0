"""What a finding of the AMP doctor is: a severity, what, why and the line that fixes it.

Severity: ``will fail`` (the run cannot train or evaluate as configured: an fp16 forward overflow
on every step, gradients overflowing under a static scale, most of the gradient's signal flushed
under a static scale, every validation image's outputs non-finite), ``risky`` (it goes on but loses
something: gradient signal flushed, bf16 sums that cancel, values close to the format's max, some
validation outputs non-finite), ``note`` (no effect on the verdict, e.g. a dynamic scaler
calibrating down for a few steps). The verdict is the worst severity, ``OK`` when none.
Each finding also has a ``kind`` (``underflow``, ``forward overflow exp``, ...): the same problem
found again with a fix applied has the same kind (:mod:`zoo.diagnostics.fix_check`).
"""
from __future__ import annotations

SEVERITY = {"will fail": 2, "risky": 1, "note": 0}
RISKY_SHARE = 0.01      # gradient signal (share of the L2 norm) flushed above this share is risky
FAIL_SHARE = 0.10       # under a static scale, gradient signal flushed above this share fails


def finding(severity: str, what: str, why: str, fix: str, **data) -> dict:
    return {"severity": severity, "what": what, "why": why, "fix": fix, **data}


def verdict(findings: list[dict]) -> str:
    """The worst severity among ``findings``; ``OK`` when none is worse than a note."""
    worst = max((SEVERITY[f["severity"]] for f in findings), default=0)
    return {2: "will fail", 1: "risky", 0: "OK"}[worst]
