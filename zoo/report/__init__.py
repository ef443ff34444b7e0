"""AMP-vs-FP32 accuracy parity report over finished run folders (``tools/report.py``).

runs.py loads and groups run folders and checks they may be compared, stats.py holds the numpy-only
t distribution, TOST (Welch and paired) and the TOST sample size, parity.py pairs runs and decides
per group, details.py words each comparison, render.py writes report.md / report.json / PNGs /
index.html.
"""
from __future__ import annotations

from pathlib import Path

from zoo.report.parity import load_margins, overall_ok, parity_table
from zoo.report.render import write_report
from zoo.report.runs import ReportInputError, group_runs, load_runs, mixed_provenance
from zoo.utils.checks import POSITIVE, check

__all__ = ["ReportInputError", "make_report"]


def report_dir(inputs, out=None) -> Path:
    """Where :func:`make_report` writes: ``out``, else ``<first input>/report``."""
    first = Path(inputs[0])
    return Path(out) if out else (first.parent if first.is_file() else first) / "report"


def make_report(inputs, margins_file, out=None, delta=None, alpha=0.05, allow_mixed=False,
                finished_only: bool = False) -> tuple[int, str]:
    """Build the report for ``inputs`` (run or multirun folders) and return (exit code, Markdown).

    Exit code 0: every AMP group is "equivalent"; 1: some is not, or no AMP group was left to judge.
    Input problems raise ReportInputError (the caller maps it to exit code 2), and so do runs of
    different git revisions, library versions, data-set versions or configs (other than amp and
    seed) unless ``allow_mixed``: then the differences are listed in the report.
    """

    if delta is not None:
        check("--delta", delta, POSITIVE, ReportInputError)
    if not 0 < alpha < 0.5:
        raise ReportInputError(f"--alpha must be in (0, 0.5), got {alpha}")
    chain_notes: list[str] = []  # run folders a resume continued, read as the resumed run
    runs = load_runs(inputs, chain_notes, finished_only)
    groups, aside = group_runs(runs)
    mixed = mixed_provenance(groups)
    if mixed and not allow_mixed:
        raise ReportInputError("runs are not comparable: " + "; ".join(mixed)
                               + ". Compare runs of one revision, library versions, data set and config, "
                               "or pass --allow-mixed")
    table = parity_table(groups, load_margins(margins_file), delta=delta, alpha=alpha)
    ok = overall_ok(table)
    out = report_dir(inputs, out)
    if out.is_file():
        raise ReportInputError(f"{out}: is a file, cannot write the report folder there")
    revisions = {str(r.summary.get("git_revision")) for by_prec in groups.values()
                 for runs in by_prec.values() for r in runs}
    notes = chain_notes + [f"runs of a modified source tree ({rev}): the git revision does not pin their code"
                           for rev in sorted(revisions) if rev.endswith("-dirty")]
    md = write_report(out, table, aside, groups, ok, mixed, notes, revisions=sorted(revisions))
    return (0 if ok else 1), md
