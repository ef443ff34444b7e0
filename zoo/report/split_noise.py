"""How much of a paired AMP-minus-FP32 difference is the choice of validation images
(``tools/split_noise.py``).

The report's paired test scores every run on the same validation split, so its CI covers seed-to-seed
variation on that split, not which images the split happens to hold. Here the images are resampled
instead, with the pairs fixed: each run folder's final weights are evaluated again (in the run's own
precision, from its config.yaml; the result must equal its summary.json, or the run is refused), and
one set of bootstrap draws over the images is applied to every run, so that each replicate scores all
runs on the same resampled split. The spread of the replicates' mean paired difference is the image
noise of the difference. Added to the seed-to-seed standard error of the paired test, it gives a
verdict that covers both the seeds and the choice of images (conservatively: each pair's own image
noise, already in the seed-to-seed spread, is counted twice).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from zoo.engine.evaluate_run import evaluate_weights
from zoo.metrics.bootstrap import SEED, percentile_ci, resample_counts
from zoo.report.parity import FP32, _label, _verdict, load_margins, pair_runs, pick_delta, precision_order
from zoo.report.runs import ReportInputError, Run, group_runs, load_runs
from zoo.report.stats import _tost_from, paired_tost, t_test_from

DEFAULT_RESAMPLES = 1000
LEVEL = 0.90  # the level of the report's TOST CI, so the half-width reads against the same margin
MAX_MAP_RESAMPLES = 200  # COCOeval's accumulate runs once per replicate and run


def difference_interval(amp: np.ndarray, fp32: np.ndarray, level: float = LEVEL) -> dict:
    """Mean over pairs of (AMP - FP32) per replicate, in pp: ``amp`` and ``fp32`` are
    [pairs, replicates] arrays of the metric (fractions) on shared resampled splits."""
    amp, fp32 = np.asarray(amp, dtype=np.float64), np.asarray(fp32, dtype=np.float64)
    if amp.shape != fp32.shape or amp.ndim != 2 or amp.shape[0] < 1:
        raise ValueError(f"expected two [pairs, replicates] arrays of one shape, got {amp.shape} and {fp32.shape}")
    replicates = 100.0 * (amp - fp32).mean(axis=0)
    lo, hi = percentile_ci(replicates, level)
    return {"low": lo, "high": hi, "half_width": (hi - lo) / 2.0, "level": level,
            "n_resamples": int(amp.shape[1]), "replicate_mean": float(replicates.mean()),
            "se": float(replicates.std(ddof=1)) if replicates.size > 1 else 0.0}


def with_image_noise(diffs, image_se: float, delta: float, alpha: float = 0.05) -> dict:
    """The report's paired TOST with the image noise added: standard error sqrt(se_seeds^2 +
    se_images^2) on n - 1 df. Conservative: each pair's own image noise is already part of the
    seed-to-seed spread and is counted again; what the paired test leaves out is the part common
    to all pairs (they share the images)."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.size < 2:
        raise ValueError("needs at least two pairs")
    se_seeds = float(d.std(ddof=1) / np.sqrt(d.size))
    se = float(np.hypot(se_seeds, image_se))
    t = _tost_from(float(d.mean()), se, float(d.size - 1), delta, alpha)
    p_diff = t_test_from(float(d.mean()), se, float(d.size - 1))["p"]
    return {"ci": list(t["ci"]), "se": se, "se_seeds": se_seeds, "se_images": float(image_se),
            "p_diff": p_diff, "verdict": _verdict(t["equivalent"], p_diff, float(d.mean()), delta, alpha)}


def evaluate_run(run: Run):
    """Evaluate ``run``'s final weights as its primary metric was (in the run's precision, or in FP32
    where the run's ``trainer.eval_precision`` said so); return the task holding the per-image
    outcomes. Refuses a run whose evaluation does not reproduce its recorded primary metric."""
    from omegaconf import OmegaConf


    cfg_path = run.path / "config.yaml"
    if not cfg_path.is_file():
        raise ReportInputError(f"{cfg_path}: no config.yaml, so the run cannot be evaluated again")
    cfg = OmegaConf.load(cfg_path)
    OmegaConf.set_struct(cfg, False)
    cfg.checkpoint, cfg.output = str(run.path), None
    cfg.trainer.progress, cfg.trainer.draw_samples = False, 0
    evaluated_in = run.summary["primary_metric"].get("evaluated_in")
    if evaluated_in == "fp32" and run.precision != "fp32":
        # trainer.eval_precision=fp32 (DB's recipes): the final weights were scored in a plain FP32 copy
        # of the model (zoo/engine/final_eval.py), so they are evaluated again without AMP
        cfg.amp.enabled, cfg.amp.level, cfg.amp.name = False, "O0", "fp32"
    elif evaluated_in not in (None, run.precision):
        raise ReportInputError(f"{run.path / 'summary.json'}: primary_metric was evaluated in "
                               f"{evaluated_in}, not the run's {run.precision} nor fp32; not supported here")
    metrics, task, *_ = evaluate_weights(cfg)
    got = float(metrics[task.primary_metric])
    if not hasattr(task, "resampled_primary"):
        raise ReportInputError(f"{run.path}: task {type(task).__name__} cannot resample its images")
    if abs(got - run.metric) > 1e-9:
        raise ReportInputError(f"{run.path}: evaluating its weights again gives {task.primary_metric} "
                               f"{got:.6f}, its summary.json says {run.metric:.6f}: not the setup that "
                               "trained it (data, code or weights changed), so its images cannot be resampled")
    return task


