"""Compare every AMP group with its FP32 group on the primary metric and give a verdict.

Metric values in summaries are fractions in [0, 1]; everything here is in percentage points (x100),
the unit the equivalence margins in configs/report.yaml are written in.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import yaml

from zoo.report.runs import ReportInputError, Run
from zoo.report.stats import paired_t_test, paired_tost, tost, tost_sample_size, welch_t_test
from zoo.utils.checks import COUNT_OR_ZERO, POSITIVE, check

FP32 = "fp32"
POWER = 0.8  # for the seeds-needed line
# summary.json "pairing" digests that must agree for two runs with one seed to count as a pair
PAIR_KEYS = {"init_weights": "initial-weights", "sample_ids": "first-batch sample-id",
             "batches": "first-batch data", "rng_state": "RNG-state"}
SINGLE = "single seed, no verdict"
_PRECISION = re.compile(r"^(emulated-)?(fp16|bf16)-O(\d)(.*)$")


def precision_order(precision: str) -> tuple:
    """Sort key for the rows of a table: fp16 before bf16, O1 before O2, a GPU run before its
    emulation, a faithful emulation before its ablations; labels of any other form last, by name
    (alphabetical order put bf16 above fp16, the reverse of how AMP tables are read)."""
    m = _PRECISION.match(precision)
    if not m:
        return (1, precision)
    emulated, fmt, level, rest = m.groups()
    return (0, fmt != "fp16", int(level), emulated is not None, rest)


def load_margins(path: Path) -> dict:
    """The delta table and the short-run rule of ``path`` (configs/report.yaml, which the tool
    names: this package reads run folders and the files it is given, never the repository by path)."""
    try:
        cfg = yaml.safe_load(Path(path).read_text())
        margins = {"short_below_steps": check("short_below_steps", cfg["short_below_steps"], COUNT_OR_ZERO),
                   "deltas": {regime: {str(k).lower(): float(check(f"deltas.{regime}.{k}", v, POSITIVE))
                                       for k, v in table.items()}
                              for regime, table in cfg["deltas"].items()}, "source": str(path)}
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise ReportInputError(f"{path}: unusable report config ({err})") from None
    return margins


def pick_delta(metric: str, steps: int, margins: dict, override: float | None) -> tuple[float, str]:
    """Margin in pp and where it came from ("--delta", or the regime "full"/"short")."""
    if override is not None:
        return float(override), "--delta"
    regime = "short" if steps < margins["short_below_steps"] else "full"
    table = margins["deltas"].get(regime, {})
    if metric.lower() not in table:
        raise ReportInputError(f"{margins.get('source', 'the report config')}: no '{regime}' delta for metric '{metric}'; "
                               "add one or pass --delta")
    return table[metric.lower()], regime


def _side(runs: list[Run]) -> dict:
    """Per-precision row facts: metric in pp over seeds, speed, memory, scaler behaviour."""
    vals = np.array([r.metric * 100.0 for r in runs])
    s = [r.summary for r in runs]

    def mean_of(key):
        xs = [float(x[key]) for x in s if isinstance(x.get(key), (int, float))]
        return float(np.mean(xs)) if xs else None

    scales = sorted({float(x["final_loss_scale"]) for x in s
                     if isinstance(x.get("final_loss_scale"), (int, float))})
    cis = [r.eval_ci for r in runs]
    halves = [(c["high"] - c["low"]) * 50.0 for c in cis if c]
    effects = {r.summary["seed"]: r.eval_only_effect for r in runs if r.eval_only_effect is not None}
    # per seed: images with inf/NaN outputs behind the primary metric / in the training precision
    nonfinite = {r.summary["seed"]: r.nonfinite_images for r in runs if r.nonfinite_images}
    nonfinite_train = {r.summary["seed"]: r.train_precision_nonfinite_images for r in runs
                       if r.train_precision_nonfinite_images}
    images = max((int((r.summary.get("eval_numerics") or {}).get("images") or 0) for r in runs), default=0)
    return {"precision": runs[0].variant, "n": len(runs), "seeds": [x["seed"] for x in s],
            "values": vals.tolist(), "mean": float(vals.mean()),
            "eval_ci": [{"seed": r.summary["seed"], "low": c["low"] * 100.0, "high": c["high"] * 100.0,
                         "n_images": c.get("n_images"), "n_resamples": c.get("n_resamples")}
                        if c else None for r, c in zip(runs, cis)],
            "eval_ci_half_width": float(np.mean(halves)) if halves else None,
            "eval_only_effect": ({"mean": float(np.mean(list(effects.values()))), "per_seed": effects}
                                 if effects else None),
            "nonfinite": {"primary": nonfinite, "train_precision": nonfinite_train, "images": images},
            "std": float(vals.std(ddof=1)) if len(vals) > 1 else 0.0,
            "batch_size_per_rank": s[0].get("batch_size_per_rank"),
            "global_batch_size": s[0].get("global_batch_size"), "world_size": s[0].get("world_size"),
            "peak_memory_mb": mean_of("peak_memory_mb"), "peak_memory_kind": s[0].get("peak_memory_kind"),
            "images_per_s": mean_of("images_per_s"), "skipped_steps": mean_of("skipped_steps"),
            "wall_time_s": [float(x["wall_time_s"]) for x in s if isinstance(x.get("wall_time_s"), (int, float))],
            # resumed by a trainer that did not carry wall time over: only the last segment counted
            "wall_time_partial": sum(1 for x in s if x.get("resumed_from") and "wall_time_before_resume_s" not in x),
            "final_loss_scale": scales, "device": s[0].get("device"),
            "runs": [str(r.path) for r in runs]}


def _digest_mismatch(amp: Run, ref: Run) -> str | None:
    """Why two runs with one seed are not a pair, or None when their start digests all agree."""
    a, b = amp.summary.get("pairing"), ref.summary.get("pairing")
    if not isinstance(a, dict) or not isinstance(b, dict):
        who = "either run" if not a and not b else ("this run" if not isinstance(a, dict) else "the FP32 run")
        return f"no pairing digests recorded in {who}"
    for key, name in PAIR_KEYS.items():
        if a.get(key) is None or a.get(key) != b.get(key):
            return (f"its {name} digest differs from FP32 seed {ref.summary['seed']}'s "
                    f"({str(a.get(key))[:12]} vs {str(b.get(key))[:12]})")
    return None


def pair_runs(amp: list[Run], fp32: list[Run]) -> tuple[list[tuple[Run, Run]], list[dict]]:
    """Pairs (AMP run, FP32 run) with one seed and identical start digests; the rest with reasons."""
    def by_seed(runs):
        out: dict = {}
        for r in runs:
            out.setdefault(str(r.summary["seed"]), []).append(r)
        return out

    a_seeds, f_seeds = by_seed(amp), by_seed(fp32)
    pairs, unpaired = [], []
    for seed, a_runs in a_seeds.items():
        f_runs = f_seeds.get(seed, [])
        if len(a_runs) > 1 or len(f_runs) > 1:
            why = f"{len(a_runs)} {a_runs[0].variant} and {len(f_runs)} FP32 runs with seed {seed}: ambiguous"
            unpaired += [{"path": str(r.path), "seed": r.summary["seed"], "reason": why} for r in a_runs + f_runs]
            continue
        if not f_runs:
            unpaired.append({"path": str(a_runs[0].path), "seed": a_runs[0].summary["seed"],
                             "reason": f"no FP32 run with seed {seed}", "run_side": a_runs[0].variant,
                             "missing": "FP32"})
            continue
        why = _digest_mismatch(a_runs[0], f_runs[0])
        if why:
            unpaired.append({"path": str(a_runs[0].path), "seed": a_runs[0].summary["seed"], "reason": why})
            unpaired.append({"path": str(f_runs[0].path), "seed": f_runs[0].summary["seed"],
                             "reason": f"its {a_runs[0].variant} run with seed {seed} did not pair"})
        else:
            pairs.append((a_runs[0], f_runs[0]))
    for seed, f_runs in f_seeds.items():
        if seed not in a_seeds:
            unpaired += [{"path": str(r.path), "seed": r.summary["seed"],
                          "reason": f"no {amp[0].variant} run with seed {seed}", "run_side": "FP32",
                          "missing": amp[0].variant} for r in f_runs]
    return pairs, unpaired


def power_line(ci, sd: float | None, delta: float, alpha: float, paired: bool) -> dict:
    """Smallest margin the data show equivalence at, and seeds a ``delta`` margin would need."""
    if ci is None or sd is None:
        return {"min_margin": None, "n_needed": None, "sd": None, "paired": paired, "power": POWER}
    return {"min_margin": float(max(abs(ci[0]), abs(ci[1]))), "sd": float(sd), "paired": paired,
            "power": POWER, "n_needed": tost_sample_size(sd, delta, alpha, POWER, paired=paired)}


def _verdict(equivalent: bool, p_diff: float, diff: float, delta: float, alpha: float) -> str:
    if equivalent:
        return "equivalent"
    if p_diff < alpha and abs(diff) > delta:
        return "different"  # significantly different AND beyond the margin: a difference that matters
    return "not shown"  # too few seeds or too much noise to decide either way


def compare(amp: list[Run], fp32: list[Run], delta: float, alpha: float) -> dict:
    """Verdict of one AMP side against the FP32 side (both lists of runs, one per seed).

    Paired TOST on per-seed differences when at least two seeds pair (same seed, identical start
    digests); else Welch TOST over all runs when each side has two or more; else no verdict.
    """
    pairs, unpaired = pair_runs(amp, fp32)
    diffs = [{"seed": a.summary["seed"], "diff": (a.metric - f.metric) * 100.0,
              "amp": str(a.path), "fp32": str(f.path)} for a, f in pairs]
    out = {"pairs": diffs, "unpaired": unpaired}
    if len(pairs) >= 2:
        a = np.array([x.metric * 100.0 for x, _ in pairs])
        b = np.array([y.metric * 100.0 for _, y in pairs])
        t, pt = paired_tost(a, b, delta, alpha), paired_t_test(a, b)
        why = f"{len(pairs)} seeds paired (identical initial-weight, first-batch and RNG digests)"
        if unpaired:
            why += f"; {len(unpaired)} run(s) not paired are left out"
        out.update(test="paired TOST", test_reason=why, diff=t["diff"], ci=list(t["ci"]), p_tost=t["p"],
                   p_diff=pt["p"], df=t["df"], se=t["se"],
                   verdict=_verdict(t["equivalent"], pt["p"], t["diff"], delta, alpha),
                   power=power_line(t["ci"], t["sd"], delta, alpha, paired=True))
        return out
    a = np.array([r.metric * 100.0 for r in amp])
    b = np.array([r.metric * 100.0 for r in fp32])
    few = f"only {len(pairs)} seed(s) paired" if pairs else "no seed paired"
    if len(a) >= 2 and len(b) >= 2:
        t, welch = tost(a, b, delta, alpha), welch_t_test(a, b)
        sd = math.sqrt(float(a.var(ddof=1) + b.var(ddof=1)))
        out.update(test="Welch TOST", test_reason=f"unpaired: {few}", diff=t["diff"], ci=list(t["ci"]),
                   p_tost=t["p"], p_diff=welch["p"], df=t["df"], se=t["se"],
                   verdict=_verdict(t["equivalent"], welch["p"], t["diff"], delta, alpha),
                   power=power_line(t["ci"], sd, delta, alpha, paired=False))
        return out
    # One seed on a side: no variance estimate, so no test; the raw difference is shown.
    out.update(test="single seed", test_reason=f"one seed on a side ({few}): no variance estimate",
               diff=float(a.mean() - b.mean()), ci=None, p_tost=None, p_diff=None, df=None, se=None,
               verdict=SINGLE, power=power_line(None, None, delta, alpha, paired=bool(pairs)))
    return out


def _label(key: tuple) -> str:
    model, data, steps, gbs, start = key
    return f"{model} / {data} / {steps} steps / batch {gbs}" + (f" / fine-tuned from {start}" if start else "")


def parity_table(groups: dict, margins: dict, delta: float | None = None, alpha: float = 0.05) -> list[dict]:
    """One entry per group: FP32 reference facts and one comparison per AMP precision; ``margins``
    from :func:`load_margins`."""
    table = []
    for key, by_prec in groups.items():
        first = next(iter(by_prec.values()))[0]
        metric = first.metric_name
        names = {r.metric_name for runs in by_prec.values() for r in runs}
        if len(names) > 1:
            raise ReportInputError(f"{first.path / 'summary.json'}: runs of group {_label(key)} "
                                   f"disagree on the primary metric ({sorted(names)})")
        d, source = pick_delta(metric, key[2], margins, delta)
        fp32 = by_prec.get(FP32)
        entry = {"group": _label(key), "model": key[0], "data": key[1], "steps": key[2],
                 "global_batch_size": key[3], "metric": metric, "delta": d, "delta_source": source,
                 "alpha": alpha, "fp32": _side(fp32) if fp32 else None, "amp": []}
        for prec in sorted((p for p in by_prec if p != FP32), key=precision_order):
            side = _side(by_prec[prec])
            if fp32:
                side.update(compare(by_prec[prec], fp32, d, alpha))
            else:
                side.update({"test": "no FP32 runs", "test_reason": "no FP32 runs in this group",
                             "diff": None, "ci": None, "p_tost": None, "p_diff": None, "df": None,
                             "se": None, "verdict": "not shown", "pairs": [], "unpaired": [], "power": None})
            entry["amp"].append(side)
        table.append(entry)
    return table


def overall_ok(table: list[dict]) -> bool:
    """True only when at least one AMP comparison exists and every one is "equivalent"."""
    verdicts = [side["verdict"] for entry in table for side in entry["amp"]]
    return bool(verdicts) and all(v == "equivalent" for v in verdicts)


def finite_or_none(x):
    """JSON-safe number: NaN/inf become None (json would write invalid tokens)."""
    return x if not isinstance(x, float) or math.isfinite(x) else None
