"""Per-layer numerics of a deployed low-precision network against FP32, on the same images.

:func:`record` runs forwards with every ``_C_ops`` call named by the layer running it
(``layer:op``, ``#n`` for its n-th call in that layer), in FP32 and then under a
:class:`~zoo.export.deployed.DeployedEmulation`. It keeps each call's magnitudes and an evenly strided
sample of its output. :func:`compare` sets the two runs side by side, one row per op call:

- ``max_abs``: largest |output| in FP32; ``overflow``: share of FP32 outputs beyond the format's max,
  computed in the low format (they become inf); ``flush``: share of nonzero FP32 outputs below half
  the format's smallest subnormal (they become 0);
- ``rel_err``: ||low - fp32|| / ||fp32|| over the sample (inf when the low output is not finite
  where FP32 is);
- ``local_err``: what rounding this op's FP32 output alone would cost (the same norm, the format's
  rounding applied to the FP32 output); ``growth`` = rel_err / local_err, how much of the error
  arrived from upstream and grew;
- ``nonfinite``: share of non-finite low-precision outputs; the first call in execution order
  with any is named by :func:`first_nonfinite`.

Rows sort by harm (:func:`harm`): non-finite outputs first, then overflow, then relative error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import paddle

from zoo.amp import emulation as emu
from zoo.diagnostics.conformance import every_op
from zoo.diagnostics.numerics import FORMATS
from zoo.diagnostics.probe import LayerNames, bf16_round, sample

__all__ = ["Call", "compare", "first_nonfinite", "harm", "plot", "record", "round_to_format", "table"]


@dataclass
class Call:
    """One named op call over every recorded batch."""

    key: str
    op: str
    layer: str
    layer_type: str
    low: bool = False
    numel: int = 0
    nonfinite: int = 0
    over: int = 0          # |x| > format max (in an FP32 run: would overflow)
    flush: int = 0         # 0 < |x| < min_subnormal / 2 (in an FP32 run: would become 0)
    max_abs: float = 0.0
    samples: list = field(default_factory=list)

    def add(self, value: np.ndarray, fmt) -> None:
        a = np.abs(np.asarray(value, np.float32).ravel())
        finite = np.isfinite(a)
        self.numel += a.size
        self.nonfinite += int(a.size - finite.sum())
        a = a[finite]
        self.over += int((a > fmt.max).sum())
        self.flush += int(((a > 0) & (a < fmt.min_subnormal / 2)).sum())
        if a.size:
            self.max_abs = max(self.max_abs, float(a.max()))
        self.samples.append(sample(value))


def round_to_format(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to float16 / bfloat16 and back to float32, in NumPy (overflow to inf included)."""
    x = np.asarray(x, np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    return bf16_round(x)


def record(model, forward, batches, dtype: str, emulation=None) -> dict[str, Call]:
    """``forward(model, batch)`` over ``batches`` with every op call recorded (in execution order);
    under ``emulation`` (a DeployedEmulation) when given, else in FP32."""
    fmt = FORMATS[dtype]
    emu.install()  # the emulation's wrappers go under every_op's, never over them (they would be lost)
    calls: dict[str, Call] = {}
    seen: dict[str, int] = {}
    with LayerNames(model) as names, paddle.no_grad():
        def hook(name, fn, args, kwargs):
            out = fn(*args, **kwargs)
            t = out[0] if isinstance(out, (list, tuple)) and out else out
            if not isinstance(t, paddle.Tensor) or t.dtype not in emu._FLOAT:
                return out
            layer, kind = names.current
            base = f"{layer}:{name}"
            seen[base] = seen.get(base, 0) + 1
            key = base if seen[base] == 1 else f"{base}#{seen[base] - 1}"
            call = calls.setdefault(key, Call(key, name, layer, kind))
            call.low = call.low or emu.is_low(t)
            call.add(t.numpy(), fmt)
            return out

        for batch in batches:
            seen.clear()
            with every_op(hook):
                if emulation is None:
                    forward(model, batch)
                else:
                    with emulation():
                        forward(model, batch)
    return calls


def _rel(ref: np.ndarray, got: np.ndarray) -> float:
    finite = np.isfinite(ref)
    if not np.isfinite(got[finite]).all():
        return math.inf
    denom = float(np.linalg.norm(ref[finite].astype(np.float64)))
    diff = float(np.linalg.norm((got[finite] - ref[finite]).astype(np.float64)))
    return diff / denom if denom > 0 else (0.0 if diff == 0 else math.inf)


def compare(ref: dict[str, Call], low: dict[str, Call], dtype: str) -> list[dict]:
    """One row per op call present in both runs, in the FP32 run's execution order."""
    rows = []
    for key, r in ref.items():
        g = low.get(key)
        if g is None or len(g.samples) != len(r.samples):
            continue
        a, b = np.concatenate(r.samples), np.concatenate(g.samples)
        if a.shape != b.shape:
            continue
        rel = _rel(a, b)
        local = _rel(a, round_to_format(a, dtype)) if g.low else 0.0
        rows.append({"key": key, "layer": r.layer, "layer_type": r.layer_type, "op": r.op,
                     "precision": FORMATS[dtype].name if g.low else "fp32", "max_abs": r.max_abs,
                     "overflow": r.over / max(r.numel, 1), "flush": r.flush / max(r.numel, 1),
                     "rel_err": rel, "local_err": local,
                     "growth": (rel / local if local > 0 else (math.inf if rel > 0 else 1.0)),
                     "nonfinite": g.nonfinite / max(g.numel, 1)})
    return rows


def harm(row: dict) -> tuple:
    """Sort key, most harmful first: non-finite outputs, then overflow, then relative error."""
    rel = row["rel_err"]
    return (-row["nonfinite"], -row["overflow"], -(rel if math.isfinite(rel) else 1e300))


def first_nonfinite(rows: list[dict]) -> dict | None:
    """The first op call, in execution order, whose low-precision output holds inf or NaN."""
    return next((r for r in rows if r["nonfinite"] > 0), None)


def _g(x: float) -> str:
    return "inf" if x == math.inf else f"{x:.2g}"


def table(rows: list[dict], top: int = 10) -> str:
    """The ``top`` most harmful rows as a text table."""
    lines = [f"{'layer:op':44s} {'type':16s} {'prec':5s} {'max|x|':>9s} {'>max':>7s} {'->0':>7s} "
             f"{'relerr':>8s} {'growth':>8s} {'nonfin':>7s}"]
    for r in sorted(rows, key=harm)[:top]:
        lines.append(f"{r['key'][:44]:44s} {r['layer_type'][:16]:16s} {r['precision']:5s} {r['max_abs']:9.3g} "
                     f"{r['overflow']:7.2%} {r['flush']:7.2%} {_g(r['rel_err']):>8s} {_g(r['growth']):>8s} "
                     f"{r['nonfinite']:7.2%}")
    return "\n".join(lines)


def plot(rows: list[dict], path, title: str) -> None:
    """Relative error of every op call in execution order (log scale), non-finite ones in red at the top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    errs = np.array([r["rel_err"] for r in rows], dtype=float)
    finite = np.isfinite(errs)
    top = max(float(errs[finite].max()) if finite.any() else 1.0, 1e-6) * 10
    shown = np.where(finite, np.maximum(errs, 1e-9), top)
    colours = ["tab:red" if not f or r["nonfinite"] > 0 else ("tab:orange" if r["overflow"] > 0 else
               ("tab:blue" if r["precision"] != "fp32" else "tab:gray")) for r, f in zip(rows, finite)]
    fig, ax = plt.subplots(figsize=(max(6.0, len(rows) * 0.04), 3.6))
    ax.bar(np.arange(len(rows)), shown, color=colours, width=1.0)
    ax.set_yscale("log")
    ax.set_xlabel("op call, in execution order")
    ax.set_ylabel("relative error vs FP32")
    ax.set_title(title + "  (red: non-finite, orange: overflow, gray: kept fp32)", fontsize=9)
    first = first_nonfinite(rows)
    if first is not None:
        i = rows.index(first)
        ax.annotate(f"first non-finite: {first['key']}", (i, top), xytext=(0.02, 0.92),
                    textcoords="axes fraction", fontsize=8, arrowprops={"arrowstyle": "->"})
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