def split_noise(inputs, margins_file, n_resamples: int = DEFAULT_RESAMPLES, level: float = LEVEL,
                delta: float | None = None, alpha: float = 0.05, progress=print) -> list[dict]:
    """One entry per AMP-vs-FP32 comparison with two or more pairs: the mean paired difference, its
    interval over resampled images (pairs fixed), and the paired TOST with that noise added."""
    groups, _ = group_runs(load_runs(inputs))
    margins = load_margins(margins_file)
    tasks: dict[Path, object] = {}

    def outcomes(run: Run):
        if run.path not in tasks:
            progress(f"evaluating {run.path} ({run.variant}, seed {run.summary['seed']})")
            tasks[run.path] = evaluate_run(run)
        return tasks[run.path]

    out = []
    for key, by_prec in groups.items():
        fp32 = by_prec.get(FP32)
        if not fp32:
            continue
        for prec in sorted((p for p in by_prec if p != FP32), key=precision_order):
            pairs, _ = pair_runs(by_prec[prec], fp32)
            if len(pairs) < 2:
                continue
            d, _source = pick_delta(pairs[0][1].metric_name, key[2], margins, delta)
            amp_tasks = [outcomes(a) for a, _ in pairs]
            fp32_tasks = [outcomes(f) for _, f in pairs]
            n_images = amp_tasks[0].n_evaluated_images()
            runs = [a for a, _ in pairs] + [f for _, f in pairs]
            for t, r in zip(amp_tasks + fp32_tasks, runs):
                if t.n_evaluated_images() != n_images:
                    raise ReportInputError(f"{r.path}: its validation split has {t.n_evaluated_images()} "
                                           f"images, {pairs[0][0].path}'s {n_images}: not one split")
            metric = pairs[0][1].metric_name
            n = min(n_resamples, MAX_MAP_RESAMPLES) if metric == "mAP" else n_resamples
            draws = resample_counts(n_images, n, SEED)
            amp_rep = np.stack([t.resampled_primary(draws) for t in amp_tasks])
            fp32_rep = np.stack([t.resampled_primary(draws) for t in fp32_tasks])
            interval = difference_interval(amp_rep, fp32_rep, level)
            diffs = [100.0 * (a.metric - f.metric) for a, f in pairs]
            seeds_only = paired_tost([100.0 * a.metric for a, _ in pairs], [100.0 * f.metric for _, f in pairs],
                                     d, alpha)
            combined = with_image_noise(diffs, interval["se"], d, alpha)
            out.append({"group": key, "precision": prec, "metric": metric,
                        "delta": d, "n_pairs": len(pairs), "n_images": n_images,
                        "mean_difference": float(np.mean(diffs)), "images": interval,
                        "seeds_only_ci": list(seeds_only["ci"]), "with_image_noise": combined})
    return out


def lines(entries: list[dict]) -> list[str]:
    """Markdown lines per comparison: the image interval, then the verdict with it added."""
    text = []
    for e in entries:
        im, c = e["images"], e["with_image_noise"]
        text += [f"- **{_label(e['group'])} / {e['precision']} vs fp32** ({e['n_pairs']} pairs, "
                 f"{e['n_images']} images, margin ±{e['delta']:g} pp): mean difference "
                 f"{e['mean_difference']:+.2f} pp",
                 f"  - seeds only (the report's paired test, images fixed): 90% CI "
                 f"[{e['seeds_only_ci'][0]:+.2f}, {e['seeds_only_ci'][1]:+.2f}], standard error "
                 f"{c['se_seeds']:.2f} pp",
                 f"  - images only (pairs fixed, {im['n_resamples']} draws over the images): "
                 f"{im['level']:.0%} interval [{im['low']:+.2f}, {im['high']:+.2f}], standard error "
                 f"{im['se']:.2f} pp",
                 f"  - both (standard errors added in quadrature, conservative): 90% CI "
                 f"[{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}], verdict {c['verdict']}"]
    return text
