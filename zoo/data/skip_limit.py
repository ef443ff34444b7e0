"""How much of a split ``bad_samples=skip`` may leave out before the run is refused.

Skipping is meant for a few bad lines or images in a large set. A systematic fault (a converter
that wrote no ``bbox``, a label file in the wrong encoding) makes every sample "bad", and a run
that trains on what is left looks normal apart from a warning: the COCO case of issue 40 lost
28 of 40 training images to 29 annotations without ``bbox`` under "skipped 29 problems". So the
warning says how many images (and boxes or label lines) went out of how many, per split, and a
split that loses more than ``data.builder.max_lost_fraction`` of its images (default 0.5: most
of it) is one error naming the file, the counts and the key.
"""
from __future__ import annotations

import math

__all__ = ["DEFAULT_MAX_LOST_FRACTION", "KEY", "check_max_lost_fraction", "lost_line", "refuse_if_most_lost"]

KEY = "data.builder.max_lost_fraction"
DEFAULT_MAX_LOST_FRACTION = 0.5


def check_max_lost_fraction(value) -> float:
    """The setting as a float in [0, 1], or a ValueError naming the key."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= 1:
        raise ValueError(f"{KEY}: expected a number in [0, 1] (the largest share of a split's images "
                         f"bad_samples=skip may leave out), got {value!r}")
    return float(value)


def _pct(lost: int, total: int) -> str:
    return f"{100 * lost / total:.0f}%" if total else "0%"


def lost_line(split: str, lost: int, total: int, problems: int, also: str = "", unit: str = "images") -> str:
    """``"28 of 40 images (70%) [and <also>] of the train split for 29 problems"``."""
    extra = f" and {also}" if also else ""
    return f"{lost} of {total} {unit} ({_pct(lost, total)}){extra} of the {split} split for {problems} problems"


def refuse_if_most_lost(split: str, source, lost: int, total: int, problems: list[str], max_fraction: float,
                        also: str = "", unit: str = "images") -> None:
    """Raise a one-line ValueError naming ``source`` when more than ``max_fraction`` of the ``total``
    images of ``split`` are ``lost``; ``also`` adds other counts (``"57 of 80 annotations"``)."""
    if not total or lost <= max_fraction * total:
        return
    first = problems[0] if problems else "(none recorded)"
    raise ValueError(f"{source}: data.builder.bad_samples=skip would leave out "
                     f"{lost_line(split, lost, total, len(problems), also, unit)}, more than {KEY}={max_fraction:g} "
                     f"of them; first problem: {first}; fix the file, or set {KEY}=1 to use the {total - lost} left")
