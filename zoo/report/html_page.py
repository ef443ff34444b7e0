"""The report's index.html: a page to browse, written beside report.md.

Order: what was found (one line per AMP recipe: its verdict, the difference to FP32, its 90 % CI
and the margin), the table, then one section per group with its figures at the page's width and
the runs it read, each linked (its folder, summary.json, metrics.jsonl) by a path relative to the
report folder, so the report and the runs can be moved together. Then the comparison details,
notes and the runs set aside (linked too).
"""
from __future__ import annotations

import html
import os
from pathlib import Path

from zoo.report.parity import FP32

_STYLE = """
body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 40px;line-height:1.4}
nav a{margin-right:12px}
.verdicts{list-style:none;padding:0}
.verdicts li{margin:4px 0;padding:6px 10px;border-left:6px solid #999;background:#f6f6f6}
.verdicts li.equivalent{border-color:#2a8a2a}.verdicts li.different{border-color:#c0392b}
.verdicts li.not-shown{border-color:#d68910}
.verdict{font-weight:bold}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #999;padding:3px 6px;text-align:left}
figure{margin:12px 0}figure img{display:block;width:100%;height:auto;border:1px solid #ddd}
figcaption{color:#555;font-size:90%}
"""


def _e(text) -> str:
    return html.escape(str(text))


def _href(target: Path, out: Path) -> str:
    """``target`` relative to the report folder (a URL path: forward slashes, escaped)."""
    rel = os.path.relpath(Path(target).resolve(), Path(out).resolve())
    return _e(Path(rel).as_posix())


def _verdict_items(table: list[dict]) -> list[str]:
    items = []
    for entry in table:
        for side in entry["amp"]:
            verdict = str(side["verdict"])
            diff = f"{side['diff']:+.2f} pp" if side.get("diff") is not None else "—"
            ci = f", 90% CI [{side['ci'][0]:+.2f}, {side['ci'][1]:+.2f}]" if side.get("ci") else ""
            items.append(f'<li class="{_e(verdict.replace(" ", "-"))}"><span class="verdict">{_e(verdict)}</span>: '
                         f'<a href="#{_e(_anchor(entry["group"]))}">{_e(entry["group"])}</a> / {_e(side["precision"])}: '
                         f'{_e(entry["metric"])} {_e(diff)} vs FP32{_e(ci)}, margin ±{entry["delta"]:g} pp '
                         f'({_e(side["test"])}, {side["n"]} run{"s" if side["n"] != 1 else ""})</li>')
    return items


def _anchor(group: str) -> str:
    return "group-" + "".join(c if c.isalnum() else "-" for c in group).strip("-")


def _run_rows(by_prec: dict, out: Path) -> str:
    rows = []
    for prec in sorted(by_prec, key=lambda p: (p != FP32, p)):
        for run in sorted(by_prec[prec], key=lambda r: r.summary.get("seed", 0)):
            files = [f'<a href="{_href(run.path / name, out)}">{name}</a>' for name in
                     ("summary.json", "metrics.jsonl", "config.yaml") if (run.path / name).is_file()]
            rows.append(f'<tr><td>{_e(prec)}</td><td>{_e(run.summary.get("seed"))}</td>'
                        f'<td>{run.metric * 100:.2f}</td><td>{_e(run.summary.get("steps"))}</td>'
                        f'<td><a href="{_href(run.path, out)}/">{_e(run.path.name)}</a></td>'
                        f'<td>{" · ".join(files)}</td></tr>')
    return ("<div class=scroll><table><tr><th>precision</th><th>seed</th><th>metric (%)</th><th>steps</th>"
            "<th>run folder</th><th>files</th></tr>" + "".join(rows) + "</table></div>")


def _figure(name: str, caption: str) -> str:
    return (f'<figure><a href="{_e(name)}"><img src="{_e(name)}" alt="{_e(caption)}"></a>'
            f'<figcaption>{_e(caption)}</figcaption></figure>')


def page(table: list[dict], sections: list[dict], out: Path, ok: bool, table_html: str, details_html: str,
         aside: list, notes: list) -> str:
    """The HTML page. ``sections``: per group ``{"group", "by_prec", "figures": [(file, caption)]}``;
    ``table_html`` and ``details_html``: the parity table and the comparison details, already HTML."""
    verdicts = _verdict_items(table)
    summary = ("every AMP recipe compared is equivalent to FP32" if ok and verdicts
               else "not every AMP recipe is shown equivalent to FP32" if verdicts
               else "no AMP run to compare")
    body = ["<h1>AMP vs FP32 parity</h1><nav><a href='#verdicts'>verdicts</a><a href='#table'>table</a>"
            + "".join(f"<a href='#{_e(_anchor(s['group']))}'>{_e(s['group'])}</a>" for s in sections)
            + "<a href='#details'>details</a>" + ("<a href='#aside'>set aside</a>" if aside else "")
            + "<a href='report.md'>report.md</a><a href='report.json'>report.json</a></nav>",
            f"<h2 id=verdicts>Verdicts</h2><p>{_e(summary)}</p>",
            f"<ul class=verdicts>{''.join(verdicts)}</ul>" if verdicts else "",
            f"<h2 id=table>Table</h2><div class=scroll>{table_html}</div>"]
    for s in sections:
        n_runs = sum(len(r) for r in s["by_prec"].values())
        body.append(f"<h2 id='{_e(_anchor(s['group']))}'>{_e(s['group'])}</h2>")
        body += [_figure(name, caption) for name, caption in s["figures"]]
        body.append(f"<h3>The {n_runs} runs read</h3>{_run_rows(s['by_prec'], out)}")
    body.append(f"<h2 id=details>Comparisons</h2>{details_html}")
    if notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    if aside:
        items = "".join(f'<li><a href="{_href(a.path, out)}">{_e(a.path)}</a>: {_e(a.reason)}</li>' for a in aside)
        body.append(f"<h2 id=aside>Set aside</h2><ul>{items}</ul>")
    return ("<!doctype html><html lang=en><head><meta charset='utf-8'>"
            "<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>AMP parity report</title><style>{_STYLE}</style></head><body>"
            + "".join(body) + "</body></html>\n")
