"""Small statistics kit for the AMP-vs-FP32 parity report, numpy (and ``math``) only.

scipy is deliberately not a dependency of the zoo, so the Student-t distribution is built from the
regularized incomplete beta function, evaluated with the continued fraction of Numerical Recipes
(modified Lentz's method). That is accurate to ~1e-12 for the degrees of freedom a seed sweep has.
"""
from __future__ import annotations

import math

import numpy as np

_EPS = 1e-15
_TINY = 1e-300
_MAX_ITER = 10_000


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of I_x(a, b) (modified Lentz); converges fast for x < (a+1)/(a+b+2)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_ITER + 1):
        m2 = 2 * m
        # even step of the fraction
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > _TINY else _TINY
        h *= d * c
        # odd step
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x={x} outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    # Use the symmetry I_x(a,b) = 1 - I_{1-x}(b,a) on the side where the fraction converges quickly.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def norm_cdf(z: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def t_cdf(t: float, df: float) -> float:
    """Student-t CDF P(T <= t) with ``df`` degrees of freedom (df may be non-integer or inf)."""
    if math.isnan(t) or not df > 0:
        raise ValueError(f"t_cdf: need a number t and df > 0, got t={t}, df={df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    if math.isinf(df) or df > 1e7:  # the fraction slows down as df grows; the normal is exact enough
        return norm_cdf(t)
    # P(|T| > |t|) = I_{df/(df+t^2)}(df/2, 1/2)
    tail = 0.5 * betainc(0.5 * df, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """Quantile of the Student-t distribution, by bisection on :func:`t_cdf` (monotone, so safe)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"t_ppf: q={q} outside (0, 1)")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > q:
        lo *= 2.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return 0.5 * (lo + hi)


def welch_se_df(a, b) -> tuple[float, float]:
    """Welch standard error of mean(a) - mean(b) and the Welch-Satterthwaite degrees of freedom."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2:
        raise ValueError("Welch statistics need at least two values on each side")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0.0:  # both sides constant: the difference is known exactly
        return 0.0, math.inf
    df = float((va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1)))
    return se, df


def welch_t_test(a, b) -> dict:
    """Two-sided Welch t-test of mean(a) == mean(b): dict with diff, se, df, t, p."""
    diff = float(np.mean(a) - np.mean(b))
    se, df = welch_se_df(a, b)
    if se == 0.0:
        t = 0.0 if diff == 0 else math.copysign(math.inf, diff)
    else:
        t = diff / se
    p = 2.0 * (1.0 - t_cdf(abs(t), df)) if not math.isinf(t) else 0.0
    return {"diff": diff, "se": se, "df": df, "t": t, "p": min(1.0, p)}


def _tost_from(diff: float, se: float, df: float, delta: float, alpha: float) -> dict:
    """TOST of a difference estimate with standard error ``se`` on ``df`` degrees of freedom."""
    if not delta > 0:
        raise ValueError(f"tost: delta must be > 0, got {delta}")
    if se == 0.0:
        t_lower = math.inf if diff > -delta else -math.inf
        t_upper = -math.inf if diff < delta else math.inf
        half = 0.0
    else:
        t_lower, t_upper = (diff + delta) / se, (diff - delta) / se
        half = t_ppf(1.0 - alpha, df) * se
    p_lower = 1.0 - t_cdf(t_lower, df)  # evidence against diff <= -delta
    p_upper = t_cdf(t_upper, df)        # evidence against diff >= +delta
    p = max(p_lower, p_upper)
    return {"diff": diff, "se": se, "df": df, "t_lower": t_lower, "t_upper": t_upper,
            "p_lower": p_lower, "p_upper": p_upper, "p": p, "equivalent": bool(p < alpha),
            "ci": (diff - half, diff + half), "ci_level": 1.0 - 2.0 * alpha, "delta": delta}


def tost(a, b, delta: float, alpha: float = 0.05) -> dict:
    """Two one-sided tests that mean(a) - mean(b) lies inside (-delta, +delta) (Welch, unpaired).

    ``a`` is the AMP side, ``b`` FP32. H0_lower: diff <= -delta, H0_upper: diff >= +delta; both must
    be rejected at ``alpha``. Equivalently, the (1 - 2*alpha) confidence interval of the difference
    (90% for alpha = 0.05) lies strictly inside (-delta, +delta); the interval is returned as ``ci``.
    """
    if not delta > 0:
        raise ValueError(f"tost: delta must be > 0, got {delta}")
    se, df = welch_se_df(a, b)
    return _tost_from(float(np.mean(a) - np.mean(b)), se, df, delta, alpha)


def paired_tost(a, b, delta: float, alpha: float = 0.05) -> dict:
    """TOST on per-seed differences ``a[i] - b[i]`` (a paired design: one t test on n - 1 df).

    Seed-to-seed variation common to both precisions (initial weights, data order) cancels in the
    differences, which is why a paired sweep can show equivalence with far fewer seeds.
    """
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.size < 2:
        raise ValueError("paired TOST needs at least two pairs")
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    out = _tost_from(float(d.mean()), se, float(d.size - 1), delta, alpha)
    out["sd"] = float(d.std(ddof=1))
    return out


def paired_t_test(a, b) -> dict:
    """Two-sided one-sample t test of the per-seed differences against 0."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return t_test_from(float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)), float(d.size - 1))


def t_test_from(diff: float, se: float, df: float) -> dict:
    """Two-sided t test of a difference estimate with standard error ``se`` on ``df`` df against 0."""
    if se == 0.0:
        return {"diff": diff, "se": 0.0, "df": df, "t": 0.0 if diff == 0 else math.copysign(math.inf, diff),
                "p": 1.0 if diff == 0 else 0.0}
    t = diff / se
    return {"diff": diff, "se": se, "df": df, "t": t, "p": min(1.0, 2.0 * (1.0 - t_cdf(abs(t), df)))}


def tost_sample_size(sd: float, delta: float, alpha: float = 0.05, power: float = 0.8,
                     paired: bool = True, max_n: int = 10_000) -> int | None:
    """Smallest n (pairs, or seeds per side) for which TOST at ``alpha`` shows equivalence within
    ``delta`` with probability ``power`` when the true difference is 0.

    The standard formula with t quantiles, solved by iterating n from 2:
    ``n >= (t_{1-alpha, df} + t_{1-beta/2, df})^2 * v / delta^2`` with beta = 1 - power, where for
    pairs v = sd^2 (sd of the differences) and df = n - 1, and for two independent sides of n seeds
    v = sd^2 = sa^2 + sb^2 (pass that sum's root) and df = 2n - 2. None when n would exceed max_n.
    """
    if not delta > 0 or sd < 0:
        raise ValueError(f"tost_sample_size: need delta > 0 and sd >= 0, got {delta}, {sd}")
    beta = 1.0 - power
    for n in range(2, max_n + 1):
        df = n - 1 if paired else 2 * n - 2
        need = (t_ppf(1.0 - alpha, df) + t_ppf(1.0 - beta / 2.0, df)) ** 2 * sd * sd / (delta * delta)
        if n >= need:
            return n
    return None
