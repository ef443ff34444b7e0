"""Write the parity report: report.md, report.json, PNG figures and an index.html that shows them."""
from __future__ import annotations

import html
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on training machines
import matplotlib.pyplot as plt
import numpy as np

from zoo.report.details import comparison_lines
from zoo.report.html_page import page
from zoo.report.parity import FP32, finite_or_none
from zoo.report.parity import _label as group_label

HEADER = ["configuration", "batch size", "peak memory", "images/s", "metric mean ± std (n)",
          "eval noise (95% bootstrap)", "Δ vs FP32", "90% CI", "test", "verdict", "skipped steps",
          "final loss scale"]


def _num(x, fmt="{:.1f}"):
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _row(entry: dict, side: dict, is_ref: bool) -> list[str]:
    """Table cells of one precision of one group."""
    batch = f"{side['global_batch_size']}"
    if side.get("world_size") and side["world_size"] > 1:
        batch += f" ({side['batch_size_per_rank']}×{side['world_size']})"
    mem = _num(side["peak_memory_mb"], "{:.0f} MB")
    if side["peak_memory_mb"] is not None and side.get("peak_memory_kind"):
        mem += f" ({side['peak_memory_kind']})"
    std = f"{side['std']:.2f}" if side["n"] > 1 else "—"
    metric = f"{entry['metric']} {side['mean']:.2f} ± {std} ({side['n']})"
    bad = (side.get("nonfinite") or {}).get("primary") or {}
    if bad:  # never a metric computed on inf/NaN outputs without saying so
        metric += (f"; **non-finite outputs** in {len(bad)} run{'s' if len(bad) > 1 else ''} "
                   f"(up to {max(bad.values())} of {side['nonfinite']['images']} images)")
    noise = _num(side.get("eval_ci_half_width"), "±{:.2f} pp")
    if is_ref:
        diff, ci, test, verdict = "—", "—", "—", "reference"
    else:
        diff = _num(side["diff"], "{:+.2f} pp")
        ci = f"[{side['ci'][0]:+.2f}, {side['ci'][1]:+.2f}]" if side["ci"] else "—"
        test, verdict = side["test"], side["verdict"]
        if side["test"] == "no FP32 runs":
            verdict += " (no FP32 runs)"
    scales = ", ".join(f"{s:g}" for s in side["final_loss_scale"]) or "—"
    return [f"{entry['group']} / {side['precision']}", batch, mem, _num(side["images_per_s"]),
            metric, noise, diff, ci, test, verdict, _num(side["skipped_steps"], "{:.1f}"), scales]


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}"


def run_time_line(entry: dict) -> str | None:
    """What the group's runs cost: summed wall time (summary.json wall_time_s) and the per-run range
    of each precision, as they ran (concurrent jobs included), or None when none was recorded."""
    sides = ([entry["fp32"]] if entry["fp32"] else []) + list(entry["amp"])
    parts, total, count = [], 0.0, 0
    partial = sum(side.get("wall_time_partial", 0) for side in sides)
    for side in sides:
        times = side.get("wall_time_s") or []
        if times:
            total, count = total + sum(times), count + len(times)
            lo, hi = _minutes(min(times)), _minutes(max(times))
            parts.append(f"{side['precision']} {lo if lo == hi else lo + '-' + hi} min")
    if not count:
        return None
    hours, minutes = divmod(round(total / 60), 60)
    line = (f"run time: {count} runs, {hours} h {minutes:02d} min in all (sum of each run's wall time); "
            f"per run {', '.join(parts)}")
    if partial:
        line += (f"; {partial} resumed run{'s' if partial > 1 else ''} recorded only the time after "
                 "the resume, so this is a lower bound")
    return line


def table_rows(table: list[dict]) -> list[list[str]]:
    rows = []
    for entry in table:
        if entry["fp32"]:
            rows.append(_row(entry, entry["fp32"], True))
        rows.extend(_row(entry, side, False) for side in entry["amp"])
    return rows


def details(table: list[dict]) -> list[str]:
    """Per-comparison explanation lines (Markdown), one block per AMP side that has an FP32 group."""
    lines = []
    for e in table:
        for side in e["amp"]:
            if side["test"] != "no FP32 runs":
                lines += ["", *comparison_lines(e, side)]
    return lines


