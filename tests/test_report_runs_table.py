"""tools/report.py --runs-table: one row per run from its summary.json (the quick-run tables of
MODEL_CARDS.md are generated this way, issue 40 item 10), with non-finite evaluations said."""
from __future__ import annotations

import json
import shutil

import pytest
from conftest import ROOT, TINY, run_tool


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs_table")
    for amp, extra in (("fp32", []), ("O1", ["trainer.eval_precision=fp32"])):
        res = run_tool(["tools/train.py", *TINY, f"amp={amp}", *extra, f"hydra.run.dir={root / amp}"], cwd=ROOT)
        assert res.returncode == 0, res.stderr[-2000:]
    return root


def _rows(text: str) -> dict[str, list[str]]:
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| `")]
    return {r[0].strip(" `"): [c.strip() for c in r] for r in rows}


@pytest.mark.slow
def test_each_run_is_one_row_of_its_own_figures(two_runs, tmp_path):
    cards = tmp_path / "CARDS.md"
    cards.write_text("before\n<!-- measured:quick -->\nold\n<!-- /measured:quick -->\nafter\n")
    res = run_tool(["tools/report.py", str(two_runs / "fp32"), str(two_runs / "O1"), "--runs-table",
                    "--model-cards", str(cards), "--section", "quick"], cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    header = next(line for line in res.stdout.splitlines() if line.startswith("| run |"))
    assert "| top1 |" in header and "| non-finite outputs |" in header
    rows = _rows(res.stdout)
    for name in ("fp32", "O1"):
        s = json.loads((two_runs / name / "summary.json").read_text())
        row = rows[name]
        assert row[1] == s["git_revision"][:7]
        assert row[5] == f"**{100 * s['primary_metric']['value']:.1f}**"
        minutes, seconds = divmod(round(s["wall_time_s"]), 60)
        assert f"{minutes} min {seconds:02d} s" in row
    o1 = json.loads((two_runs / "O1" / "summary.json").read_text())
    assert rows["O1"][2].startswith("emulated-fp16-O1 (") and rows["O1"][3] == "fp32"
    assert rows["O1"][4] == "none of 48 images"
    assert rows["O1"][7] == (f"top1 {100 * o1['primary_metric_train_precision_eval']['value']:.1f}, "
                             "non-finite: none of 48 images")
    assert rows["fp32"][7] == "-"
    text = cards.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert f"(trained at revision {o1['git_revision'][:7]}" in text and "--runs-table" in text


@pytest.mark.slow
def test_non_finite_evaluation_images_are_said_with_their_first_layer(two_runs, tmp_path):
    run = tmp_path / "nan_run"
    shutil.copytree(two_runs / "O1", run)
    s = json.loads((run / "summary.json").read_text())
    s["eval_numerics"].update(nonfinite_images=29, first_layers={"head.binarize.conv1": 29})
    (run / "summary.json").write_text(json.dumps(s))
    res = run_tool(["tools/report.py", str(run), "--runs-table"], cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "non-finite: **29 of 48 images** (first at `head.binarize.conv1`)" in res.stdout
