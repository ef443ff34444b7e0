"""One row per run, no comparison: what each run measured, in which precision, whether its
evaluations met non-finite outputs, and what it cost (``tools/report.py --runs-table``).

The quick-run tables of MODEL_CARDS.md are this table, generated from the runs' summary.json files
with ``--model-cards``, so a figure there is the run's own and its footer names the revision that
trained it. The headline is the run's primary metric as the recipe scores it (``evaluated in``);
a low-precision run whose recipe evaluates in FP32 (``trainer.eval_precision: fp32``) also shows
its training-precision evaluation and how many images met inf/NaN there.
"""
from __future__ import annotations

from zoo.report.runs import Run, load_runs

__all__ = ["runs_table"]

_SKIP = {"num_images", "num_samples"}  # counts, not metrics


def _pp(value) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}"


def _minutes(seconds) -> str:
    if seconds is None:
        return "-"
    m, s = divmod(int(round(float(seconds))), 60)
    return f"{m} min {s:02d} s"


def _nonfinite(numerics: dict | None) -> str:
    if not numerics:
        return "not recorded"
    n, total = numerics.get("nonfinite_images", 0), numerics.get("images")
    if not n:
        return f"none of {total} images"
    first = numerics.get("first_layers") or {}
    where = f" (first at `{next(iter(first))}`)" if first else ""
    return f"**{n} of {total} images**{where}"


def _effective(s: dict) -> str:
    eff = s.get("effective_precision", "?")
    if eff == "fp32":
        asked = s.get("requested_precision")
        return "fp32" if asked in (None, "fp32") else f"fp32 (asked for {asked}: {s.get('precision_reason', '')})"
    skips, scale = s.get("skipped_steps"), s.get("final_loss_scale")
    extra = [f"{skips} skipped steps" if skips is not None else None,
             f"final scale {scale:g}" if isinstance(scale, (int, float)) else None]
    extra = [e for e in extra if e]
    return f"{eff} ({', '.join(extra)})" if extra else eff


def _row(run: Run, parts: list[str]) -> list[str]:
    s = run.summary
    pm = s["primary_metric"]
    evaluated_in = pm.get("evaluated_in") or s.get("effective_precision")
    metrics = s.get("metrics_fp32_eval") if evaluated_in == "fp32" and s.get("metrics_fp32_eval") else s.get("metrics", {})
    numerics = s.get("eval_numerics_fp32") if evaluated_in == "fp32" and s.get("eval_numerics_fp32") else s.get("eval_numerics")
    if pm.get("value") is None:  # stopped before its final evaluation (the guard, an interrupt)
        evaluated_in = f"not evaluated: {s.get('status', '?')} at step {s.get('steps', '?')}"
        metrics = {}
    cells = [f"`{run.path.name}`", str(s.get("git_revision", "?"))[:7], _effective(s), evaluated_in,
             _nonfinite(numerics) if pm.get("value") is not None else "-"]
    cells += [(f"**{_pp(metrics.get(p))}**" if p == pm["name"] else _pp(metrics.get(p))) for p in parts]
    train_eval = s.get("primary_metric_train_precision_eval")
    if evaluated_in == "fp32" and train_eval and s.get("effective_precision") != "fp32":
        cells.append(f"{pm['name']} {_pp(train_eval.get('value'))}, non-finite: {_nonfinite(s.get('eval_numerics'))}")
    else:
        cells.append("-")
    mem = s.get("peak_memory_mb")
    cells += [_minutes(s.get("wall_time_s")), f"{s['images_per_s']:.1f}" if s.get("images_per_s") else "-",
              f"{mem:.0f} MB ({s.get('peak_memory_kind', '?')})" if mem else "-"]
    return cells


def runs_table(inputs) -> tuple[str, list[str]]:
    """The Markdown table of ``inputs`` (run folders, summary.json files or multirun folders) and the
    git revisions the runs were trained at."""
    runs = load_runs(inputs)
    parts: list[str] = list(dict.fromkeys(r.metric_name for r in runs))  # the headline metrics first
    for run in runs:
        s = run.summary
        source = s.get("metrics_fp32_eval") if s["primary_metric"].get("evaluated_in") == "fp32" else s.get("metrics")
        for key in (source or {}):
            if key not in _SKIP and key not in parts:
                parts.append(key)
    head = ["run", "revision", "effective precision", "evaluated in", "non-finite outputs", *parts,
            "training-precision evaluation", "wall time", "images/s", "peak memory"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_row(r, parts)) + " |" for r in runs]
    revisions = sorted({str(r.summary.get("git_revision")) for r in runs if r.summary.get("git_revision")})
    return "\n".join(lines) + "\n", revisions
