"""tools/split_noise.py: the image noise of paired AMP-vs-FP32 differences (the split held fixed by
the report's paired test is resampled instead, one set of draws for every run)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import ROOT, TINY, run_tool

from zoo.metrics.bootstrap import hmean_from_sums, resample_counts
from zoo.report.split_noise import difference_interval


def test_difference_interval_hand_computed():
    # one pair, three replicates: differences 10, 20, 30 pp; numpy's linear percentiles at 90 %
    # are 10 + 0.05 * 2 * 10 = 11 and 30 - 1 = 29
    r = difference_interval([[0.7, 0.8, 0.9]], [[0.6, 0.6, 0.6]])
    assert (r["low"], r["high"], r["half_width"], r["se"]) == pytest.approx((11.0, 29.0, 9.0, 10.0))
    # two pairs: the replicate is the mean over pairs, (10 + 0) / 2, (20 + 10) / 2, (30 + 20) / 2 =
    # 5, 15, 25, whose 90 % percentiles are 5 + 0.1 * 10 = 6 and 25 - 1 = 24
    r = difference_interval([[0.7, 0.8, 0.9], [0.5, 0.6, 0.7]], [[0.6] * 3, [0.5] * 3])
    assert (r["low"], r["high"]) == pytest.approx((6.0, 24.0))
    with pytest.raises(ValueError, match="one shape"):
        difference_interval([[0.1, 0.2]], [[0.1, 0.2, 0.3]])


def test_image_noise_added_to_the_paired_test_hand_computed():
    from zoo.report.split_noise import with_image_noise
    from zoo.report.stats import t_ppf

    # differences 1, 2, 3 pp: mean 2, sd 1, seed se 1/sqrt(3); image se 1 -> se sqrt(1/3 + 1) = 1.1547
    r = with_image_noise([1.0, 2.0, 3.0], 1.0, delta=5.0)
    se = (1 / 3 + 1) ** 0.5
    assert r["se"] == pytest.approx(se) and r["se_seeds"] == pytest.approx(3 ** -0.5)
    half = t_ppf(0.95, 2) * se  # 2.919986 * 1.154701 = 3.371709
    assert half == pytest.approx(3.371709, abs=1e-5)
    assert r["ci"] == pytest.approx([2 - half, 2 + half])
    assert r["verdict"] == "not shown"  # upper bound 5.37 > 5
    # without image noise the same differences are equivalent at +-5 (2 + 2.92 / sqrt(3) = 3.69)
    assert with_image_noise([1.0, 2.0, 3.0], 0.0, delta=5.0)["verdict"] == "equivalent"
    # and a large image noise turns a seeds-only "different" into "not shown"
    assert with_image_noise([3.0, 3.1, 2.9, 3.05, 2.95], 0.0, delta=1.0)["verdict"] == "different"
    assert with_image_noise([3.0, 3.1, 2.9, 3.05, 2.95], 2.0, delta=1.0)["verdict"] == "not shown"


def test_tasks_resample_their_images_as_the_metric_pools_them():
    from zoo.tasks.classification import ClassificationTask
    from zoo.tasks.text_detection import DBTask

    cls = ClassificationTask.__new__(ClassificationTask)
    cls._hits = [np.array([1, 0], np.int8), np.array([1, 1], np.int8)]
    draws = np.array([[1, 1, 1, 1], [2, 0, 1, 1], [0, 4, 0, 0]])
    assert cls.n_evaluated_images() == 4
    assert cls.resampled_primary(draws).tolist() == pytest.approx([0.75, 1.0, 0.0])
    db = DBTask.__new__(DBTask)
    db._counts = [(4, 2, 2), (2, 4, 1)]  # gt_care, det_care, matched per image
    # image 0 twice: gt 8, det 4, matched 4 -> recall 0.5, precision 1.0, hmean 2/3
    got = db.resampled_primary(np.array([[2, 0], [1, 1]]))
    assert got[0] == pytest.approx(2 / 3)
    assert got[1] == pytest.approx(float(hmean_from_sums(6, 6, 3)))  # 0.5 and 0.5 -> 0.5
    assert got[1] == pytest.approx(0.5) and db.n_evaluated_images() == 2


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    """Four tiny runs, FP32 and emulated O1 for seeds 0 and 1, as `tools/train.py -m` writes them."""
    sweep = tmp_path_factory.mktemp("split_noise") / "sweep"
    res = run_tool(["tools/train.py", "-m", *TINY, "amp=fp32,O1", "seed=0,1", f"hydra.sweep.dir={sweep}"],
                   cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return sweep


@pytest.mark.slow
def test_split_noise_of_a_real_sweep(tiny_sweep, tmp_path):
    sweep = tiny_sweep
    out = tmp_path / "noise.json"
    res = run_tool(["tools/split_noise.py", str(sweep), "--resamples", "200", "--out", str(out)], cwd=ROOT)
    assert res.returncode in (0, 1), res.stderr[-2000:]
    entry = json.loads(out.read_text())[0]
    assert entry["n_pairs"] == 2 and entry["n_images"] == 48 and entry["images"]["n_resamples"] == 200
    assert "(2 pairs, 48 images, margin ±" in res.stdout and "  - images only (pairs fixed, 200 draws" in res.stdout
    # the mean difference is the summaries' own
    runs = {p.name: json.loads((p / "summary.json").read_text()) for p in sweep.iterdir() if p.is_dir()}
    value = {(s["effective_precision"], s["seed"]): s["primary_metric"]["value"] for s in runs.values()}
    diff = np.mean([100 * (value[("emulated-fp16-O1", s)] - value[("fp32", s)]) for s in (0, 1)])
    assert entry["mean_difference"] == pytest.approx(diff)
    # independent of the tool's loop: the same draws applied to each run's own per-image hits
    from zoo.report.runs import load_runs
    from zoo.report.split_noise import evaluate_run

    hits = {}
    for run in load_runs([sweep]):
        task = evaluate_run(run)
        hits[(run.precision, run.summary["seed"])] = np.concatenate(task._hits).astype(float)
    draws = resample_counts(48, 200, 0)
    rep = np.mean([draws @ (hits[("emulated-fp16-O1", s)] - hits[("fp32", s)]) / 48 for s in (0, 1)], axis=0)
    lo, hi = np.quantile(100 * rep, [0.05, 0.95])
    assert (entry["images"]["low"], entry["images"]["high"]) == pytest.approx((lo, hi))
    assert entry["images"]["se"] == pytest.approx(float(np.std(100 * rep, ddof=1)))
    assert res.returncode == (0 if entry["with_image_noise"]["verdict"] == "equivalent" else 1)


@pytest.mark.slow
def test_a_run_whose_metric_does_not_reproduce_is_refused(tiny_sweep, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(tiny_sweep, sweep)
    victim = next(p for p in sorted(sweep.iterdir()) if p.name.endswith("O1_seed1"))
    s = json.loads((victim / "summary.json").read_text())
    s["primary_metric"]["value"] += 0.01
    (victim / "summary.json").write_text(json.dumps(s))
    res = run_tool(["tools/split_noise.py", str(sweep)], cwd=ROOT)
    assert res.returncode == 2
    assert f"error: {victim}: evaluating its weights again gives top1" in res.stderr
    assert "not the setup that trained it" in res.stderr
    # a single run has no pair to resample: said so, exit 2
    res = run_tool(["tools/split_noise.py", str(victim)], cwd=ROOT)
    assert res.returncode == 2 and "no AMP-vs-FP32 comparison with two or more paired seeds" in res.stderr


@pytest.mark.slow
def test_a_run_without_its_config_is_named(tiny_sweep, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(tiny_sweep, sweep)
    victim = next(p for p in sorted(sweep.iterdir()) if p.name.endswith("fp32_seed0"))
    (victim / "config.yaml").unlink()
    res = run_tool(["tools/split_noise.py", str(sweep)], cwd=ROOT, timeout=300)
    assert res.returncode == 2
    assert f"error: {victim / 'config.yaml'}: no config.yaml, so the run cannot be evaluated again" in res.stderr


@pytest.mark.slow
def test_a_run_scored_in_fp32_is_evaluated_again_in_fp32(tmp_path):
    # trainer.eval_precision=fp32 (DB's recipes): the O1 run's primary metric is its weights' FP32
    # evaluation; split_noise evaluates them in FP32 again (evaluate_run refuses a value that differs)
    run_dir = tmp_path / "o1"
    res = run_tool(["tools/train.py", *TINY, "amp=O1", "seed=0", "trainer.eval_precision=fp32",
                    f"hydra.run.dir={run_dir}"], cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    from zoo.report.runs import load_runs
    from zoo.report.split_noise import evaluate_run

    (run,) = load_runs([run_dir])
    assert run.precision == "emulated-fp16-O1" and run.summary["primary_metric"]["evaluated_in"] == "fp32"
    task = evaluate_run(run)
    hits = np.concatenate(task._hits).astype(float)
    assert hits.mean() == pytest.approx(run.summary["primary_metric"]["value"], abs=1e-12)
    assert run.summary["primary_metric"]["value"] == run.summary["metrics_fp32_eval"]["top1"]
