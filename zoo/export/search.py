"""Which op types to keep fp32: the candidates, by harm, and the search for a small keep-list.

:func:`candidates` orders the op types that run low by harm: ops whose FP32 values the format cannot
hold (overflow), then the first non-finite outputs (execution order), then flushes, then relative
error. :func:`search_keep_list` looks for a small equivalent keep-list among the first ``max_keep``:

1. the empty list (no keep-list needed);
2. **grow**: the candidates added one at a time, most harmful first, until a list is equivalent
   (``[conv2d]``, ``[conv2d, concat]``, ...). One by one, not by bisection: whether a list is
   equivalent is not monotonic in it (keeping an op fp32 can flip one box the other way), so a
   bisection can skip the shortest equivalent prefix;
3. **shrink**: each kept op is tried out, least harmful first, and left out whenever the rest stays
   equivalent, until no single op can go. The result needs every op it keeps (within the budget),
   and it need not be a prefix of the order: ``[b, d]`` when ``b`` and ``d`` are what matters.

Every evaluation counts against ``max_evaluations``; when it runs out, the smallest equivalent list
seen so far is the answer. "Equivalent" is what ``evaluate_keep`` says: the metric's interval inside
the margin and no image with a non-finite output (zoo/export/precision_check.py).
"""
from __future__ import annotations

from zoo.export.layers import harm

__all__ = ["candidates", "search_keep_list"]


def candidates(rows: list[dict], exclude=()) -> list[str]:
    """Op types to try keeping fp32, most harmful first (see the module docstring)."""
    low = [r for r in rows if r["precision"] != "fp32"]
    order = sorted((r for r in low if r["overflow"] > 0), key=lambda r: -r["overflow"])
    order += [r for r in low if r["nonfinite"] > 0]                       # execution order
    order += sorted((r for r in low if r["flush"] > 0), key=lambda r: -r["flush"])
    order += sorted(low, key=harm)
    seen = list(dict.fromkeys(r["op"] for r in order))
    return [op for op in seen if op not in exclude]


class _Budget(Exception):
    """max_evaluations reached."""


def search_keep_list(evaluate_keep, cands: list[str], max_keep: int, max_evaluations: int, known=None):
    """The smallest keep-list found equivalent, or None (module docstring).

    ``evaluate_keep(tuple) -> dict`` with ``keep`` and ``verdict``; ``known`` maps keep tuples already
    evaluated to their results (they count against the budget). Returns ``(keep or None, results in
    the order they were evaluated)``."""
    cache: dict = {}
    tried: list = []
    for keep, result in (known or {}).items():
        cache[tuple(sorted(keep))] = result
        tried.append(result)

    def ok(keep) -> bool:
        key = tuple(sorted(keep))
        if key not in cache:
            if len(cache) >= max_evaluations:
                raise _Budget()
            cache[key] = evaluate_keep(tuple(keep))
            tried.append(cache[key])
        return cache[key]["verdict"] == "equivalent"

    try:
        if ok(()):
            return (), tried
        pool = list(cands[:max_keep])
        keep = next((pool[:k] for k in range(1, len(pool) + 1) if ok(pool[:k])), None)
        if keep is None:
            return None, tried
        shrunk = True
        while shrunk and len(keep) > 1:
            shrunk = False
            for op in reversed(keep):               # least harmful first
                trial = [o for o in keep if o != op]
                if ok(trial):
                    keep, shrunk = trial, True
                    break
        return tuple(keep), tried
    except _Budget:
        best = [r for r in tried if r["verdict"] == "equivalent"]
        return (tuple(min(best, key=lambda r: len(r["keep"]))["keep"]) if best else None), tried
