"""Benchmark of the DB label maps (zoo/data/text_det/labels.py): ms per image for the shrink and
border maps, optionally alternated with the dense distance or with another revision's module.

    python -m zoo.bench.labels [--scale 1.5] [--rounds 5] [--against-dense] [--against-module PATH]
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from zoo.data.text_det import labels
from zoo.data.text_det.labels import make_border_map, make_shrink_map

__all__ = ["benchmark_labels"]


def _random_quads(rng: np.random.Generator, n: int, size: int, scale: float = 1.0) -> np.ndarray:
    """``n`` rotated word-like rectangles inside a ``size`` square (for benchmarks)."""
    quads = []
    for _ in range(n):
        bw, bh = rng.uniform(30, 120) * scale, rng.uniform(10, 40) * scale
        cx, cy = rng.uniform(60, size - 60, 2)
        t = np.deg2rad(rng.uniform(-30, 30))
        rot = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
        box = np.array([[-bw, -bh], [bw, -bh], [bw, bh], [-bw, bh]]) / 2
        quads.append(box @ rot.T + (cx, cy))
    return np.asarray(quads, np.float32)


def _dense_border_map(*args) -> tuple[np.ndarray, np.ndarray]:
    """make_border_map with every polygon through the dense distance (every edge over the whole box)."""
    saved, labels.DENSE_MAX_WORK = labels.DENSE_MAX_WORK, math.inf
    try:
        return make_border_map(*args)
    finally:
        labels.DENSE_MAX_WORK = saved


def _load_module(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("det_labels_against", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def benchmark_labels(size: int = 640, counts=(5, 20, 50), repeats: int = 5, rounds: int = 5,
                     scale: float = 1.0, against_dense: bool = False, against_module: str | None = None) -> dict:
    """Print and return ms per image for both maps on ``size``x``size`` images with
    5/20/50 random word-like quads, ``scale`` times the default size (upstream's border map:
    ~6/19/38 ms, shrink map ~0.05-0.09 ms per quad).  Best of ``rounds`` means over ``repeats``
    calls, as ``timeit`` does, so that other load on a shared machine inflates it least.

    ``against_dense``: also the border map with the dense distance for every polygon, alternated
    round by round with the default one; prints medians over rounds and the median ratio.
    ``against_module``: the same with both maps of another det_labels.py (e.g. an older revision's,
    from ``git show REV:zoo/data/text_det/labels.py``)."""
    rng = np.random.default_rng(0)
    results = {}
    for n in counts:
        quads, ignore = _random_quads(rng, n, size, scale), np.zeros(n, bool)
        fns = [("border", make_border_map), ("shrink", make_shrink_map)]
        fns += [("border_dense", _dense_border_map)] if against_dense else []
        if against_module:
            other = _load_module(against_module)
            fns += [("border_other", other.make_border_map), ("shrink_other", other.make_shrink_map)]
        per_round = {name: [] for name, _ in fns}
        for name, fn in fns:
            fn(quads, ignore, size, size)  # warm-up
        for r in range(rounds):
            for name, fn in fns if r % 2 == 0 else fns[::-1]:
                t0 = time.perf_counter()
                for _ in range(repeats):
                    fn(quads, ignore, size, size)
                per_round[name].append((time.perf_counter() - t0) / repeats * 1e3)
        timings = {name: min(v) for name, v in per_round.items()}
        results[n] = timings
        line = (f"{size}x{size}, {n:3d} quads: border map {timings['border']:6.2f} ms, "
                f"shrink map {timings['shrink']:6.2f} ms per image")
        if against_dense:
            ratio = np.array(per_round["border"]) / np.array(per_round["border_dense"])
            timings["ratio_to_dense"] = float(np.median(ratio))
            line += (f"; border map medians {np.median(per_round['border']):.2f} ms against "
                     f"{np.median(per_round['border_dense']):.2f} ms all dense, ratio {np.median(ratio):.2f}")
        for name in ("border", "shrink") if against_module else ():
            ratio = np.array(per_round[name]) / np.array(per_round[f"{name}_other"])
            timings[f"{name}_ratio_to_other"] = float(np.median(ratio))
            line += (f"\n    {name} map medians {np.median(per_round[name]):.2f} ms against "
                     f"{np.median(per_round[name + '_other']):.2f} ms of {against_module}, "
                     f"ratio {np.median(ratio):.2f} (rounds {ratio.min():.2f}-{ratio.max():.2f})")
        print(line)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="DB label maps")
    parser.add_argument("--scale", type=float, default=1.0, help="text size factor (1.5: pipeline-like)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument("--against-dense", action="store_true",
                        help="alternate with the border map's dense distance for every polygon")
    parser.add_argument("--against-module", metavar="PATH",
                        help="alternate with the maps of another labels.py file (e.g. an older revision's)")
    args = parser.parse_args()
    benchmark_labels(rounds=args.rounds, scale=args.scale, against_dense=args.against_dense,
                     against_module=args.against_module)
