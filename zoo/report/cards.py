"""Keep MODEL_CARDS.md's measured tables in step with the runs that produced them.

A measured section is delimited by ``<!-- measured:NAME -->`` and ``<!-- /measured:NAME -->``.
:func:`update_section` replaces only what lies between the two markers with the report's table,
the command that produced it and the date; everything else in the file (architecture, recipes,
upstream tables, prose) is left byte for byte as it was.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path

from zoo.report.runs import ReportInputError


def _markers(name: str) -> tuple[str, str]:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ReportInputError(f"--section {name!r}: use letters, digits, '_', '.', '-'")
    return f"<!-- measured:{name} -->", f"<!-- /measured:{name} -->"


FIGURE_DIR = Path("docs") / "parity"  # beside the cards file: the sections' equivalence figures


def copy_figures(cards: Path, name: str, figures: list[Path]) -> list[str]:
    """Copy the report's equivalence figures next to ``cards`` as docs/parity/NAME[_i].png and
    return their paths relative to the cards file, for :func:`update_section` to link."""
    _markers(name)  # the name becomes a file name: same rule as the markers
    links = []
    for i, fig in enumerate(figures):
        rel = FIGURE_DIR / (f"{name}.png" if len(figures) == 1 else f"{name}_{i + 1}.png")
        dest = Path(cards).parent / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(Path(fig).read_bytes())
        links.append(rel.as_posix())
    return links


def update_section(cards: Path, name: str, markdown: str, command: str,
                   figures: list[str] | None = None, revisions: list[str] | None = None) -> None:
    """Rewrite the measured section ``name`` of ``cards`` (atomically); the markers must exist.
    ``figures`` (paths relative to the cards file) are linked under the table; ``revisions`` (the git
    revisions the runs were trained at) are named in the footer, so a reader knows what code made them."""
    cards = Path(cards)
    try:
        text = cards.read_text()
    except OSError as e:
        raise ReportInputError(f"{cards}: cannot read model cards ({e.strerror})") from None
    start, end = _markers(name)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ReportInputError(f"{cards}: needs exactly one '{start}' followed by one '{end}'")
    pictures = "".join(f"\n![AMP − FP32 differences with their 90 % CI against the margin]({f})\n"
                       for f in figures or [])
    trained = ""
    if revisions:
        short = [r[:7] + ("-dirty" if r.endswith("-dirty") else "") for r in revisions]
        trained = f" (trained at revision{'s' if len(short) > 1 else ''} {', '.join(short)})"
    body = (f"\n{markdown.rstrip()}\n{pictures}\nGenerated {_dt.date.today().isoformat()} by `{command}` from the "
            f"runs' summary.json files{trained}.\n")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    tmp = cards.with_name(f".{cards.name}.tmp")
    tmp.write_text(head + start + body + end + tail)
    os.replace(tmp, cards)
