"""Where values sit against a low-precision format: limits, exponent histograms, loss-scale windows.

A tensor is summarised by a histogram of the binary exponents of its nonzero magnitudes
(``|x| = m * 2**e`` with ``m`` in [0.5, 1), NumPy's ``frexp``), the sum of squares per exponent,
plus its max and counts. For a loss scale that is a power of two that histogram answers exactly
how many entries end up above the format's max, below its smallest normal or below half its
smallest subnormal (rounded to 0), and how much of the L2 norm they carry, so the prediction at any
scale, and the window of scales, come from one measurement in FP32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

OFFSET = 160            # histogram bin i holds exponent e = i - OFFSET (fp32 spans 2^-149 .. 2^128)
BINS = 300


@dataclass(frozen=True)
class Format:
    """A floating-point format's limits, as exponents of 2 where that makes the tests exact."""

    name: str
    max: float
    min_normal: float
    min_subnormal: float
    mantissa_bits: int          # explicit bits: fp16 10, bf16 7

    @property
    def unit_roundoff(self) -> float:
        """Largest relative error of one rounding to nearest (2^-(bits+1))."""
        return 2.0 ** -(self.mantissa_bits + 1)


FORMATS = {
    "float16": Format("fp16", 65504.0, 2.0 ** -14, 2.0 ** -24, 10),
    "bfloat16": Format("bf16", 3.3895e38, 2.0 ** -126, 2.0 ** -133, 7),
}


@dataclass
class Stats:
    """Magnitudes of all entries one tensor (or one key over several steps) held."""

    numel: int = 0
    zeros: int = 0
    nonfinite: int = 0
    max_abs: float = 0.0
    min_abs: float = math.inf               # smallest nonzero magnitude
    hist: np.ndarray = field(default_factory=lambda: np.zeros(BINS, np.int64))
    sq: np.ndarray = field(default_factory=lambda: np.zeros(BINS, np.float64))   # sum of x^2 per bin

    def add(self, x: np.ndarray) -> "Stats":
        a = np.abs(np.asarray(x, dtype=np.float32).ravel())
        finite = np.isfinite(a)
        self.numel += a.size
        self.nonfinite += int(a.size - finite.sum())
        a = a[finite]
        nz = a[a > 0]
        self.zeros += int(a.size - nz.size)
        if nz.size:
            self.max_abs = max(self.max_abs, float(nz.max()))
            self.min_abs = min(self.min_abs, float(nz.min()))
            _, e = np.frexp(nz)
            bins = np.clip(e + OFFSET, 0, BINS - 1)
            self.hist += np.bincount(bins, minlength=BINS)
            self.sq += np.bincount(bins, weights=np.square(nz, dtype=np.float64), minlength=BINS)
        return self

    def merge(self, other: "Stats") -> "Stats":
        self.numel += other.numel
        self.zeros += other.zeros
        self.nonfinite += other.nonfinite
        self.max_abs = max(self.max_abs, other.max_abs)
        self.min_abs = min(self.min_abs, other.min_abs)
        self.hist += other.hist
        self.sq += other.sq
        return self

    @property
    def nonzero(self) -> int:
        return int(self.hist.sum())

    def count_below(self, bound: float, scale: float = 1.0) -> int:
        """Nonzero entries with ``|x| * scale < bound`` (exact when both are powers of two)."""
        k = math.floor(math.log2(bound / scale))   # |x| < 2^k  <=>  e <= k
        return int(self.hist[: max(0, min(BINS, k + OFFSET + 1))].sum())

    def count_above(self, bound: float, scale: float = 1.0) -> int:
        """Entries with ``|x| * scale`` at or above the power of two nearest above ``bound``."""
        k = math.ceil(math.log2(bound / scale))    # |x| >= 2^k  <=>  e >= k + 1
        return int(self.hist[max(0, min(BINS, k + 1 + OFFSET)):].sum()) + self.nonfinite

    def mass_below(self, bound: float, scale: float = 1.0) -> float:
        """Share of the L1 mass in entries with ``|x| * scale < bound`` (bins weighted by 2^e)."""
        w = self.hist * np.exp2(np.arange(BINS, dtype=np.float64) - OFFSET)
        total = float(w.sum())
        k = math.floor(math.log2(bound / scale))
        return float(w[: max(0, min(BINS, k + OFFSET + 1))].sum()) / total if total > 0 else 0.0

    @property
    def sumsq(self) -> float:
        """Sum of squares of the finite entries (the squared L2 norm)."""
        return float(self.sq.sum())

    def sumsq_below(self, bound: float, scale: float = 1.0) -> float:
        """Sum of squares (unscaled) of the nonzero entries with ``|x| * scale < bound`` (exact when
        both are powers of two): the part of the squared L2 norm those entries carry."""
        k = math.floor(math.log2(bound / scale))
        return float(self.sq[: max(0, min(BINS, k + OFFSET + 1))].sum())

    def shares(self, fmt: Format, scale: float = 1.0) -> dict:
        """Shares of all entries above max, below smallest normal, rounded to 0 (at ``scale``)."""
        n = max(self.numel, 1)
        return {"above_max": self.count_above(fmt.max, scale) / n,
                "below_normal": self.count_below(fmt.min_normal, scale) / n,
                "flushed": self.count_below(fmt.min_subnormal / 2, scale) / n}

    @property
    def dynamic_range_bits(self) -> float:
        """log2(max / smallest nonzero): how many binades the tensor spans."""
        if self.max_abs <= 0 or not math.isfinite(self.min_abs):
            return 0.0
        return math.log2(self.max_abs / self.min_abs)

    def summary(self, fmt: Format, scale: float = 1.0) -> dict:
        return {"numel": self.numel, "zeros": self.zeros, "nonfinite": self.nonfinite,
                "max_abs": self.max_abs, "min_abs": self.min_abs if math.isfinite(self.min_abs) else None,
                "dynamic_range_bits": round(self.dynamic_range_bits, 1),
                **{k: round(v, 6) for k, v in self.shares(fmt, scale).items()}}


