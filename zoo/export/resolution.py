"""Margins no finer than the validation split resolves.

A metric on a finite split moves in steps: one image's top-1 class, one text box, one box. When the
low-precision network changes one such unit, the paired bootstrap's interval of the difference
reaches ``q`` units, where ``q`` is how often that one image can be drawn: the ``(1 + level) / 2``
quantile of Binomial(n, 1/n) (3 at level 0.9 for every n >= 4; P(<= 2) is about 0.92). A margin
of at most ``q`` units therefore refuses one changed unit, which the split cannot tell from no
change at all, and the keep-list search then keeps ops fp32 to undo noise.

The rule (:func:`margin_rule`): the margin used is the larger of ``export.check.margin.<metric>``
and ``(q + 1)`` units. One changed unit is then always inside it; two changed the same way (their
interval reaches about 5 units) are not. The report and the console say when and why it widened.

One unit, in percentage points of the metric, is the task's to say (``Task.metric_unit``, zoo/tasks):
top-1 ``100 / n`` (one image), hmean ``200 / (G + D)`` (one text box), mAP ``100 / (C x G_min)``
(one box of the rarest category); each task's method says why.
"""
from __future__ import annotations

import math
from math import comb

__all__ = ["binomial_quantile", "margin_rule", "more_images_hint"]


def binomial_quantile(n: int, p: float) -> int:
    """The smallest k with P(Binomial(n, 1/n) <= k) >= p: how often one image of n is drawn, at ``p``."""
    if n <= 1:
        return 1
    total = 0.0
    for k in range(n + 1):
        total += comb(n, k) * (1 / n) ** k * (1 - 1 / n) ** (n - k)
        if total >= p - 1e-12:
            return k
    return n


def more_images_hint(n_needed: int, key: str | None) -> str:
    """How to give the check ``n_needed`` images: the data key that sets the validation split's size
    (``data.builder.num_val`` of the embedded sets) or names its file (``data.builder.val_list`` ...)."""
    if key is None:
        return f"check on about {n_needed} images or more (a larger validation split of data=) for a finer margin"
    if key.endswith("num_val"):
        return f"check on about {n_needed} images or more ({key}={n_needed}) for a finer margin"
    return f"check on about {n_needed} images or more (a larger validation file: {key}=...) for a finer margin"


def margin_rule(metric: str, requested: float, unit_pp: float, unit_what: str, n_images: int,
                level: float, more_images_key: str | None = None) -> dict:
    """The margin to judge with: ``max(requested, (q + 1) x unit)`` (module docstring), and why.

    When it widens, the note says how many images would let the requested margin stand (a unit is
    about inversely proportional to the images: exactly so for top-1) and, with ``more_images_key``,
    the key that gives them."""
    q = binomial_quantile(n_images, (1 + level) / 2)
    floor = (q + 1) * unit_pp
    widened = floor > requested
    rule = {"requested_pp": requested, "margin_pp": floor if widened else requested, "unit_pp": unit_pp,
            "unit": unit_what, "q": q, "widened": widened, "note": None}
    if widened:
        need = math.ceil(n_images * floor / requested - 1e-9) if requested > 0 else None
        more = more_images_hint(need, more_images_key) if need else "check on more images for a finer margin"
        rule["note"] = (f"margin widened from ±{requested:g} to ±{floor:.2f} pp: on {n_images} images {unit_what} "
                        f"moves {metric} by {unit_pp:.2g} pp and one such change's {100 * level:.0f}% interval "
                        f"reaches {q} of them; ±{floor:.2f} pp = {q + 1} units (docs/export.md); {more}")
    return rule