def markdown(table: list[dict], aside: list, mixed: list | None = None, notes: list | None = None) -> str:
    """The Markdown report: parity table, margins, per-comparison details, set-aside runs, notes."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(table)]
    lines.append("")
    for e in table:
        lines.append(f"- {e['group']}: {e['metric']} in percentage points, equivalence margin "
                     f"±{e['delta']:g} pp ({e['delta_source']}), alpha {e['alpha']:g} "
                     f"(TOST; the 90% CI must lie inside the margin)")
    for e in table:
        cost = run_time_line(e)
        if cost:
            lines.append(f"- {e['group']}: {cost}")
    if not any(e["amp"] for e in table):
        lines.append("- no AMP runs left after setting aside: nothing was shown")
    lines += details(table)
    if mixed:
        lines += ["", "Compared despite differences (--allow-mixed):", ""] + [f"- {m}" for m in mixed]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    if aside:
        lines += ["", "Set aside (neither AMP nor FP32 evidence):", ""]
        lines += [f"- `{a.path}`: {a.reason}" for a in aside]
    return "\n".join(lines) + "\n"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def _mean_curve(runs, key):
    """Mean of ``key`` over runs at each logged step (steps logged by at least one run)."""
    by_step = defaultdict(list)
    for run in runs:
        for rec in run.series("train"):
            if isinstance(rec.get(key), (int, float)):
                by_step[rec["step"]].append(float(rec[key]))
    steps = sorted(by_step)
    return steps, [float(np.mean(by_step[s])) for s in steps]


def skip_marks(train: list[dict], guard: list[dict]) -> list[tuple[int, float]]:
    """(step, loss scale after the skip) of each skipped step of a run.

    The numerics guard logs every skipped step (``kind: guard``, ``event: skipped_step``) with the
    scale it lowered to. A log without such lines (written before the guard existed) holds only
    the cumulative count of the ``train`` lines: a rise of it marks the log step that closed the
    window, at its logged scale (the skips happened somewhere in that window)."""
    skips = [(int(e["step"]), float(e["loss_scale"])) for e in guard
             if e.get("event") == "skipped_step" and isinstance(e.get("loss_scale"), (int, float))]
    if skips or any(e.get("event") == "skipped_step" for e in guard):
        return skips
    prev, marks = 0, []
    for r in train:
        if isinstance(r.get("skipped_steps"), (int, float)) and r["skipped_steps"] > prev:
            marks.append((r["step"], float(r["loss_scale"])))
            prev = r["skipped_steps"]
    return marks


def _figures(key, by_prec: dict, out: Path) -> list[str]:
    """Loss curves, loss-scale trajectories and metric-per-seed dots for one group."""
    slug, files = _slug("_".join(map(str, key))), []
    fig, ax = plt.subplots(figsize=(11, 4))  # index.html shows it at the page's width
    for prec, runs in by_prec.items():
        steps, loss = _mean_curve(runs, "loss")
        if steps:
            ax.plot(steps, loss, label=f"{prec} (mean of {len(runs)})", lw=2 if prec == FP32 else 1.2)
    ax.set(xlabel="step", ylabel="train loss", title="loss: FP32 vs AMP")
    ax.legend(fontsize=7)
    files.append(_save(fig, out / f"{slug}_loss.png"))

    fig, ax = plt.subplots(figsize=(11, 4))
    for prec, runs in by_prec.items():
        for run in runs:
            recs = [r for r in run.series("train") if isinstance(r.get("loss_scale"), (int, float))
                    and r["loss_scale"] > 0]
            if not recs:
                continue  # FP32 runs have no scaler
            marks = skip_marks(recs, run.series("guard"))
            points = sorted({(r["step"], float(r["loss_scale"])) for r in recs} | set(marks))
            line, = ax.plot([p[0] for p in points], [p[1] for p in points], lw=1,
                            label=f"{prec} seed {run.summary['seed']}")
            if marks:
                ax.scatter([m[0] for m in marks], [m[1] for m in marks], marker="x",
                           color=line.get_color(), zorder=3)
    ax.set_yscale("log")
    ax.set(xlabel="step", ylabel="loss scale (log)", title="loss scale (x = skipped steps)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    files.append(_save(fig, out / f"{slug}_loss_scale.png"))

    fig, ax = plt.subplots(figsize=(11, 3.5))
    names = list(by_prec)
    for i, prec in enumerate(names):
        vals = [r.metric * 100 for r in by_prec[prec]]
        ax.scatter([i] * len(vals), vals, alpha=0.7)
        ax.hlines(np.mean(vals), i - 0.2, i + 0.2, color="k")
    metric = next(iter(by_prec.values()))[0].metric_name
    ax.set_xticks(range(len(names)), names, fontsize=7)
    ax.set(ylabel=f"{metric} (%)", title="primary metric per seed")
    files.append(_save(fig, out / f"{slug}_metric.png"))
    return files


def equivalence_rows(entry: dict) -> list[dict]:
    """What the equivalence figure of one group draws, one row per AMP side compared with FP32:
    its per-seed paired differences, the mean difference and its 90 % CI (None for a single
    seed), and the verdict; the margin is the group's ``delta``."""
    return [{"precision": side["precision"], "seed_diffs": [p["diff"] for p in side.get("pairs", [])],
             "diff": side["diff"], "ci": side["ci"], "verdict": side["verdict"], "test": side["test"]}
            for side in entry["amp"] if side.get("diff") is not None]


