"""AMP-vs-FP32 accuracy parity report over finished run folders (``tools/report.py``).

runs.py loads and groups run folders, stats.py holds the numpy-only t distribution and TOST,
parity.py decides per group, render.py writes report.md / report.json / PNGs / index.html.
"""
from __future__ import annotations

from pathlib import Path

from zoo.report.runs import ReportInputError, group_runs, load_runs, mixed_provenance

__all__ = ["ReportInputError", "make_report"]


def make_report(inputs, out=None, delta=None, alpha=0.05, allow_mixed=False) -> tuple[int, str]:
    """Build the report for ``inputs`` (run or multirun folders) and return (exit code, Markdown).

    Exit code 0: every AMP group is "equivalent"; 1: some is not, or no AMP group was left to judge.
    Input problems raise ReportInputError (the caller maps it to exit code 2), and so do runs of
    different git revisions, library versions, data-set versions or configs (other than amp and
    seed) unless ``allow_mixed``: then the differences are listed in the report.
    """
    from zoo.report.parity import overall_ok, parity_table
    from zoo.report.render import write_report

    if delta is not None and not delta > 0:
        raise ReportInputError(f"--delta must be > 0, got {delta}")
    if not 0 < alpha < 0.5:
        raise ReportInputError(f"--alpha must be in (0, 0.5), got {alpha}")
    runs = load_runs(inputs)
    groups, aside = group_runs(runs)
    mixed = mixed_provenance(groups)
    if mixed and not allow_mixed:
        raise ReportInputError("runs are not comparable: " + "; ".join(mixed)
                               + ". Compare runs of one revision, library versions, data set and config, "
                               "or pass --allow-mixed")
    table = parity_table(groups, delta=delta, alpha=alpha)
    ok = overall_ok(table)
    first = Path(inputs[0])
    out = Path(out) if out else (first.parent if first.is_file() else first) / "report"
    if out.is_file():
        raise ReportInputError(f"{out}: is a file, cannot write the report folder there")
    md = write_report(out, table, aside, groups, ok, mixed)
    return (0 if ok else 1), md
