"""A finished run against the upstream figure it reproduces (``tools/report.py RUN --against-published``).

An experiment that reproduces a published number carries it as data, in its config::

    published:
      metric: hmean          # the summary.json metric compared (a fraction there; here in percent)
      value: 75.12           # upstream's figure, in percent
      source: "..."          # where upstream publishes it (file and line)
      tolerance: 1.0         # the reproduction tolerance, in percentage points
      reason: "..."          # why that tolerance
      evaluated_in: fp32     # optional: compare the FP32 re-evaluation (metrics_fp32_eval) when the run has it

The run folder's ``config.yaml`` (resolved, as tools/train.py writes it) holds that block, its
``summary.json`` the measurement. Nothing here trains or evaluates.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

REQUIRED = ("metric", "value", "source", "tolerance", "reason")


class PublishedInputError(ValueError):
    """A run folder that cannot be compared (no summary, no ``published`` block, no measured value)."""


@dataclass
class PublishedComparison:
    run: str
    experiment_metric: str
    measured: float            # percent
    published: float           # percent
    difference: float          # measured - published, percentage points
    tolerance: float           # percentage points
    within: bool
    evaluated_in: str          # which evaluation of the run was compared
    source: str
    reason: str


def _run_folder(path: str | Path) -> Path:
    path = Path(path)
    folder = path.parent if path.name == "summary.json" else path
    if not (folder / "summary.json").is_file():
        raise PublishedInputError(f"{path}: no summary.json (is it a finished run folder?)")
    return folder


def published_block(folder: Path) -> dict:
    """The run's ``published`` block, checked; raises naming the file and the missing keys."""
    config = folder / "config.yaml"
    if not config.is_file():
        raise PublishedInputError(f"{folder}: no config.yaml beside summary.json")
    cfg = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    block = cfg.get("published")
    if not isinstance(block, dict):
        raise PublishedInputError(
            f"{config}: no `published` block. The reproduction experiments carry one (experiment=db_mv3_icdar2015, "
            "db_r50vd_icdar2015, ppyoloe_s_coco, resnet50_imagenet_amp, resnet50_vd_imagenet[_amp]); for another "
            "run state it on the command line: +published.metric=... +published.value=... +published.source=... +published.tolerance=... "
            "+published.reason=...")
    missing = [k for k in REQUIRED if block.get(k) in (None, "")]
    if missing:
        raise PublishedInputError(f"{config}: published: missing {', '.join(missing)}")
    for key in ("value", "tolerance"):
        if not isinstance(block[key], (int, float)) or isinstance(block[key], bool) or not math.isfinite(block[key]):
            raise PublishedInputError(f"{config}: published.{key}: expected a number, got {block[key]!r}")
    if block["tolerance"] < 0:
        raise PublishedInputError(f"{config}: published.tolerance: expected >= 0, got {block['tolerance']}")
    return block


def _measured(summary: dict, block: dict, where: Path) -> tuple[float, str]:
    """The run's value of the published metric (a fraction) and which evaluation it came from."""
    metric = block["metric"]
    if block.get("evaluated_in") == "fp32" and metric in (summary.get("metrics_fp32_eval") or {}):
        return summary["metrics_fp32_eval"][metric], "fp32 (metrics_fp32_eval)"
    primary = summary.get("primary_metric") or {}
    if primary.get("name") == metric and primary.get("value") is not None:
        return primary["value"], str(primary.get("evaluated_in") or summary.get("effective_precision") or "train")
    if (summary.get("metrics") or {}).get(metric) is not None:
        return summary["metrics"][metric], "train"
    raise PublishedInputError(f"{where}: no measured {metric!r} (status {summary.get('status')!r}; a run with "
                              "trainer.final_eval=false or stopped by the numerics guard has none)")


def compare_run(path: str | Path) -> PublishedComparison:
    """Compare one finished run with the published figure its config states."""
    folder = _run_folder(path)
    block = published_block(folder)
    summary_file = folder / "summary.json"
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    value, evaluated_in = _measured(summary, block, summary_file)
    measured = float(value) * 100.0
    published = float(block["value"])
    diff = measured - published
    tol = float(block["tolerance"])
    return PublishedComparison(run=str(folder), experiment_metric=str(block["metric"]), measured=measured,
                               published=published, difference=diff, tolerance=tol,
                               within=abs(diff) <= tol + 1e-9, evaluated_in=evaluated_in,
                               source=str(block["source"]), reason=str(block["reason"]))


def format_comparison(c: PublishedComparison) -> str:
    verdict = "within" if c.within else "OUTSIDE"
    return (f"{c.run}\n"
            f"  {c.experiment_metric}: measured {c.measured:.2f}, published {c.published:.2f}, "
            f"difference {c.difference:+.2f} pp: {verdict} the tolerance of +-{c.tolerance:g} pp\n"
            f"  measured in: {c.evaluated_in}\n"
            f"  published: {c.source}\n"
            f"  tolerance: {c.reason}\n")


def against_published(inputs) -> tuple[int, str, list[dict]]:
    """Exit status (0 all within, 1 some outside), the text, and the comparisons as dicts."""
    results = [compare_run(p) for p in inputs]
    text = "".join(format_comparison(c) for c in results)
    return (0 if all(c.within for c in results) else 1), text, [asdict(c) for c in results]


# ---- the model cards' "upstream reported results" tables, from the same blocks ----------------------
TABLE_MARKERS = ("<!-- published:{} -->", "<!-- /published:{} -->")


def published_rows(configs: list[dict]) -> dict[str, list[str]]:
    """Markdown rows per model family from composed experiment configs (each a plain dict with
    ``experiment``, ``family.name``, ``model.name``, ``data.name`` and its ``published`` block)."""
    rows: dict[str, list[str]] = {}
    for cfg in configs:
        block = cfg["published"]
        rows.setdefault(cfg["family"]["name"], []).append(
            f"| `experiment={cfg['experiment']}` | {cfg['model']['name']} | {cfg['data']['name']} | {block['metric']} "
            f"| **{block['value']:.2f}** | ±{block['tolerance']:g} pp | {block['source']} |")
    return rows


def published_tables(configs: list[dict]) -> dict[str, str]:
    """One Markdown table per family (see :func:`published_rows`)."""
    head = ("| reproduced by | model | data | metric | published | tolerance | source |\n"
            "|---|---|---|---|---|---|---|\n")
    return {family: head + "\n".join(rows) + "\n" for family, rows in published_rows(configs).items()}


def rewrite_tables(cards: Path, tables: dict[str, str], command: str) -> list[str]:
    """Replace each ``<!-- published:FAMILY -->`` section of ``cards`` with its table; returns the
    families written. A section without a table, or a table without a section, is an error."""
    text = cards.read_text(encoding="utf-8")
    for family, table in tables.items():
        start, end = (m.format(family) for m in TABLE_MARKERS)
        if text.count(start) != 1 or text.count(end) != 1:
            raise PublishedInputError(f"{cards}: needs exactly one '{start}' ... '{end}' section for the "
                                      f"experiments of family {family}")
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        body = (f"\n{table}\nGenerated from the experiments' `published` blocks (configs/experiment/) by "
                f"`{command}`; `tools/report.py <run> --against-published` compares a finished run with them.\n")
        text = head + start + body + end + tail
    sections = {line.split(":", 1)[1].split(" ")[0] for line in text.splitlines() if line.startswith("<!-- published:")}
    if sections - set(tables):
        raise PublishedInputError(f"{cards}: sections with no experiment: {sorted(sections - set(tables))}")
    tmp = cards.with_name(f".{cards.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(cards)
    return sorted(tables)
