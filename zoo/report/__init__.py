"""AMP-vs-FP32 accuracy parity report over finished run folders (``tools/report.py``).

runs.py loads and groups run folders, stats.py holds the numpy-only t distribution and TOST,
parity.py decides per group, render.py writes report.md / report.json / PNGs / index.html.
"""
from __future__ import annotations

from pathlib import Path

from zoo.report.runs import ReportInputError, group_runs, load_runs

__all__ = ["ReportInputError", "make_report"]


def report_dir(inputs, out=None) -> Path:
    """Where :func:`make_report` writes: ``out``, else ``<first input>/report``."""
    first = Path(inputs[0])
    return Path(out) if out else (first.parent if first.is_file() else first) / "report"


def make_report(inputs, out=None, delta=None, alpha=0.05) -> tuple[int, str]:
    """Build the report for ``inputs`` (run or multirun folders) and return (exit code, Markdown).

    Exit code 0: every AMP group is "equivalent"; 1: some is not, or no AMP group was left to judge.
    Input problems raise ReportInputError (the caller maps it to exit code 2).
    """
    from zoo.report.parity import overall_ok, parity_table
    from zoo.report.render import write_report

    if delta is not None and not delta > 0:
        raise ReportInputError(f"--delta must be > 0, got {delta}")
    if not 0 < alpha < 0.5:
        raise ReportInputError(f"--alpha must be in (0, 0.5), got {alpha}")
    runs = load_runs(inputs)
    groups, aside = group_runs(runs)
    table = parity_table(groups, delta=delta, alpha=alpha)
    ok = overall_ok(table)
    out = report_dir(inputs, out)
    if out.is_file():
        raise ReportInputError(f"{out}: is a file, cannot write the report folder there")
    md = write_report(out, table, aside, groups, ok)
    return (0 if ok else 1), md
