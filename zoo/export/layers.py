"""Per-layer numerics of a deployed low-precision network against FP32, on the same images.

:class:`Recorder` records every ``_C_ops`` call of the forwards of a network run inside it, named by
the layer running it (``layer:op``, ``#n`` for its n-th call in that layer), whoever runs them: the
check records during its FP32 and low-precision evaluations (zoo.engine.evaluate), so the scan sees
every image the verdict does at the cost of the hooks only. It keeps each call's magnitudes, how
many images had a non-finite output, its cost (zoo/export/compute.py) and an evenly strided sample
of its output. :func:`record` runs given batches through one. :func:`compare` sets two runs side by
side, one row per op call:

- ``max_abs``: largest |output| in FP32; ``overflow``: share of FP32 outputs beyond the format's max,
  computed in the low format (they become inf); ``flush``: share of nonzero FP32 outputs below half
  the format's smallest subnormal (they become 0) that rounding at the tensor's scale would not lose
  anyway (at least its largest |value| x the format's unit roundoff);
- ``rel_err``: ||low - fp32|| / ||fp32|| over the sample (inf when the low output is not finite
  where FP32 is);
- ``local_err``: what rounding this op's FP32 output alone would cost (the same norm, the format's
  rounding applied to the FP32 output); ``growth`` = rel_err / local_err, how much of the error
  arrived from upstream and grew;
- ``nonfinite``: share of non-finite low-precision outputs, and ``nonfinite_images`` of ``images``
  had one; the first call in execution order with any is named by :func:`first_nonfinite`.

Rows sort by harm (:func:`harm`): what the format cannot hold first (non-finite outputs, then
overflow, then flush to zero), then relative error: an op that overflows is worse than any rounding.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import paddle

from zoo.amp import emulation as emu
from zoo.diagnostics.conformance import every_op
from zoo.diagnostics.numerics import FORMATS
from zoo.diagnostics.probe import LayerNames, bf16_round, sample
from zoo.export.compute import op_cost

__all__ = ["Call", "Recorder", "compare", "first_nonfinite", "first_overflow", "harm", "plot", "record",
           "round_to_format", "table"]


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
    flush: int = 0         # 0 < |x| < min_subnormal / 2, where it matters (in an FP32 run: would become 0)
    max_abs: float = 0.0
    images: int = 0        # images of the forwards this call ran in
    nonfinite_images: int = 0
    cost: int = 0          # arithmetic (zoo/export/compute.py), and the part of it computed fp32
    fp32_cost: int = 0
    samples: list = field(default_factory=list)

    def add(self, value: np.ndarray, fmt, n_images: int = 0) -> None:
        value = np.asarray(value, np.float32)
        a = np.abs(value.ravel())
        finite = np.isfinite(a)
        self.numel += a.size
        self.nonfinite += int(a.size - finite.sum())
        if n_images and value.ndim and value.shape[0] == n_images:  # per image, when the batch leads
            self.images += n_images
            self.nonfinite_images += int((~finite.reshape(n_images, -1).all(axis=1)).sum())
        a = a[finite]
        self.over += int((a > fmt.max).sum())
        if a.size:
            top = float(a.max())
            self.max_abs = max(self.max_abs, top)
            # a flush counts only where rounding at the tensor's own scale would not lose the value
            # anyway: DB's sigmoid flushes background probabilities of 1e-9 beside 1.0, harmlessly
            self.flush += int(((a > 0) & (a < fmt.min_subnormal / 2) & (a >= top * fmt.unit_roundoff)).sum())
        self.samples.append(sample(value))


def round_to_format(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded to float16 / bfloat16 and back to float32, in NumPy (overflow to inf included)."""
    x = np.asarray(x, np.float32)
    if dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    return bf16_round(x)