def signal_lost(stats: list[Stats], bound: float, scale: float = 1.0, reference: float | None = None) -> float:
    """Share of the gradient's L2 norm in the entries with ``|x| * scale < bound``:
    ``sqrt(sum of their squares / reference)``, ``reference`` being the squared L2 norm of the whole
    gradient (default: of ``stats`` together). Tiny entries of a tensor whose gradient is ~0
    anyway lose next to nothing, however many of them there are."""
    ref = sum(s.sumsq for s in stats) if reference is None else reference
    lost = sum(s.sumsq_below(bound, scale) for s in stats)
    return math.sqrt(lost / ref) if ref > 0 else 0.0


def loss_scale_window(stats: list[Stats], fmt: Format, tolerance: float = 0.01,
                      reference: float | None = None) -> tuple[float, float]:
    """Powers of two ``(low, high)``: ``high`` keeps the largest scaled gradient finite; ``low`` is the
    smallest scale at which at most ``tolerance`` of the gradient's L2 norm (:func:`signal_lost`,
    against ``reference``) sits below the smallest normal (tiny entries next to large ones, or in a
    tensor whose gradient is ~0, carry little of the update).

    ``low > high`` means no scale does both (the gradients span more than the format's range).
    """
    stats = [s for s in stats if s.nonzero]
    if not stats:
        return 1.0, 2.0 ** 24
    top = max(s.max_abs for s in stats)
    high = 2.0 ** math.floor(math.log2(fmt.max / top))
    low = next((2.0 ** k for k in range(-40, 100)
                if signal_lost(stats, fmt.min_normal, 2.0 ** k, reference) <= tolerance), 2.0 ** 100)
    return low, high


def pick_scale(window: tuple[float, float]) -> float:
    """A loss scale inside ``window`` with headroom below its top (a quarter of it, at least low)."""
    low, high = window
    return max(low, high / 4) if low <= high else high


def relative_error(ref: np.ndarray, got: np.ndarray) -> float:
    """||got - ref|| / ||ref|| (inf when ``got`` holds inf/NaN)."""
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    if not np.isfinite(got).all():
        return math.inf
    den = float(np.linalg.norm(ref))
    return float(np.linalg.norm(got - ref)) / den if den > 0 else float(np.linalg.norm(got))


def cosine(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, np.float64).ravel(), np.asarray(got, np.float64).ravel()
    if not np.isfinite(got).all():
        return math.nan
    den = float(np.linalg.norm(ref) * np.linalg.norm(got))
    return float(ref @ got) / den if den > 0 else (1.0 if not ref.any() and not got.any() else 0.0)
