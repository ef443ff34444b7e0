"""DB threshold (border) map: the band-limited implementation against two references.

* ``_ref_border_map``: a per-pixel Python loop over PaddleOCR's MakeBorderMap formula, float64;
* ``_dense_border_map``: the zoo's previous implementation, kept verbatim, which evaluated every
  edge over the whole padded box at once with numpy broadcasting.
make_border_map computes the same float32 operations, with rank-2 products, over the whole box
(small boxes) or only within D of each edge (larger ones), so it must agree with the previous one
to 1e-6 (equal to the bit on all the cases below; the bound leaves room for a BLAS whose rank-2
product rounds differently).  Every test runs three ways: make_border_map's own choice per
polygon, all banded, all dense.
"""
from __future__ import annotations

import math

import cv2
import numpy as np
import pyclipper
import pytest
from test_text_det_data import _random_quads  # noqa: E402  (the label tests' random quads)

from zoo.bench.labels import _random_quads as bench_quads
from zoo.bench.labels import benchmark_labels
from zoo.data.text_det import labels as det_labels
from zoo.data.text_det.labels import _as_polys, _offset, make_border_map, polygon_area_perimeter


@pytest.fixture(autouse=True, params=["as configured", "banded", "dense"])
def distance_path(request, monkeypatch):
    """Run each test with make_border_map's own choice per polygon, then with every polygon
    through the banded version, then through the dense one (they must give the same maps)."""
    limit = {"as configured": det_labels.DENSE_MAX_WORK, "banded": -1, "dense": math.inf}[request.param]
    monkeypatch.setattr(det_labels, "DENSE_MAX_WORK", limit)
    return request.param

