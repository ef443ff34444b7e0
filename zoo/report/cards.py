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


def update_section(cards: Path, name: str, markdown: str, command: str) -> None:
    """Rewrite the measured section ``name`` of ``cards`` (atomically); the markers must exist."""
    cards = Path(cards)
    try:
        text = cards.read_text()
    except OSError as e:
        raise ReportInputError(f"{cards}: cannot read model cards ({e.strerror})") from None
    start, end = _markers(name)
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ReportInputError(f"{cards}: needs exactly one '{start}' followed by one '{end}'")
    body = (f"\n{markdown.rstrip()}\n\nGenerated {_dt.date.today().isoformat()} by `{command}` from the "
            "runs' summary.json files.\n")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    tmp = cards.with_name(f".{cards.name}.tmp")
    tmp.write_text(head + start + body + end + tail)
    os.replace(tmp, cards)
