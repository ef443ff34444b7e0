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

from zoo.report.stats import t_cdf, t_ppf, tost, welch_t_test

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
             effective="emulated-fp16-O1", steps=200, gbs=64, skipped=0) -> Path:
    """A minimal finished run folder in the documented format."""
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
               amp_effective="emulated-fp16-O1") -> Path:
    """Hydra-multirun-like folder: FP32 and AMP jobs, metric = 0.70 + 0.2 pp noise (+ shift)."""
    rng = np.random.default_rng(0)
    for i in range(seeds):
        make_run(root, f"{2 * i}_fp32_seed{i}", i, 0.70 + rng.normal(0, 0.002),
                 requested="fp32", effective="fp32")
        make_run(root, f"{2 * i + 1}_O1_seed{i}", i, 0.70 + amp_shift + rng.normal(0, 0.002),
                 requested=amp_requested, effective=amp_effective, skipped=i % 2)
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
    assert side["test"].startswith("TOST") and -2.0 < side["ci"][0] < side["ci"][1] < 2.0
    assert side["skipped_steps"] == pytest.approx(0.4)
    assert "<img" in (rep / "index.html").read_text()


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


def test_single_seed_is_labelled(tmp_path, capsys):
    make_run(tmp_path / "s", "fp32", 0, 0.700, requested="fp32", effective="fp32")
    make_run(tmp_path / "s", "amp", 0, 0.695)
    assert report_tool.main([str(tmp_path / "s" / "fp32"), str(tmp_path / "s" / "amp"),
                             "--out", str(tmp_path / "rep")]) == 0
    assert "equivalent (single seed)" in capsys.readouterr().out
    side = json.loads((tmp_path / "rep" / "report.json").read_text())["groups"][0]["amp"][0]
    assert side["test"] == "single seed" and side["diff"] == pytest.approx(-0.5)
    # beyond the margin with one seed: "different"
    assert report_tool.main([str(tmp_path / "s"), "--delta", "0.2", "--out", str(tmp_path / "r2")]) == 1


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
