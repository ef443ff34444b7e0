"""DB (Differentiable Binarization) training targets: shrink map and threshold map.

Both functions reproduce PaddleOCR's label makers (read from
``ppocr/data/imaug/make_shrink_map.py`` and ``ppocr/data/imaug/make_border_map.py``,
themselves from DBNet.pytorch):

* shrink map: each text polygon shrunk inwards by the Vatti offset
  ``D = area * (1 - r**2) / perimeter`` (pyclipper, round joins) is filled with 1;
  the shrink mask is 1 except over don't-care polygons, which are polygons tagged
  ignore, smaller than ``min_text_size`` on a side, of area < 1, or whose shrink
  vanishes.
* threshold (border) map: each care polygon is padded outwards by ``D``; within
  the padded polygon's bounding box a pixel gets ``1 - clip(dist / D, 0, 1)``,
  ``dist`` being the smallest distance to a polygon edge; maps of several
  polygons combine by max; the result is rescaled to ``[thresh_min, thresh_max]``.
  The threshold mask is the union of the padded polygons.

The border map is where upstream spends its time (a Python loop over edges per
polygon, ~1 ms per quad).  Here, inside the part of the polygon's box that lies
in the image, a small box has all edges evaluated at once over it, and a larger
one has each edge evaluated only over the pixels within ``D`` of it (farther
ones are clipped to the floor anyway); both give the same bits.

Upstream's edge distance is kept on purpose, although it is not exactly the
point-to-segment distance: for a pixel seeing the edge under an obtuse angle
(inside the circle having the edge as diameter) it is the distance to the edge's
line; elsewhere it is the distance to the nearer endpoint.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pyclipper

__all__ = ["make_border_map", "make_shrink_map", "polygon_area_perimeter"]


def polygon_area_perimeter(poly: np.ndarray) -> tuple[float, float]:
    """Unsigned shoelace area and perimeter of a closed polygon ``[N,2]``
    (the same numbers shapely's ``Polygon.area`` / ``.length`` give)."""
    p = np.asarray(poly, dtype=np.float64)
    q = np.concatenate([p[1:], p[:1]])   # next vertex (np.roll is slower for tiny arrays)
    area = 0.5 * abs(float(np.sum(p[:, 0] * q[:, 1] - q[:, 0] * p[:, 1])))
    return area, float(np.sum(np.hypot(*(q - p).T)))


def _offset(poly: np.ndarray, delta: float) -> list[np.ndarray]:
    """Vatti offset of ``poly`` by ``delta`` pixels (negative shrinks); pyclipper
    truncates coordinates to integers, exactly as upstream calls it."""
    pco = pyclipper.PyclipperOffset()
    pco.AddPath([tuple(pt) for pt in poly.tolist()], pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return [np.asarray(path, dtype=np.int64).reshape(-1, 2) for path in pco.Execute(delta)]


def _as_polys(polys) -> list[np.ndarray]:
    return [np.array(p, dtype=np.float64).reshape(-1, 2) for p in polys]


def make_shrink_map(polys, ignore, h: int, w: int, shrink_ratio: float = 0.4,
                    min_text_size: float = 8) -> tuple[np.ndarray, np.ndarray]:
    """Shrink map and mask, float32 ``[h,w]`` each, as PaddleOCR's ``MakeShrinkMap``.

    ``polys``: ``[K,N,2]`` (x, y) pixel coordinates, clipped to the image here;
    ``ignore``: ``[K]`` bool don't-care flags.  As upstream, if the shrink with
    ratio ``r`` splits a polygon in pieces, ratios ``2r, 3r, ... < 1`` are tried
    (larger ratio, smaller offset) and the pieces of the last attempt are drawn.
    """
    gt = np.zeros((h, w), np.float32)
    mask = np.ones((h, w), np.float32)
    top = np.array([w - 1, h - 1], np.float64)
    for poly, ign in zip(_as_polys(polys), np.asarray(ignore, dtype=bool).reshape(-1)):
        # clip to the image; np.clip and np.ptp cost more in call overhead than in work here
        np.minimum(np.maximum(poly, 0, out=poly), top, out=poly)
        area, perimeter = polygon_area_perimeter(poly)
        size = float((poly.max(axis=0) - poly.min(axis=0)).min())
        shrunk = []
        if not (ign or area < 1 or size < min_text_size):
            # upstream: np.arange(r, 1, r) -> [0.4, 0.8] for r = 0.4 (its np.append is a no-op)
            for ratio in np.arange(shrink_ratio, 1, shrink_ratio):
                shrunk = _offset(poly, -area * (1 - ratio**2) / perimeter)
                if len(shrunk) == 1:
                    break
        if not shrunk:
            # astype truncates towards zero, as upstream's fillPoly argument does
            cv2.fillPoly(mask, [poly.astype(np.int32)], 0.0)
            continue
        cv2.fillPoly(gt, [s.astype(np.int32) for s in shrunk], 1.0)
    return gt, mask


# "Not this edge's line distance": larger than any squared distance within a box.
_NOT_LINE = np.float32(1e30)
_ARANGE = np.arange(4096, dtype=np.float32)
# Up to this many edge-pixel pairs (edges x box pixels) the dense version is faster: the banded
# one makes ~20 numpy calls per edge whatever the size (crossover measured at 4 edges x ~15000 px).
DENSE_MAX_WORK = 60_000


def _pixel_coords(n: int) -> np.ndarray:
    return _ARANGE[:n] if n <= len(_ARANGE) else np.arange(n, dtype=np.float32)


def _factors(poly: np.ndarray, width: int, height: int):
    """Squared edge lengths ``[E]`` and rank-2 factors of the four quantities of upstream's edge
    distance over a ``[height, width]`` box: ``cols[q, i] @ rows[q, i]`` is, for edge ``i``,
    ``q = 0``: d1 = |p-a|^2, ``1``: d2 = |p-b|^2 of the previous edge (so that ``[0:2, i]`` is the
    pair meeting at vertex i), ``2``: dot = (p-a).(p-b), ``3``: cross = (x-ax)*ey - (y-ay)*ex.

    Upstream takes the endpoint distance when ``cos = (seg - d1 - d2) / (2 sqrt(d1 d2)) < 0``,
    i.e. ``dot > 0`` (``seg - d1 - d2 = -2 dot``), and otherwise the line distance
    ``d1 d2 sin^2 / seg``, which is ``cross**2 / seg`` without its 0/0 and sqrt(<0) cases.

    A separable sum ``g(y) + f(x)`` over a box is the product ``[g, 1] @ [1; f]``, one rounding
    as the sum: 2-3x faster than numpy's broadcast add on boxes this small.  Every quantity is
    computed with the float32 operations of the original dense version (box-relative
    coordinates, ``(x-ax)**2 + (y-ay)**2``, ...), so the maps are the same to the bit.
    """
    n = len(poly)
    a = poly.astype(np.float32)
    e = np.concatenate([a[1:], a[:1]]) - a               # edge vectors [E,2]
    seg = (e * e).sum(axis=1)                            # squared lengths [E]
    split = (width, height)
    z = np.empty((2, n, width + height), np.float32)     # [from a | from b, edge, x - ax ... | y - ay ...]
    np.subtract(np.concatenate([_pixel_coords(width), _pixel_coords(height)]), np.repeat(a, split, axis=1),
                out=z[0])
    np.subtract(z[0], np.repeat(e, split, axis=1), out=z[1])
    # [quantity, edge, (1, f) / (g, 1), x... | y...]
    f = np.empty((4, n, 2, width + height), np.float32)
    f[:, :, 0] = 1
    np.multiply(z[0], z, out=f[0::2, :, 1])             # d1 and dot
    previous = z[1, np.arange(-1, n - 1)]
    np.multiply(previous, previous, out=f[1, :, 1])
    np.multiply(z[0], np.repeat(e[:, ::-1] * np.float32([1, -1]), split, axis=1), out=f[3, :, 1])
    rows = f[..., :width]                                # [q, E, 2, W]: 1; f(x)
    cols = f[:, :, ::-1, width:].transpose(0, 1, 3, 2)   # [q, E, H, 2]: g(y), 1
    return seg, rows, cols


def _edge_distance2_dense(poly: np.ndarray, width: int, height: int) -> np.ndarray:
    """Upstream's squared pixel-to-edge distance, min over all edges of ``poly``, every edge over
    the whole ``[height, width]`` box: a fixed dozen numpy calls, so faster than
    :func:`_edge_distance2` for small boxes.  Endpoint distances count everywhere and line
    distances where ``dot <= 0``: the same minimum as upstream's per-edge choice, since the line
    distance is never above either endpoint distance."""
    n = len(poly)
    seg, rows, cols = _factors(poly, width, height)
    q = cols @ rows                                      # [4, E, H, W]: d1, d2, dot, cross
    line = q[3]
    np.square(line, out=line)
    line /= np.where(seg > 0, seg, np.float32(1))[:, None, None]
    _, outside = cv2.threshold(q[2].reshape(n * height, width), 0, _NOT_LINE, cv2.THRESH_BINARY)
    np.maximum(line, outside.reshape(n, height, width), out=q[2])
    return q[:3].reshape(3 * n, height, width).min(axis=0)


def _edge_distance2(poly: np.ndarray, width: int, height: int, distance: float) -> np.ndarray:
    """Upstream's squared pixel-to-edge distance, min over all edges of ``poly``,
    only where it is below ``distance**2``: elsewhere it is ``>= distance**2``
    (often ``inf``), which the border map clips to its floor anyway.

    ``poly`` is in coordinates relative to the box's top-left pixel; returns
    float32 ``[height, width]``.  Upstream's distance to an edge ``ab`` is the
    distance to its line where ``(p-a).(p-b) <= 0`` (inside the circle having the
    edge as diameter) and ``min(|p-a|, |p-b|)`` elsewhere.  Both are at least the
    true distance to the segment, so only pixels within ``distance`` of an edge
    matter: around each vertex a box of radius ``distance`` gets the two endpoint
    distances meeting there, and around each edge the box of its circle within
    ``distance`` of the edge gets the line distance (``_NOT_LINE`` outside the
    circle).  The boxes have a 1 px margin against rounding.  That is ~1/4 of
    the pixels of computing every edge over the whole box.

    The values are those of the dense version to the bit (see :func:`_factors`); cv2's
    min/max are used because they are 2-3x faster than numpy's on strided sub-boxes.
    """
    n = len(poly)
    seg, rows, cols = _factors(poly, width, height)
    acc = np.full((height, width), np.inf, np.float32)
    r, right, bottom = distance + 1.0, width - 1, height - 1
    p, seg_sq = poly.tolist(), seg.tolist()
    for i in range(n):
        # vertex i: its box of radius r gets d1 of edge i and d2 of edge i-1
        (ax, ay), (bx, by) = p[i], p[i + 1 - n]
        x0, x1 = max(math.ceil(ax - r), 0), min(math.floor(ax + r), right) + 1
        y0, y1 = max(math.ceil(ay - r), 0), min(math.floor(ay + r), bottom) + 1
        if x0 < x1 and y0 < y1:
            d = cols[0:2, i, y0:y1] @ rows[0:2, i, :, x0:x1]
            cv2.min(d[0], d[1], dst=d[0])
            sub = acc[y0:y1, x0:x1]
            cv2.min(sub, d[0], dst=sub)
        if seg_sq[i] == 0:                               # a zero-length edge is its vertex
            continue
        # edge i: the box of its circle (1 px margin) within r of the edge's box
        cx, cy, rad = (ax + bx) / 2, (ay + by) / 2, math.sqrt(seg_sq[i]) / 2 + 1.0
        x0 = max(math.ceil(max(cx - rad, min(ax, bx) - r)), 0)
        x1 = min(math.floor(min(cx + rad, max(ax, bx) + r)), right) + 1
        y0 = max(math.ceil(max(cy - rad, min(ay, by) - r)), 0)
        y1 = min(math.floor(min(cy + rad, max(ay, by) + r)), bottom) + 1
        if x0 >= x1 or y0 >= y1:
            continue
        dot, line = cols[2:, i, y0:y1] @ rows[2:, i, :, x0:x1]
        _, outside = cv2.threshold(dot, 0, _NOT_LINE, cv2.THRESH_BINARY)
        np.square(line, out=line)
        line /= seg[i]
        cv2.max(line, outside, dst=line)
        sub = acc[y0:y1, x0:x1]
        cv2.min(sub, line, dst=sub)
    return acc


def make_border_map(polys, ignore, h: int, w: int, shrink_ratio: float = 0.4,
                    thresh_min: float = 0.3, thresh_max: float = 0.7) -> tuple[np.ndarray, np.ndarray]:
    """Threshold map and mask, float32 ``[h,w]`` each, as PaddleOCR's ``MakeBorderMap``.

    Ignored polygons are skipped; polygons are not clipped (upstream runs this
    before the shrink map clips them), so text partly outside the image still
    shapes the border inside it.  Matches upstream to ~1e-6 except where upstream
    is wrong: a padded box lying wholly beyond the right or bottom edge makes its
    negative slice bounds copy an unrelated column/row into the last one (or
    raise); here such a polygon only adds to the mask.
    """
    if thresh_min > thresh_max:
        raise ValueError(f"thresh_min {thresh_min} > thresh_max {thresh_max}")
    # Upstream rescales [0,1] -> [thresh_min, thresh_max] after combining by max;
    # the rescale is increasing, so rescaling each value first is the same and
    # saves a pass over the whole image.
    lo, span = np.float32(thresh_min), np.float32(thresh_max - thresh_min)
    canvas = np.full((h, w), lo, np.float32)
    mask = np.zeros((h, w), np.float32)
    for poly, ign in zip(_as_polys(polys), np.asarray(ignore, dtype=bool).reshape(-1)):
        if ign:
            continue
        area, perimeter = polygon_area_perimeter(poly)
        if area <= 0:
            continue
        distance = area * (1 - shrink_ratio**2) / perimeter
        padded = _offset(poly, distance)
        if not padded:
            continue
        padded = padded[0]   # upstream keeps the first path only
        cv2.fillPoly(mask, [padded.astype(np.int32)], 1.0)
        (x0, y0), (x1, y1) = padded.min(axis=0), padded.max(axis=0)
        # Only the part of the padded box inside the image is computed.
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w - 1), min(y1, h - 1)
        if x0 > x1 or y0 > y1:
            continue
        # value = lo + span * (1 - min(dist / D, 1)) = max(lo + span - dist * span / D, lo), in place
        width, height = x1 - x0 + 1, y1 - y0 + 1
        if len(poly) * width * height <= DENSE_MAX_WORK:  # both give the same bits
            value = _edge_distance2_dense(poly - (x0, y0), width, height)
        else:
            value = _edge_distance2(poly - (x0, y0), width, height, distance)
        cv2.sqrt(value, dst=value)
        value *= np.float32(-span / distance)
        value += lo + span
        region = canvas[y0:y1 + 1, x0:x1 + 1]
        cv2.max(region, value, dst=region)  # the canvas starts at lo, so values below it never win
    return canvas, mask