def _ref_border_map(polys, ignore, h, w, r=0.4, tmin=0.3, tmax=0.7):
    """Per-pixel loop reference of PaddleOCR's MakeBorderMap: nearest-endpoint
    distance unless the pixel sees the edge under an angle >= 90 degrees, then
    the distance to the foot of the perpendicular."""
    canvas, mask = np.zeros((h, w)), np.zeros((h, w), np.float32)
    for poly, ign in zip(polys, ignore):
        if ign:
            continue
        poly = [tuple(map(float, p)) for p in poly]
        n = len(poly)
        area = abs(sum(poly[i][0] * poly[(i + 1) % n][1] - poly[(i + 1) % n][0] * poly[i][1] for i in range(n))) / 2
        length = sum(math.dist(poly[i], poly[(i + 1) % n]) for i in range(n))
        if area <= 0:  # make_border_map skips these (upstream would divide by zero)
            continue
        dist = area * (1 - r * r) / length
        pco = pyclipper.PyclipperOffset()
        pco.AddPath(poly, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
        paths = pco.Execute(dist)
        if not paths:  # pyclipper truncates to integers: nothing left of a tiny polygon
            continue
        padded = np.array(paths[0])
        cv2.fillPoly(mask, [padded.astype(np.int32)], 1.0)
        (x0, y0), (x1, y1) = padded.min(0), padded.max(0)
        for y in range(max(y0, 0), min(y1, h - 1) + 1):
            for x in range(max(x0, 0), min(x1, w - 1) + 1):
                best = math.inf
                for i in range(n):
                    (ax, ay), (bx, by) = poly[i], poly[(i + 1) % n]
                    if (ax - x) * (bx - x) + (ay - y) * (by - y) <= 0 and (ax, ay) != (bx, by):
                        t = ((x - ax) * (bx - ax) + (y - ay) * (by - ay)) / ((bx - ax) ** 2 + (by - ay) ** 2)
                        d = math.dist((x, y), (ax + t * (bx - ax), ay + t * (by - ay)))
                    else:
                        d = min(math.dist((x, y), (ax, ay)), math.dist((x, y), (bx, by)))
                    best = min(best, d)
                canvas[y, x] = max(canvas[y, x], 1 - min(best / dist, 1.0))
    return canvas * (tmax - tmin) + tmin, mask


def _dense_edge_distance(poly: np.ndarray, width: int, height: int) -> np.ndarray:
    """Upstream's pixel-to-edge distance, min over all edges of ``poly``.

    ``poly`` is in coordinates relative to the box's top-left pixel; returns
    float32 ``[height, width]``.  Edges run on the leading axis and pixels on the
    other two, so one polygon costs a fixed handful of numpy calls whatever its
    number of edges.  Squared distances are compared and a single square root is
    taken at the end; float32 is exact enough because the box-relative
    coordinates are small.
    """
    a = poly.astype(np.float32)
    e = np.concatenate([a[1:], a[:1]]) - a                      # edge vectors [E,2]
    seg = (e * e).sum(axis=1)[:, None, None]             # squared lengths [E,1,1]
    xs = np.arange(width, dtype=np.float32)[None, None, :] - a[:, 0, None, None]   # [E,1,W]
    ys = np.arange(height, dtype=np.float32)[None, :, None] - a[:, 1, None, None]  # [E,H,1]
    ex, ey = e[:, 0, None, None], e[:, 1, None, None]
    d1 = xs * xs + ys * ys                               # to the edge's start
    d2 = (xs - ex) ** 2 + (ys - ey) ** 2                 # to its end
    # Upstream takes the endpoint distance when cos < 0 with
    # cos = (seg - d1 - d2) / (2 sqrt(d1 d2)); seg - d1 - d2 = -2 (p-a).(p-b).
    far = (xs * (xs - ex) + ys * (ys - ey)) > 0
    # Otherwise the distance to the edge's line, cross^2 / seg: upstream's
    # d1*d2*sin^2/seg without its 0/0 and sqrt(<0) cases.  A zero-length edge
    # always has far == True (or d1 == d2 == 0), so the dummy divisor is unused.
    cross = xs * ey - ys * ex
    line = np.square(cross, out=cross)
    line /= np.where(seg > 0, seg, np.float32(1))
    near = np.minimum(d1, d2, out=d1)
    dist2 = np.where(far, near, line).min(axis=0)
    return np.sqrt(dist2, out=dist2)


def _dense_border_map(polys, ignore, h, w, shrink_ratio=0.4, thresh_min=0.3, thresh_max=0.7):
    """The zoo's border map before the band limit (commit 2d6a19f), unchanged."""
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
        value = _dense_edge_distance(poly - (x0, y0), x1 - x0 + 1, y1 - y0 + 1)
        value *= np.float32(-span / distance)
        value += lo + span
        region = canvas[y0:y1 + 1, x0:x1 + 1]
        np.maximum(region, value, out=region)  # the canvas starts at lo, so values below it never win
    return canvas, mask


def _random_polygons(rng, n, h, w, size=12.0):
    """Star-shaped polygons of 3-9 vertices: non-convex, some with a repeated vertex
    (a zero-length edge) or three collinear ones, some partly outside the image."""
    polys = []
    for _ in range(n):
        k = int(rng.integers(3, 10))
        angles = np.sort(rng.uniform(0, 2 * np.pi, k))
        radii = rng.uniform(0.3, 1.0, k) * rng.uniform(0.3, 1.0) * size
        p = np.stack([np.cos(angles) * radii, np.sin(angles) * radii], 1) + rng.uniform((-5, -5), (w + 5, h + 5))
        if rng.random() < 0.3:
            p = np.insert(p, 1, p[1], axis=0)               # zero-length edge
        if rng.random() < 0.3:
            p = np.insert(p, 1, (p[0] + p[1]) / 2, axis=0)  # collinear vertex
        polys.append(p)
    return polys


def _hand_made(h, w):
    """(name, polygons) on an h x w image: each a case the band limit could get wrong."""
    return [
        ("tiny", [[[5, 5], [6, 5], [6, 6], [5, 6]], [[20.2, 20.1], [20.9, 20.3], [20.5, 20.8]]]),
        ("sliver", [[[2, 10], [40, 12], [40, 13.5], [2, 11]], [[2, 20], [40, 21], [40, 21.3], [2, 20.2]]]),
        ("zero-length edge and collinear vertex", [[[10, 10], [10, 10], [20, 10], [30, 10], [30, 20], [10, 20]]]),
        ("no area", [[[0, 0], [10, 0], [20, 0], [5, 0]], [[3, 3], [3, 3], [3, 3], [3, 3]]]),
        ("out left and top", [[[-15, -8], [20, -5], [18, 12], [-12, 10]]]),
        ("out right and bottom", [[[w - 10, h - 6], [w + 20, h - 4], [w + 18, h + 10], [w - 12, h + 8]]]),
        ("wholly outside", [[[w + 30, 5], [w + 60, 5], [w + 60, 20], [w + 30, 20]],
                            [[5, -40], [30, -40], [30, -25], [5, -25]]]),
        ("larger than the image", [[[-5, -5], [w + 5, -5], [w + 5, h + 5], [-5, h + 5]],
                                   [[-20, -20], [w + 20, -20], [w + 20, h + 20], [-20, h + 20]]]),
        ("overlapping", [[[5, 5], [35, 8], [33, 25], [4, 22]], [[15, 12], [50, 12], [50, 30], [15, 30]],
                         [[20, 0], [24, 0], [24, 39], [20, 39]]]),
        ("non-convex", [[[5, 5], [45, 5], [45, 12], [18, 12], [18, 35], [5, 35]],
                        [[30, 20], [52, 26], [30, 32], [37, 26]]]),
        ("triangle", [[[10, 30], [50, 2], [54, 38]]]),
    ]


def _check(polys, ignore, h, w, ref, tol):
    thr, mask = make_border_map(polys, ignore, h, w)
    ref_thr, ref_mask = ref(polys, ignore, h, w)
    assert thr.dtype == np.float32 and thr.shape == (h, w) and mask.dtype == np.float32
    diff = float(np.abs(thr - ref_thr).max())
    assert diff <= tol, diff
    np.testing.assert_array_equal(mask, ref_mask)
    assert thr.min() >= 0.3 - 1e-6 and thr.max() <= 0.7 + 1e-6
    return diff


@pytest.mark.parametrize("seed", range(4))
def test_border_map_matches_slow_reference(seed):
    rng = np.random.default_rng(seed)
    h, w = 40, 56
    polys = _random_quads(rng, 3, h, w)
    _check(polys, np.array([False, seed == 1, False]), h, w, _ref_border_map, 1e-5)
    polys = _random_polygons(rng, 3, h, w)
    _check(polys, np.zeros(3, bool), h, w, _ref_border_map, 1e-5)


@pytest.mark.parametrize("name, polys", _hand_made(40, 56), ids=[c[0] for c in _hand_made(40, 56)])
def test_border_map_hand_made(name, polys):
    ignore = np.zeros(len(polys), bool)
    _check(polys, ignore, 40, 56, _ref_border_map, 1e-5)
    assert _check(polys, ignore, 40, 56, _dense_border_map, 1e-6) <= 1e-6


@pytest.mark.parametrize("seed", range(6))
def test_border_map_equals_dense_implementation(seed):
    rng = np.random.default_rng(100 + seed)
    # benchmark-like: 20 rotated word boxes on 640x640, some overlapping
    quads = bench_quads(rng, 20, 640)
    _check(quads, rng.random(20) < 0.1, 640, 640, _dense_border_map, 1e-6)
    # small text partly outside a non-square image, and general polygons of all sizes
    h, w = 120, 200
    _check(_random_quads(rng, 12, h, w) * rng.uniform(0.3, 3), np.zeros(12, bool), h, w, _dense_border_map, 1e-6)
    polys = _random_polygons(rng, 10, h, w, size=rng.uniform(2, 60))
    _check(polys, np.zeros(10, bool), h, w, _dense_border_map, 1e-6)


def test_border_map_reference_check_can_fail():
    """The comparison sees a one-pixel error: a dense map with one value moved by 2e-6 fails it."""
    polys = _random_quads(np.random.default_rng(0), 3, 40, 56)
    ignore = np.zeros(3, bool)

    def off_by_a_bit(*args):
        thr, mask = _dense_border_map(*args)
        thr[np.unravel_index(np.argmax(thr), thr.shape)] -= 2e-6
        return thr, mask

    with pytest.raises(AssertionError):
        _check(polys, ignore, 40, 56, off_by_a_bit, 1e-6)


def test_label_benchmark_runs_and_restores_the_limit(distance_path, capsys):
    limit = det_labels.DENSE_MAX_WORK
    out = benchmark_labels(size=160, counts=(2,), repeats=1, rounds=2, scale=0.5, against_dense=True)
    assert set(out[2]) == {"border", "shrink", "border_dense", "ratio_to_dense"} and out[2]["ratio_to_dense"] > 0
    assert det_labels.DENSE_MAX_WORK == limit and "all dense, ratio" in capsys.readouterr().out
    out = benchmark_labels(size=160, counts=(2,), repeats=1, rounds=2, against_module=det_labels.__file__)
    assert out[2]["border_ratio_to_other"] > 0 and out[2]["shrink_ratio_to_other"] > 0
