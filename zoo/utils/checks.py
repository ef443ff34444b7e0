"""Numeric settings against their rules: finite, inside their bounds, whole where they count.

A package states the numbers it takes as a table ``{key: Bound(...)}`` and checks a value with
:func:`check` (one value) or :func:`check_table` (every key of a table that a config holds). The
message is built from the rule, ``<key>: expected a finite number > 0, got nan``, so a key reads
the same wherever it is checked. ``nan <= 0`` is false, so a check written as "refuse if <= 0"
lets nan (and inf) through; a :class:`Bound` refuses non-finite values before it compares.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

__all__ = ["ABSENT", "Bound", "COUNT", "COUNT_OR_ZERO", "FRACTION", "NON_NEGATIVE", "POSITIVE",
           "PROBABILITY", "check", "check_table", "nonfinite_leaves", "prefixed"]

ABSENT = object()  # what a lookup for :func:`check_table` returns for a key the config lacks


@dataclass(frozen=True)
class Bound:
    """What a numeric setting may be: ``low`` / ``high`` (``None``: unbounded), each inclusive or
    not; ``integer``: a whole number (an int, not a float); ``nullable``: ``None`` (YAML null) is
    allowed too. ``note`` is shown in brackets after the rule (``0 = off``)."""

    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = False
    integer: bool = False
    nullable: bool = False
    note: str = ""

    def accepts(self, value) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.integer and not isinstance(value, numbers.Integral):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and not (value >= self.low if self.low_inclusive else value > self.low):
            return False
        return self.high is None or (value <= self.high if self.high_inclusive else value < self.high)

    def describe(self) -> str:
        """``a finite number > 0``, ``an integer >= 0 (0 = off)``, ``null or a finite number in [0, 1)``."""
        lo = None if self.low is None else f"{self.low:g}"
        hi = None if self.high is None else f"{self.high:g}"
        if self.integer and self.low == 1 and self.low_inclusive and hi is None:
            text = "a positive integer"
        else:
            text = "an integer" if self.integer else "a finite number"
            if lo is not None and hi is not None:
                text += (f" in {'[' if self.low_inclusive else '('}{lo}, {hi}"
                         f"{']' if self.high_inclusive else ')'}")
            elif lo is not None:
                text += f" {'>=' if self.low_inclusive else '>'} {lo}"
            elif hi is not None:
                text += f" {'<=' if self.high_inclusive else '<'} {hi}"
        if self.nullable:
            text = f"null or {text}"
        return f"{text} ({self.note})" if self.note else text

    def but(self, **changes) -> Bound:
        """This rule with some fields changed (``POSITIVE.but(nullable=True)``)."""
        return replace(self, **changes)


POSITIVE = Bound(0, low_inclusive=False)
NON_NEGATIVE = Bound(0)
FRACTION = Bound(0, 1)                           # [0, 1): a decay, a momentum, a beta
PROBABILITY = Bound(0, 1, high_inclusive=True)   # [0, 1]: a probability, a score threshold
COUNT = Bound(1, integer=True)
COUNT_OR_ZERO = Bound(0, integer=True)


def check(key: str, value, bound: Bound, error: type[Exception] = ValueError):
    """``value`` if ``bound`` accepts it, else ``error("<key>: expected <rule>, got <value>")``."""
    if not bound.accepts(value):
        raise error(f"{key}: expected {bound.describe()}, got {value!r}")
    return value


def check_table(lookup: Callable[[str], object], table: Mapping[str, Bound],
                error: type[Exception] = ValueError) -> None:
    """Check every key of ``table`` for which ``lookup(key)`` does not return :data:`ABSENT`."""
    for key, bound in table.items():
        value = lookup(key)
        if value is not ABSENT:
            check(key, value, bound, error)


def prefixed(prefix: str, table: Mapping[str, Bound]) -> dict[str, Bound]:
    """``{"lr": B}`` -> ``{"optim.lr": B}``: a package's own table, as keys of the whole config."""
    return {f"{prefix}{key}": bound for key, bound in table.items()}


def nonfinite_leaves(tree, prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(key, value)`` of every nan / inf / -inf float in nested dicts and lists (``a.b[0]``)."""
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from nonfinite_leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from nonfinite_leaves(v, f"{prefix}[{i}]")
    elif isinstance(tree, float) and not math.isfinite(tree):
        yield prefix, tree