def _equivalence_figure(entry: dict, out: Path) -> str | None:
    """Forest plot of one group: the ±delta band, each AMP side's 90 % CI of the difference to
    FP32 (a TOST verdict of "equivalent" is a CI inside the band) and its per-seed differences."""
    rows = equivalence_rows(entry)
    if not rows:
        return None
    delta = entry["delta"]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.55 * len(rows)))
    ax.axvspan(-delta, delta, color="#d8eed8", label=f"margin ±{delta:g} pp")
    ax.axvline(0.0, color="k", lw=0.8)
    for i, row in enumerate(rows):
        y = len(rows) - 1 - i
        if row["seed_diffs"]:
            ax.scatter(row["seed_diffs"], [y + 0.18] * len(row["seed_diffs"]), s=14, color="#777",
                       zorder=3, label="per-seed difference" if i == 0 else None)
        if row["ci"]:
            ax.plot(row["ci"], [y, y], color="C0", lw=2.5, zorder=4)
        ax.scatter([row["diff"]], [y], color="C0", marker="D", s=30, zorder=5,
                   label="mean, 90% CI" if i == 0 else None)
    ax.set_yticks(range(len(rows)), [f"{r['precision']}\n{r['verdict']} ({r['test']})"
                                     for r in reversed(rows)], fontsize=7)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    reach = [abs(v) for r in rows for v in [r["diff"], *r["seed_diffs"], *(r["ci"] or [])]]
    edge = max(1.3 * delta, 1.1 * max(reach))  # the band's edges stay visible
    ax.set_xlim(-edge, edge)
    ax.set(xlabel=f"{entry['metric']} difference to FP32 (pp)",
           title=f"{entry['group']}: AMP − FP32"[:110])
    ax.title.set_fontsize(8)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, out / f"{_slug(entry['group'])}_equivalence.png")


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path.name


def _details_html(lines: list[str], mixed: list) -> str:
    """The Markdown detail lines as HTML: a heading line opens a list of its '- ' lines."""
    out, open_list = [], False
    for line in [*lines, *([""] + [f"- {m}" for m in mixed] if mixed else [])]:
        text = html.escape(line.lstrip("- ").replace("**", "").replace("`", ""))
        if line.startswith("- "):
            out.append(("" if open_list else "<ul>") + f"<li>{text}</li>")
            open_list = True
        elif line:
            out.append(("</ul>" if open_list else "") + f"<p>{text}</p>")
            open_list = False
    return "".join(out) + ("</ul>" if open_list else "")


def _table_html(table: list[dict]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
                   for cells in table_rows(table))
    return f"<table><tr>{head}</tr>{body}</table>"


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        obj = obj.item()
    return finite_or_none(obj)


def write_report(out: Path, table: list[dict], aside: list, groups: dict, ok: bool,
                 mixed: list | None = None, notes: list | None = None, revisions: list | None = None) -> str:
    """Write every report file into ``out``; returns the Markdown text. ``revisions``: the git
    revisions the runs were trained at (report.json; the model cards' footer names them)."""
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(table, aside, mixed, notes)
    (out / "report.md").write_text(md)
    sections, images = [], []
    equivalence = {e["group"]: _equivalence_figure(e, out) for e in table}
    for key, by_prec in groups.items():
        group = group_label(key)
        figures = [(equivalence.get(group), "AMP − FP32: per-seed differences, mean and 90% CI against the margin")]
        figures += zip(_figures(key, by_prec, out), ["train loss, mean over seeds per precision",
                                                     "loss scale per run (x: skipped steps)",
                                                     "primary metric per seed"])
        figures = [(name, caption) for name, caption in figures if name]
        sections.append({"group": group, "by_prec": by_prec, "figures": figures})
        images += [name for name, _ in figures]
    data = {"all_equivalent": ok, "groups": table, "images": images,
            "set_aside": [{"path": str(a.path), "reason": a.reason} for a in aside],
            "mixed_provenance": list(mixed or []), "notes": list(notes or []), "revisions": list(revisions or [])}
    (out / "report.json").write_text(json.dumps(_jsonable(data), indent=2) + "\n")
    details_html = _details_html(details(table), mixed or [])
    (out / "index.html").write_text(page(table, sections, out, ok, _table_html(table), details_html, aside,
                                         list(notes or [])))
    return md
