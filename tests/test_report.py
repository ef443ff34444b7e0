"""tools/report.py and zoo.report: numpy-only t distribution, TOST, and the parity verdicts on
synthetic run folders (no training: summaries and metric logs are written by hand)."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zoo.report.stats import paired_tost, t_cdf, t_ppf, tost, tost_sample_size, welch_t_test

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("report_tool", ROOT / "tools" / "report.py")
report_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_tool)


# ----------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("t, df, expected, tol", [
    (2.0, 5, 0.94903, 1e-5),        # t table
    (1.812, 10, 0.95, 2e-4),        # t_{0.95,10} = 1.812
    (2.228, 10, 0.975, 2e-4),       # t_{0.975,10} = 2.228
    (1.5, 1, 0.5 + math.atan(1.5) / math.pi, 1e-12),           # df=1 is Cauchy
    (-0.7, 2, 0.5 - 0.7 / (2 * math.sqrt(2 + 0.49)), 1e-12),   # df=2 closed form
    (1.959964, 1e6, 0.975, 1e-5),   # large df -> normal
    (1.959964, math.inf, 0.975, 1e-6),
])
def test_t_cdf_table_values(t, df, expected, tol):
    assert t_cdf(t, df) == pytest.approx(expected, abs=tol)
    assert t_cdf(-t, df) == pytest.approx(1 - expected, abs=tol)  # symmetry


def test_t_ppf_inverts_cdf():
    assert t_ppf(0.95, 4) == pytest.approx(2.132, abs=1e-3)  # table value
    assert t_ppf(0.975, 30) == pytest.approx(2.042, abs=1e-3)
    assert t_cdf(t_ppf(0.123, 7.5), 7.5) == pytest.approx(0.123, abs=1e-9)


def test_tost_hand_computed():
    amp, fp32 = [1.0, 2.0, 3.0], [0.0, 1.0, 2.0]
    # means 2 and 1 -> diff = 1; sample variances (ddof=1) both 1
    # se = sqrt(1/3 + 1/3) = sqrt(2/3) = 0.816497
    # Welch df = (2/3)^2 / ((1/3)^2/2 + (1/3)^2/2) = (4/9) / (1/9) = 4
    # delta = 3: t_lower = (1 + 3)/0.816497 = 4.898979, t_upper = (1 - 3)/0.816497 = -2.449490
    # df=4 has a closed form: F(t) = 1/2 + 3/8 * t/sqrt(1 + t^2/4) * (1 - t^2 / (12 (1 + t^2/4)))
    # t = -2.449490: t^2 = 6, 1 + 6/4 = 2.5, t/sqrt(2.5) = -1.549193, 1 - 6/30 = 0.8
    #   F = 0.5 + 0.375 * -1.549193 * 0.8 = 0.5 - 0.464758 = 0.035242 -> p_upper
    # t = 4.898979: t^2 = 24, 1 + 24/4 = 7, t/sqrt(7) = 1.851640, 1 - 24/84 = 0.714286
    #   F = 0.5 + 0.375 * 1.851640 * 0.714286 = 0.995975 -> p_lower = 1 - F = 0.004025
    # p = max = 0.035242 < 0.05 -> equivalent
    # 90% CI: t_{0.95,4} = 2.131847; 1 -/+ 2.131847 * 0.816497 = [-0.740646, 2.740646] inside +-3
    r = tost(amp, fp32, delta=3.0, alpha=0.05)
    assert r["diff"] == pytest.approx(1.0)
    assert r["se"] == pytest.approx(math.sqrt(2 / 3))
    assert r["df"] == pytest.approx(4.0)
    assert r["t_lower"] == pytest.approx(4.898979, abs=1e-6)
    assert r["t_upper"] == pytest.approx(-2.449490, abs=1e-6)
    assert r["p_upper"] == pytest.approx(0.035242, abs=1e-6)
    assert r["p_lower"] == pytest.approx(0.004025, abs=1e-6)
    assert r["p"] == pytest.approx(0.035242, abs=1e-6) and r["equivalent"]
    assert r["ci"] == pytest.approx((-0.740646, 2.740646), abs=1e-6)
    # delta = 2.5: t_upper = -1.5/0.816497 = -1.837117, p_upper = F(-1.837117) = 0.070 > 0.05;
    # the CI upper end 2.740646 > 2.5 too: TOST fails exactly when the CI leaves the margin.
    r = tost(amp, fp32, delta=2.5)
    assert not r["equivalent"] and r["ci"][1] > 2.5
    assert welch_t_test(amp, fp32)["p"] == pytest.approx(2 * t_cdf(-1 / math.sqrt(2 / 3), 4))


def test_tost_ci_matches_decision():
    rng = np.random.default_rng(0)
    for _ in range(30):
        a, b = rng.normal(0.3, 0.4, 4), rng.normal(0, 0.3, 5)
        r = tost(a, b, delta=0.8)
        assert r["equivalent"] == (-0.8 < r["ci"][0] and r["ci"][1] < 0.8)


# ----------------------------------------------------------------------------- run folders
def make_run(root: Path, name: str, seed: int, top1: float, requested="fp16-O1",
             effective="emulated-fp16-O1", steps=200, gbs=64, skipped=0, paired=False, **extra) -> Path:
    """A minimal finished run folder in the documented format; ``paired`` adds start digests that
    depend only on the seed (as training writes them), ``extra`` overrides summary keys."""
    run = root / name
    run.mkdir(parents=True)
    amp = effective != "fp32"
    summary = {"model": "resnet18", "data": "synthetic_shapes", "seed": seed,
               "requested_precision": requested, "effective_precision": effective, "device": "cpu",
               "primary_metric": {"name": "top1", "value": top1}, "metrics": {"top1": top1},
               "steps": steps, "epochs": 3.2, "images_per_s": 60.0 if amp else 70.0,
               "peak_memory_mb": 800.0, "peak_memory_kind": "host_rss", "wall_time_s": 10.0,
               "skipped_steps": skipped, "final_loss_scale": 32768.0 if amp else None,
               "batch_size_per_rank": gbs, "global_batch_size": gbs, "world_size": 1,
               "status": "completed"}
    if paired:
        summary["pairing"] = {k: f"{k}-digest-of-seed-{seed}" for k in
                              ("init_weights", "sample_ids", "batches", "rng_state")}
    summary.update(extra)
    (run / "summary.json").write_text(json.dumps(summary))
    lines = [{"kind": "train", "step": s, "loss": 2.3 / s ** 0.3 + 0.01 * seed, "lr": 1e-3,
              "loss_scale": (65536.0 if s < 100 else 32768.0) if amp else None,
              "skipped_steps": skipped if s >= 100 else 0, "images_per_s": 60.0}
             for s in range(10, steps + 1, 10)]
    lines.append({"kind": "eval", "step": steps, "top1": top1})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (run / "config.yaml").write_text(f"seed: {seed}\n")
    return run


def make_sweep(root: Path, amp_shift: float, seeds=5, amp_requested="fp16-O1",
               amp_effective="emulated-fp16-O1", paired=False, seed_sd=0.0) -> Path:
    """Hydra-multirun-like folder: FP32 and AMP jobs, metric = 0.70 + 0.2 pp noise (+ shift); with
    ``seed_sd`` each seed moves both precisions by a shared offset (what pairing cancels)."""
    rng = np.random.default_rng(0)
    for i in range(seeds):
        common = rng.normal(0, seed_sd) if seed_sd else 0.0
        make_run(root, f"{2 * i}_fp32_seed{i}", i, 0.70 + common + rng.normal(0, 0.002),
                 requested="fp32", effective="fp32", paired=paired)
        make_run(root, f"{2 * i + 1}_O1_seed{i}", i, 0.70 + common + amp_shift + rng.normal(0, 0.002),
                 requested=amp_requested, effective=amp_effective, skipped=i % 2, paired=paired)
    return root


def run_cli(*args):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "tools/report.py", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_equivalent_sweep_exits_0_and_writes_files(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", amp_shift=0.0)
    out = run_cli(sweep)
    assert out.returncode == 0, out.stderr
    assert "| equivalent |" in out.stdout and "(5)" in out.stdout
    rep = sweep / "report"
    for f in ("report.md", "report.json", "index.html"):
        assert (rep / f).is_file()
    pngs = sorted(p.name for p in rep.glob("*.png"))
    assert any(p.endswith("_loss.png") for p in pngs) and any(p.endswith("_loss_scale.png") for p in pngs)
    assert any(p.endswith("_metric.png") for p in pngs)
    data = json.loads((rep / "report.json").read_text())
    side = data["groups"][0]["amp"][0]
    assert data["all_equivalent"] and side["verdict"] == "equivalent" and side["n"] == 5
    assert side["test"] == "Welch TOST" and -1.0 < side["ci"][0] < side["ci"][1] < 1.0
    assert side["unpaired"][0]["reason"] == "no pairing digests recorded in either run"
    assert side["skipped_steps"] == pytest.approx(0.4)
    assert "<img" in (rep / "index.html").read_text()


def test_finished_only_reports_a_running_sweep_and_names_what_it_left_out(tmp_path, capsys):
    """A sweep still running has folders without summary.json: by default they stop the report (no
    silent gaps); --finished-only leaves them out and the report's notes name each one."""
    sweep = make_sweep(tmp_path / "sweep", amp_shift=0.0, seeds=3)
    running = sweep / "6_O1_seed3"
    (running / "checkpoints").mkdir(parents=True)
    (running / "config.yaml").write_text("seed: 3\n")
    assert report_tool.main([str(sweep), "--out", str(tmp_path / "r1")]) == 2
    assert "6_O1_seed3/summary.json: missing summary.json" in capsys.readouterr().err
    assert report_tool.main([str(sweep), "--finished-only", "--out", str(tmp_path / "r2")]) == 0
    out = capsys.readouterr().out
    assert "(3)" in out and f"{running.resolve()}: unfinished (no summary.json yet), left out (--finished-only)" in out
    data = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert data["groups"][0]["amp"][0]["n"] == 3