class Recorder:
    """``with Recorder(model, dtype) as rec:`` records every op call of the forwards of ``model`` run
    inside it (``rec.calls``, in execution order), in whatever emulation is active when they run.

    A forward starts at ``model``'s forward pre-hook; op calls outside one (post-processing) are not
    recorded. A forward run a second time on the same input tensor (a caller re-running a batch) is
    recorded once.
    ``max_forwards`` caps the forwards recorded (None: all). ``values=False`` records only each call's
    precision and cost, cheap enough for every step of the keep-list search.
    """

    def __init__(self, model, dtype: str, max_forwards: int | None = None, values: bool = True):
        self.model, self.fmt, self.values = model, FORMATS[dtype], values
        self.max_forwards = max_forwards
        self.calls: dict[str, Call] = {}
        self.forwards = self.images = self.skipped_forwards = self.skipped_images = 0
        self._seen: dict[str, int] = {}
        self._active, self._n, self._last = False, 0, None
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self):
        emu.install()  # the emulation's wrappers go under every_op's, never over them (they would be lost)
        stack = contextlib.ExitStack()
        self._names = stack.enter_context(LayerNames(self.model))
        stack.enter_context(every_op(self._hook))
        for handle in (self.model.register_forward_pre_hook(self._begin),
                       self.model.register_forward_post_hook(self._end)):
            stack.callback(handle.remove)
        self._stack = stack
        return self

    def __exit__(self, *exc):
        self._stack.close()
        self._last = None
        return False

    def _begin(self, _layer, inputs):
        x = inputs[0] if isinstance(inputs, (list, tuple)) and inputs else inputs
        rerun = x is self._last   # kept referenced, so a new batch can never be the same object
        self._last = x
        n = int(x.shape[0]) if isinstance(x, paddle.Tensor) and x.ndim else 1
        self._active = False
        if rerun:
            return
        if self.max_forwards is not None and self.forwards >= self.max_forwards:
            self.skipped_forwards += 1
            self.skipped_images += n
            return
        self._active, self._n = True, n
        self.forwards += 1
        self.images += n
        self._seen.clear()

    def _end(self, *_):
        self._active = False

    def _hook(self, name, fn, args, kwargs):
        out = fn(*args, **kwargs)
        if not self._active:
            return out
        t = out[0] if isinstance(out, (list, tuple)) and out else out
        if not isinstance(t, paddle.Tensor) or t.dtype not in emu._FLOAT:
            return out
        layer, kind = self._names.current
        base = f"{layer}:{name}"
        self._seen[base] = self._seen.get(base, 0) + 1
        key = base if self._seen[base] == 1 else f"{base}#{self._seen[base] - 1}"
        call = self.calls.setdefault(key, Call(key, name, layer, kind))
        low = emu.is_low(t)
        call.low = call.low or low
        cost = op_cost(name, args, t)
        call.cost += cost
        call.fp32_cost += 0 if low else cost
        if self.values:
            call.add(t.numpy(), self.fmt, self._n)
        return out


def record(model, forward, batches, dtype: str, emulation=None) -> dict[str, Call]:
    """``forward(model, batch)`` over ``batches`` with every op call recorded (in execution order);
    under ``emulation`` (a DeployedEmulation) when given, else in FP32."""
    with Recorder(model, dtype) as rec, paddle.no_grad():
        for batch in batches:
            with emulation() if emulation is not None else contextlib.nullcontext():
                forward(model, batch)
    return rec.calls


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
                     "nonfinite": g.nonfinite / max(g.numel, 1), "nonfinite_images": g.nonfinite_images,
                     "images": g.images})
    return rows


def harm(row: dict) -> tuple:
    """Sort key, most harmful first: what the format cannot hold (non-finite outputs, overflow, flush
    to zero, in that order) before any rounding error, then relative error."""
    rel = row["rel_err"]
    return (-row["nonfinite"], -row["overflow"], -row["flush"], -(rel if math.isfinite(rel) else 1e300))


def first_nonfinite(rows: list[dict]) -> dict | None:
    """The first op call, in execution order, whose low-precision output holds inf or NaN."""
    return next((r for r in rows if r["nonfinite"] > 0), None)


def first_overflow(rows: list[dict]) -> dict | None:
    """Where the format first fails to hold a value: the first non-finite output, else the first op
    call (execution order) whose FP32 values exceed the format's max."""
    return first_nonfinite(rows) or next((r for r in rows if r["overflow"] > 0), None)


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