def test_amp_five_points_worse_is_different_exit_1(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep", amp_shift=-0.05)
    assert report_tool.main([str(sweep), "--out", str(tmp_path / "rep")]) == 1  # in-process: faster
    captured = capsys.readouterr()
    assert "| different |" in captured.out
    assert f"report written to {tmp_path / 'rep'}" in captured.err  # says where it wrote
    data = json.loads((tmp_path / "rep" / "report.json").read_text())
    side = data["groups"][0]["amp"][0]
    assert side["verdict"] == "different" and side["diff"] == pytest.approx(-5.0, abs=0.5)


def test_noisy_small_sample_is_not_shown(tmp_path, capsys):
    # 2 seeds each, diff -0.7 pp with ~1 pp seed spread, margin 0.5: the CI is far wider than the
    # margin (not equivalent) yet Welch p is large (not significantly different) -> "not shown"
    sweep = tmp_path / "sweep"
    for i, (f, a) in enumerate([(0.700, 0.690), (0.710, 0.706)]):
        make_run(sweep, f"fp32_{i}", i, f, requested="fp32", effective="fp32")
        make_run(sweep, f"amp_{i}", i, a)
    assert report_tool.main([str(sweep), "--delta", "0.5"]) == 1
    assert "not shown" in capsys.readouterr().out


def test_fp32_effective_amp_runs_are_set_aside(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep", amp_shift=0.0, seeds=2, amp_effective="fp32")
    assert report_tool.main([str(sweep)]) == 1  # nothing left to show parity with
    text = capsys.readouterr().out
    assert "requested fp16-O1 but computed in FP32 on cpu: not AMP evidence" in text
    assert "no AMP runs left" in text
    data = json.loads((sweep / "report" / "report.json").read_text())
    assert len(data["set_aside"]) == 2 and data["groups"][0]["amp"] == []


def test_single_seed_gets_no_verdict(tmp_path, capsys):
    make_run(tmp_path / "s", "fp32", 0, 0.700, requested="fp32", effective="fp32", paired=True)
    make_run(tmp_path / "s", "amp", 0, 0.695, paired=True)
    # |diff| 0.5 pp is inside the 1 pp margin, but one seed a side is no evidence: exit 1
    assert report_tool.main([str(tmp_path / "s" / "fp32"), str(tmp_path / "s" / "amp"),
                             "--out", str(tmp_path / "rep")]) == 1
    out = capsys.readouterr().out
    assert "| single seed | single seed, no verdict |" in out and "equivalent" not in out
    assert "one seed on a side gives no variance estimate" in out
    side = json.loads((tmp_path / "rep" / "report.json").read_text())["groups"][0]["amp"][0]
    assert side["test"] == "single seed" and side["diff"] == pytest.approx(-0.5)
    assert side["verdict"] == "single seed, no verdict" and side["pairs"][0]["seed"] == 0


def test_corrupt_summary_exits_2_naming_file(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", amp_shift=0.0, seeds=2)
    bad = sweep / "1_O1_seed0" / "summary.json"
    bad.write_text("{not json")
    out = run_cli(sweep)
    assert out.returncode == 2
    assert out.stderr.startswith("error:") and str(bad) in out.stderr


def test_missing_summary_and_key_exit_2(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep", amp_shift=0.0, seeds=2)
    (sweep / "0_fp32_seed0" / "summary.json").unlink()  # a crashed job: log but no summary
    assert report_tool.main([str(sweep)]) == 2
    err = capsys.readouterr().err
    assert "missing summary.json" in err and str(sweep / "0_fp32_seed0" / "summary.json") in err
    s = json.loads((sweep / "2_fp32_seed1" / "summary.json").read_text())
    del s["effective_precision"]
    (sweep / "2_fp32_seed1" / "summary.json").write_text(json.dumps(s))
    assert report_tool.main([str(sweep / "2_fp32_seed1")]) == 2
    err = capsys.readouterr().err
    assert "2_fp32_seed1" in err and "'effective_precision'" in err
    assert report_tool.main([str(tmp_path / "nowhere")]) == 2


def test_model_cards_section_is_rewritten_and_nothing_else(tmp_path):
    from zoo.report.cards import update_section
    from zoo.report.runs import ReportInputError

    cards = tmp_path / "CARDS.md"
    cards.write_text("# Cards\nprose stays\n<!-- measured:x -->\nold table\n<!-- /measured:x -->\ntail stays\n")
    update_section(cards, "x", "| new | table |", "python tools/report.py runs")
    text = cards.read_text()
    assert "old table" not in text and "| new | table |" in text and "`python tools/report.py runs`" in text
    assert text.startswith("# Cards\nprose stays\n<!-- measured:x -->")
    assert text.endswith("<!-- /measured:x -->\ntail stays\n")
    with pytest.raises(ReportInputError, match="measured:y"):
        update_section(cards, "y", "t", "c")


def test_model_cards_footer_names_the_revisions_the_runs_were_trained_at(tmp_path):
    """Issue 40 item 10: a generated table says what code made its numbers."""
    from zoo.report.cards import update_section

    cards = tmp_path / "CARDS.md"
    cards.write_text("<!-- measured:x -->\n<!-- /measured:x -->\n")
    update_section(cards, "x", "| t |", "python tools/report.py runs", revisions=["ab90493" + "0" * 33])
    assert "from the runs' summary.json files (trained at revision ab90493)." in cards.read_text()
    update_section(cards, "x", "| t |", "c", revisions=["a" * 40, "b" * 40 + "-dirty"])
    assert "(trained at revisions aaaaaaa, bbbbbbb-dirty)." in cards.read_text()
    update_section(cards, "x", "| t |", "c")
    assert "summary.json files.\n" in cards.read_text()


def test_model_cards_section_links_its_equivalence_figure(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep", amp_shift=0.0, seeds=3, paired=True)
    cards = tmp_path / "CARDS.md"
    cards.write_text("<!-- measured:abc -->\n<!-- /measured:abc -->\n")
    stale = sweep / "report" / "old_group_equivalence.png"  # left by an earlier report: not copied
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    assert report_tool.main([str(sweep), "--model-cards", str(cards), "--section", "abc"]) == 0
    capsys.readouterr()
    fig = tmp_path / "docs" / "parity" / "abc.png"
    made = [p for p in (sweep / "report").glob("*_equivalence.png") if p != stale]
    assert len(made) == 1 and fig.read_bytes() == made[0].read_bytes()
    assert "](docs/parity/abc.png)" in cards.read_text()
    assert sorted(p.name for p in fig.parent.iterdir()) == ["abc.png"]


# ----------------------------------------------------------------------------- pairing, power, provenance
def test_paired_tost_hand_computed():
    amp, fp32 = [1.0, 2.0, 3.5], [0.5, 1.0, 2.0]
    # per-seed differences d = [0.5, 1.0, 1.5]: mean 1, sd 0.5, se = 0.5/sqrt(3) = 0.288675, df = 2
    # df=2 closed form: F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    # delta 1.5: t_upper = -0.5/0.288675 = -1.732051, F = 0.5 - 1.732051/(2 sqrt 5) = 0.112702 -> p_upper
    #            t_lower =  2.5/0.288675 =  8.660254, F = 0.5 + 8.660254/(2 sqrt 77) = 0.993464 -> p_lower 0.006536
    # 90% CI: t_{0.95,2} = 2.919986; 1 -/+ 2.919986 * 0.288675 = [0.157073, 1.842927]: 1.84 > 1.5, not shown
    r = paired_tost(amp, fp32, delta=1.5)
    assert r["diff"] == pytest.approx(1.0) and r["se"] == pytest.approx(0.288675, abs=1e-6) and r["df"] == 2
    assert r["p_upper"] == pytest.approx(0.112702, abs=1e-6) and r["p_lower"] == pytest.approx(0.006536, abs=1e-6)
    assert r["ci"] == pytest.approx((0.157073, 1.842927), abs=1e-6) and not r["equivalent"]
    # delta 2: t_upper = -1/0.288675 = -3.464102, F = 0.5 - 3.464102/(2 sqrt 14) = 0.037090 < 0.05
    r = paired_tost(amp, fp32, delta=2.0)
    assert r["p_upper"] == pytest.approx(0.037090, abs=1e-6) and r["equivalent"]
    # the same numbers unpaired: sample variances 1.5833 and 0.5833, se 0.85, far from equivalent
    assert not tost(amp, fp32, delta=2.0)["equivalent"]


def test_power_sample_size_hand_computed():
    # sd of differences 1.0 pp, margin 1.5 pp, alpha 0.05, power 0.8 (beta/2 = 0.1), true diff 0:
    # need n >= (t_{.95,n-1} + t_{.90,n-1})^2 * 1 / 2.25
    #   n=5: (2.1318 + 1.5332)^2 / 2.25 = 5.97 > 5;  n=6: (2.0150 + 1.4759)^2 / 2.25 = 5.42 <= 6 -> 6
    assert tost_sample_size(1.0, 1.5) == 6
    #   sd 0.5: n=2: (6.3138 + 3.0777)^2 * 0.25 / 2.25 = 9.80 > 2; n=3: (2.9200 + 1.8856)^2 / 9 = 2.57 <= 3
    assert tost_sample_size(0.5, 1.5) == 3
    # unpaired, sqrt(sa^2 + sb^2) = 1, df = 2n - 2: n=4: (1.9432 + 1.4398)^2 / 2.25 = 5.08 > 4;
    #   n=5: (1.8595 + 1.3968)^2 / 2.25 = 4.71 <= 5 -> 5
    assert tost_sample_size(1.0, 1.5, paired=False) == 5


def test_power_line_in_report(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for seed, (f, a) in enumerate([(0.700, 0.705), (0.710, 0.720), (0.690, 0.705)]):
        make_run(sweep, f"fp32_{seed}", seed, f, requested="fp32", effective="fp32", paired=True)
        make_run(sweep, f"amp_{seed}", seed, a, paired=True)
    # differences [0.5, 1.0, 1.5] pp as in test_paired_tost_hand_computed: CI [0.157, 1.843];
    # smallest margin shown 1.84 pp; sd 0.5 and margin 1.5 need 3 paired seeds (test above)
    assert report_tool.main([str(sweep), "--delta", "1.5"]) == 1
    out = capsys.readouterr().out
    assert "| paired TOST | not shown |" in out
    assert "per-seed differences (emulated-fp16-O1 − fp32, pp): seed 0 +0.50, seed 1 +1.00, seed 2 +1.50" in out
    assert ("equivalence could be shown at any margin above 1.84 pp (largest |bound| of the 90% CI); "
            "the ±1.5 pp margin needs 3 paired seeds for 80% power (std of the per-seed differences "
            "0.50 pp, true difference assumed 0)") in out
    side = json.loads((sweep / "report" / "report.json").read_text())["groups"][0]["amp"][0]
    assert side["power"]["min_margin"] == pytest.approx(1.842927, abs=1e-5) and side["power"]["n_needed"] == 3


def test_equivalence_figure_draws_the_tost_evidence(tmp_path, capsys):
    from zoo.report.render import equivalence_rows

    sweep = tmp_path / "sweep"
    for seed, (f, a) in enumerate([(0.700, 0.705), (0.710, 0.720), (0.690, 0.705)]):
        make_run(sweep, f"fp32_{seed}", seed, f, requested="fp32", effective="fp32", paired=True)
        make_run(sweep, f"amp_{seed}", seed, a, paired=True)
    make_run(sweep, "bf16_0", 0, 0.69, requested="bf16-O1", effective="emulated-bf16-O1", paired=True)
    assert report_tool.main([str(sweep), "--delta", "1.5"]) == 1
    capsys.readouterr()
    data = json.loads((sweep / "report" / "report.json").read_text())
    rows = {r["precision"]: r for r in equivalence_rows(data["groups"][0])}
    # the hand-computed case of test_power_line_in_report: differences 0.5, 1.0, 1.5; CI [0.157, 1.843]
    fp16 = rows["emulated-fp16-O1"]
    assert fp16["seed_diffs"] == pytest.approx([0.5, 1.0, 1.5]) and fp16["diff"] == pytest.approx(1.0)
    assert fp16["ci"] == pytest.approx([0.157073, 1.842927], abs=1e-5) and fp16["verdict"] == "not shown"
    # one seed: a point without an interval, labelled as no verdict
    assert rows["emulated-bf16-O1"]["ci"] is None and rows["emulated-bf16-O1"]["diff"] == pytest.approx(-1.0)
    assert rows["emulated-bf16-O1"]["verdict"] == "single seed, no verdict"
    png = [i for i in data["images"] if i.endswith("_equivalence.png")]
    assert len(png) == 1 and (sweep / "report" / png[0]).stat().st_size > 1000
    assert f'src="{png[0]}"' in (sweep / "report" / "index.html").read_text()


def test_pairing_cancels_seed_spread(tmp_path, capsys):
    # seeds spread by 2 pp, AMP = FP32 + 0.2 pp noise: paired the CI is narrow, unpaired it is not
    paired = make_sweep(tmp_path / "paired", amp_shift=0.0, paired=True, seed_sd=0.02)
    unpaired = make_sweep(tmp_path / "unpaired", amp_shift=0.0, paired=False, seed_sd=0.02)
    assert report_tool.main([str(paired)]) == 0
    assert report_tool.main([str(unpaired)]) == 1
    p = json.loads((paired / "report" / "report.json").read_text())["groups"][0]["amp"][0]
    u = json.loads((unpaired / "report" / "report.json").read_text())["groups"][0]["amp"][0]
    assert p["test"] == "paired TOST" and p["verdict"] == "equivalent" and len(p["pairs"]) == 5
    assert u["test"] == "Welch TOST" and u["verdict"] == "not shown"
    assert "Welch TOST (unpaired: no seed paired)" in capsys.readouterr().out


def test_pairing_only_on_identical_digests(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep", amp_shift=0.0, paired=True)
    bad = sweep / "3_O1_seed1" / "summary.json"
    s = json.loads(bad.read_text())
    s["pairing"]["init_weights"] = "a-different-initialisation"
    bad.write_text(json.dumps(s))
    assert report_tool.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "paired TOST (4 seeds paired (identical initial-weight, first-batch and RNG digests); " \
           "2 run(s) not paired are left out)" in out
    assert (f"not paired: `{sweep.resolve() / '3_O1_seed1'}` (seed 1): its initial-weights digest differs "
            "from FP32 seed 1's (a-different- vs init_weights)") in out
    assert (f"not paired: `{sweep.resolve() / '2_fp32_seed1'}` (seed 1): its emulated-fp16-O1 run with "
            "seed 1 did not pair") in out
    side = json.loads((sweep / "report" / "report.json").read_text())["groups"][0]["amp"][0]
    assert [p["seed"] for p in side["pairs"]] == [0, 2, 3, 4]
    # the FP32 seed-1 run has no partner left: it is not in the paired test either
    assert "seed 1" not in out.split("per-seed differences")[1].splitlines()[0]


def test_eval_noise_and_eval_only_effect_are_shown(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    for seed in range(2):
        ci = {"low": 0.68, "high": 0.72, "n_images": 500, "n_resamples": 1000}
        make_run(sweep, f"fp32_{seed}", seed, 0.70, requested="fp32", effective="fp32", paired=True,
                 primary_metric={"name": "top1", "value": 0.70, "ci": ci})
        make_run(sweep, f"amp_{seed}", seed, 0.701, paired=True, metrics={"top1": 0.701},
                 metrics_fp32_eval={"top1": 0.699 - 0.001 * seed},
                 primary_metric={"name": "top1", "value": 0.701, "ci": ci})
    report_tool.main([str(sweep)])
    out = capsys.readouterr().out
    assert "| ±2.00 pp |" in out  # mean half-width of the 95% bootstrap CI
    assert "eval-only effect (emulated-fp16-O1 evaluation − FP32 evaluation of the same final weights): " \
           "mean +0.25 pp; seed 0 +0.20, seed 1 +0.30" in out
    assert "evaluation noise (95% bootstrap CI over 500 validation images, pp): fp32: seed 0 [68.00, 72.00]" in out
    assert "Eval-only effect" not in out and "eval-only effect" in (sweep / "report" / "index.html").read_text()


def test_a_metric_on_nonfinite_outputs_is_never_shown_without_saying_so(tmp_path, capsys):
    """summary.json's eval_numerics (issue 39): a run whose evaluation had inf/NaN outputs is named in
    the table's metric cell and per seed below it."""
    sweep = tmp_path / "sweep"
    for seed in range(3):
        make_run(sweep, f"fp32_{seed}", seed, 0.70, requested="fp32", effective="fp32", paired=True,
                 eval_numerics={"images": 100, "nonfinite_images": 0})
        bad = 28 if seed == 1 else 0
        make_run(sweep, f"amp_{seed}", seed, 0.69, paired=True,
                 primary_metric={"name": "top1", "value": 0.69, "nonfinite_images": bad},
                 eval_numerics={"images": 100, "nonfinite_images": bad, "first_layers": {"a (Conv2D)": bad}})
    report_tool.main([str(sweep)])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| resnet18") and "emulated" in line)
    assert "**non-finite outputs** in 1 run (up to 28 of 100 images)" in row
    assert "- **non-finite outputs** in the evaluation behind the metric (emulated-fp16-O1 runs; images of 100): " \
           "seed 1 28" in out
    fp32_row = next(line for line in out.splitlines() if line.startswith("| resnet18") and "/ fp32 |" in line)
    assert "non-finite" not in fp32_row


def test_a_split_noisier_than_the_margin_is_named(tmp_path, capsys):
    """The seed-paired test holds the validation images fixed: when one run's evaluation noise is
    wider than the margin (resnet18's 1000-image quick split, ±2.9 pp against ±1 pp), the report says
    the verdict does not cover the choice of images; a split quieter than the margin gets no line."""
    def report(half):
        sweep = tmp_path / f"sweep_{half}"
        for seed in range(3):
            ci = {"low": 0.70 - half, "high": 0.70 + half, "n_images": 1000, "n_resamples": 1000}
            make_run(sweep, f"fp32_{seed}", seed, 0.70, requested="fp32", effective="fp32", paired=True,
                     primary_metric={"name": "top1", "value": 0.70, "ci": ci})
            make_run(sweep, f"amp_{seed}", seed, 0.70 + 0.001 * seed, paired=True,
                     primary_metric={"name": "top1", "value": 0.70 + 0.001 * seed, "ci": ci})
        report_tool.main([str(sweep)])
        return capsys.readouterr().out

    noisy = report(0.0287)
    assert ("- evaluation split: a run's evaluation noise (±2.87 pp, mean 95% half-width) is wider than "
            "the ±1 pp margin. All runs are scored on the same 1000 images, so this test covers "
            "seed-to-seed variation on this split, not the choice of images, and on a split this small that "
            "choice can exceed the margin: `python tools/split_noise.py <these runs>` measures it") in noisy
    assert "evaluation split:" not in report(0.009)


def test_seeds_are_listed_in_numeric_order(tmp_path, capsys):
    """Past ten seeds, text order read "seed 0, seed 1, seed 10, seed 2"; seeds are numbers."""
    sweep = tmp_path / "sweep"
    for seed in range(12):
        make_run(sweep, f"fp32_{seed}", seed, 0.70, requested="fp32", effective="fp32", paired=True)
        make_run(sweep, f"amp_{seed}", seed, 0.70 + 0.0001 * seed, paired=True,
                 metrics={"top1": 0.70 + 0.0001 * seed}, metrics_fp32_eval={"top1": 0.70})
    report_tool.main([str(sweep)])
    out = capsys.readouterr().out
    listed = ", ".join(f"seed {s} {0.01 * s:+.2f}" for s in range(12))
    assert f"per-seed differences (emulated-fp16-O1 − fp32, pp): {listed}" in out
    assert next(line for line in out.splitlines() if "eval-only effect" in line).endswith(f" pp; {listed}")
    from zoo.report.runs import seed_order
    assert sorted([10, "b", 2, "a", "11", 0], key=seed_order) == [0, 2, 10, "11", "a", "b"]


def test_fp32_runs_without_a_partner_are_one_line_per_side(tmp_path, capsys):
    """A 20-seed FP32 base against a 5-seed row listed 15 identical "no ... run" lines; they are one
    line naming the seeds, while runs left out for another reason keep their own line and path."""
    sweep = tmp_path / "sweep"
    for seed in range(8):
        make_run(sweep, f"fp32_{seed}", seed, 0.70, requested="fp32", effective="fp32", paired=True)
    for seed in (0, 1, 9):
        make_run(sweep, f"amp_{seed}", seed, 0.70, paired=True)
    bad = sweep / "amp_1" / "summary.json"
    s = json.loads(bad.read_text())
    s["pairing"]["init_weights"] = "another-init"
    bad.write_text(json.dumps(s))
    report_tool.main([str(sweep)])
    out = capsys.readouterr().out
    left_out = [line for line in out.splitlines() if line.startswith("- not paired:")]
    assert left_out == [
        f"- not paired: `{(sweep / 'amp_1').resolve()}` (seed 1): its initial-weights digest differs "
        "from FP32 seed 1's (another-init vs init_weights)",
        f"- not paired: `{(sweep / 'fp32_1').resolve()}` (seed 1): its emulated-fp16-O1 run with seed 1 "
        "did not pair",
        f"- not paired: `{(sweep / 'amp_9').resolve()}` (seed 9): no FP32 run with seed 9",
        "- not paired: the FP32 runs of seeds 2-7 (6 runs): no emulated-fp16-O1 run with those seeds",
    ], left_out
    side = json.loads((sweep / "report" / "report.json").read_text())["groups"][0]["amp"][0]
    assert len(side["unpaired"]) == 9  # report.json keeps every run with its path
    from zoo.report.details import seed_ranges
    assert seed_ranges([7, 5, 6, 0, 2, 3, "x", 10]) == "0, 2, 3, 5-7, 10, x"


def test_report_refuses_mixed_revisions_unless_allowed(tmp_path, capsys):
    sweep = make_sweep(tmp_path / "sweep", amp_shift=0.0, seeds=2, paired=True)
    for run in sweep.iterdir():
        s = json.loads((run / "summary.json").read_text())
        s.update(git_revision="aaaa111", versions={"paddle": "3.3.1", "numpy": "2.4.6"},
                 config_digest="c0ffee", data_version="synthetic_shapes-v1")
        if run.name == "3_O1_seed1":
            s["git_revision"] = "bbbb222"
        (run / "summary.json").write_text(json.dumps(s))
    assert report_tool.main([str(sweep)]) == 2
    err = capsys.readouterr().err
    assert "runs are not comparable: git revision differs: aaaa111 (3 runs" in err
    assert "bbbb222 (1 run: 3_O1_seed1)" in err and "--allow-mixed" in err
    assert report_tool.main([str(sweep), "--allow-mixed"]) in (0, 1)
    assert "Compared despite differences (--allow-mixed):" in capsys.readouterr().out
    for run in sweep.iterdir():  # one revision, but a modified tree: compared, with a note
        if run.name != "report":
            s = json.loads((run / "summary.json").read_text())
            (run / "summary.json").write_text(json.dumps({**s, "git_revision": "aaaa111-dirty"}))
    assert report_tool.main([str(sweep)]) in (0, 1)
    assert "runs of a modified source tree (aaaa111-dirty)" in capsys.readouterr().out
    # library versions and configs are checked the same way
    s = json.loads((sweep / "3_O1_seed1" / "summary.json").read_text())
    s.update(git_revision="aaaa111", versions={"paddle": "3.2.0", "numpy": "2.4.6"}, config_digest="beef")
    (sweep / "3_O1_seed1" / "summary.json").write_text(json.dumps(s))
    assert report_tool.main([str(sweep)]) == 2
    err = capsys.readouterr().err
    assert "paddle version differs: 3.2.0 (1 run: 3_O1_seed1), 3.3.1 (3 runs" in err
    assert "config (without amp and seed) differs within resnet18 / synthetic_shapes" in err
    # a fine-tune sweep whose runs started from different base weights under one path
    for run in sweep.iterdir():
        if run.name != "report":
            s = json.loads((run / "summary.json").read_text())
            s.update(git_revision="aaaa111", versions={"paddle": "3.3.1", "numpy": "2.4.6"}, config_digest="c0ffee",
                     pretrained={"file": "runs/base/checkpoints/best.pdparams", "sha256": "1" * 64})
            (run / "summary.json").write_text(json.dumps(s))
    assert report_tool.main([str(sweep)]) in (0, 1)
    assert "| resnet18 / synthetic_shapes / 200 steps / batch 64 / fine-tuned from base / fp32 |" in capsys.readouterr().out
    s = json.loads((sweep / "3_O1_seed1" / "summary.json").read_text())
    s["pretrained"]["sha256"] = "2" * 64
    (sweep / "3_O1_seed1" / "summary.json").write_text(json.dumps(s))
    assert report_tool.main([str(sweep)]) == 2
    err = capsys.readouterr().err
    assert ("pretrained weights (sha256) differs within resnet18 / synthetic_shapes: 111111111111 (3 runs"
            in err) and "222222222222 (1 run: 3_O1_seed1)" in err
    # a run fine-tuned from other weights (another path) is not grouped with the rest
    s.update(pretrained={"file": "runs/other.pdparams", "sha256": "1" * 64})
    (sweep / "3_O1_seed1" / "summary.json").write_text(json.dumps(s))
    assert report_tool.main([str(sweep)]) == 1
    out = capsys.readouterr().out
    assert "| resnet18 / synthetic_shapes / 200 steps / batch 64 / fine-tuned from other.pdparams / emulated-fp16-O1 |" in out


def test_static_scale_runs_are_their_own_row(tmp_path):
    """An fp16 run with a static loss scale (the ablation's "no skipped steps") is compared as a recipe
    of its own, never pooled or made ambiguous with the dynamic-scale runs of the same seeds."""
    sweep = tmp_path / "sweep"
    dynamic = {"use_dynamic_loss_scaling": True, "init_loss_scaling": 65536.0}
    static = {"use_dynamic_loss_scaling": False, "init_loss_scaling": 4096.0}
    for seed in range(3):
        make_run(sweep, f"fp32_{seed}", seed, 0.70 + 0.01 * seed, requested="fp32", effective="fp32", paired=True)
        make_run(sweep, f"o1_{seed}", seed, 0.701 + 0.01 * seed, paired=True, loss_scaler=dynamic)
        make_run(sweep, f"static_{seed}", seed, 0.69 + 0.01 * seed, paired=True, loss_scaler=static)
        # bf16 ignores the scaler: its static flag must not rename it
        make_run(sweep, f"bf16_{seed}", seed, 0.70 + 0.01 * seed, requested="bf16-O1",
                 effective="emulated-bf16-O1", paired=True, loss_scaler=static)
    report_tool.main([str(sweep)])
    amp = json.loads((sweep / "report" / "report.json").read_text())["groups"][0]["amp"]
    rows = {side["precision"]: side for side in amp}
    assert sorted(rows) == ["emulated-bf16-O1", "emulated-fp16-O1", "emulated-fp16-O1-static-scale-4096"]
    assert [len(side["pairs"]) for side in rows.values()] == [3, 3, 3]
    assert rows["emulated-fp16-O1-static-scale-4096"]["diff"] == pytest.approx(-1.0, abs=1e-6)
    assert rows["emulated-fp16-O1"]["diff"] == pytest.approx(0.1, abs=1e-6)


def test_rows_read_fp16_before_bf16_and_o1_before_o2(tmp_path):
    """AMP tables are read fp16 O1, O2, then bf16 O1, O2 (alphabetical order put bf16 first); a GPU
    run sits above its emulation and an ablation below its faithful precision."""
    from zoo.report.parity import precision_order
    labels = ["emulated-bf16-O2", "fp16-O2", "emulated-fp16-O1-ablation-forward-rounding", "bf16-O1",
              "emulated-fp16-O2", "something-else", "emulated-fp16-O1", "fp16-O1"]
    assert sorted(labels, key=precision_order) == [
        "fp16-O1", "emulated-fp16-O1", "emulated-fp16-O1-ablation-forward-rounding", "fp16-O2",
        "emulated-fp16-O2", "bf16-O1", "emulated-bf16-O2", "something-else"]
    sweep = tmp_path / "sweep"
    for seed in range(2):
        make_run(sweep, f"fp32_{seed}", seed, 0.70, requested="fp32", effective="fp32", paired=True)
        for req in ("bf16-O2", "fp16-O2", "bf16-O1", "fp16-O1"):
            make_run(sweep, f"{req}_{seed}", seed, 0.70, requested=req, effective=f"emulated-{req}",
                     paired=True)
    report_tool.main([str(sweep)])
    order = ["emulated-fp16-O1", "emulated-fp16-O2", "emulated-bf16-O1", "emulated-bf16-O2"]
    amp = json.loads((sweep / "report" / "report.json").read_text())["groups"][0]["amp"]
    assert [side["precision"] for side in amp] == order
    md = (sweep / "report" / "report.md").read_text()
    table_rows = [line for line in md.splitlines() if line.startswith("| ") and "/ emulated-" in line]
    assert [next(p for p in order if f"/ {p} |" in row) for row in table_rows] == order


def test_run_time_line_sums_wall_times(tmp_path, capsys):
    """The report states what its runs cost: summed wall time and each precision's per-run range."""
    sweep = tmp_path / "sweep"
    for seed, (f, a) in enumerate([(600.0, 900.0), (720.0, 1140.0)]):
        make_run(sweep, f"fp32_{seed}", seed, 0.70, requested="fp32", effective="fp32", paired=True, wall_time_s=f)
        make_run(sweep, f"amp_{seed}", seed, 0.70, paired=True, wall_time_s=a)
    report_tool.main([str(sweep)])
    # 600 + 720 + 900 + 1140 s = 3360 s = 56 min
    assert ("run time: 4 runs, 0 h 56 min in all (sum of each run's wall time); "
            "per run fp32 10-12 min, emulated-fp16-O1 15-19 min") in capsys.readouterr().out
    # a run resumed by a trainer that did not carry its earlier wall time over makes it a lower bound;
    # one that did (wall_time_before_resume_s recorded) does not
    make_run(sweep, "amp_2", 2, 0.70, paired=True, wall_time_s=300.0, resumed_from="/x/last.pdckpt")
    make_run(sweep, "fp32_2", 2, 0.70, requested="fp32", effective="fp32", paired=True, wall_time_s=780.0,
             resumed_from="/y/last.pdckpt", wall_time_before_resume_s=400.0)
    report_tool.main([str(sweep)])
    assert ("run time: 6 runs, 1 h 14 min in all (sum of each run's wall time); per run fp32 10-13 min, "
            "emulated-fp16-O1 5-19 min; 1 resumed run recorded only the time after the resume, so this "
            "is a lower bound") in capsys.readouterr().out
