"""The entry points as a user types them: train, eval, --cfg job, typos, multirun."""
from __future__ import annotations

import json

import pytest
from conftest import ROOT, TINY, run_tool


def test_cfg_job_shows_recipe_values_and_cli_override(tmp_path):
    out = run_tool(["tools/train.py", "model=resnet50", "amp=O2", "--cfg", "job"], ROOT)
    assert out.returncode == 0, out.stderr
    assert "batch_size: 256" in out.stdout and "init_loss_scaling: 128.0" in out.stdout
    out = run_tool(["tools/train.py", "model=resnet50", "amp=O2", "amp.init_loss_scaling=1024", "--cfg", "job"], ROOT)
    assert "init_loss_scaling: 1024" in out.stdout


def test_typo_and_bad_value_messages(tmp_path):
    out = run_tool(["tools/train.py", "amp.init_los_scaling=3", "--cfg", "job"], ROOT)
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: amp.init_los_scaling: no such key (did you mean amp.init_loss_scaling?); "
        "a new key needs a +: +amp.init_los_scaling=3")
    out = run_tool(["tools/train.py", "amp=O3"], ROOT)
    assert out.returncode == 2 and out.stderr.strip() == "error: amp=O3: no such choice; valid: O1, O2, bf16_O1, bf16_O2, fp32"
    full = run_tool(["tools/train.py", "amp=O3"], ROOT, {"HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 1 and "Traceback" in full.stderr  # Hydra's own report stays one variable away
    out = run_tool(["tools/train.py", *TINY, "model.batch_size=-2", f"hydra.run.dir={tmp_path}"], ROOT)
    assert out.returncode == 2 and "error: model.batch_size: expected a positive integer, got -2" in out.stderr
    out = run_tool(["tools/train.py", "data=imagenet", f"data.root={tmp_path}/none", f"hydra.run.dir={tmp_path}"], ROOT)
    assert out.returncode == 2 and "data.root" in out.stderr


@pytest.mark.parametrize("tool, override, expect", [
    ("train.py", "trainer.max_stepz=3", "error: trainer.max_stepz: no such key (did you mean trainer.max_steps?); "
                                        "a new key needs a +: +trainer.max_stepz=3"),
    ("train.py", "data=nodata", "error: data=nodata: no such choice; valid: coco, icdar2015, imagenet, "
                                "synthetic_shapes, synthetic_shapes_det, synthetic_text"),
    ("train.py", "trainer.max_steps=[", "error: trainer.max_steps=[: cannot parse this override"),
    ("train.py", "~nokey", "error: Could not delete from config. 'nokey' does not exist."),
    ("eval.py", "amp=O3", "error: amp=O3: no such choice; valid: O1, O2, bf16_O1, bf16_O2, fp32"),
    ("export.py", "export.precison=fp16", "error: export.precison: no such key (did you mean export.precision?)"),
])
def test_hydra_composition_errors_are_one_error_line_with_status_2(tmp_path, tool, override, expect):
    """Hydra's own errors (a typo'd group choice or key, bad syntax) read like the zoo's: one line, 2."""
    out = run_tool([f"tools/{tool}", override], ROOT)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith(expect), out.stderr


def test_tools_do_not_show_paddles_ccache_warning(tmp_path):
    """Paddle warns "No ccache found" at every import; the tools start without it."""
    import subprocess
    import sys

    env = {"PYTHONWARNINGS": "default"}
    bare = subprocess.run([sys.executable, "-c", "import paddle"], capture_output=True, text=True,
                          env=dict(__import__("os").environ, **env))
    if "No ccache found" not in bare.stderr:
        pytest.skip("this machine's paddle does not warn (ccache installed)")
    for args in (["tools/train.py", "--cfg", "job"], ["tools/report.py", "--help"]):
        out = run_tool(args, ROOT, env)
        assert out.returncode == 0 and "ccache" not in out.stderr, out.stderr


@pytest.mark.slow
def test_train_then_eval_as_a_user_would(tmp_path, ampzoo_home):
    run = tmp_path / "run"
    env = {"AMPZOO_HOME": str(ampzoo_home)}
    out = run_tool(["tools/train.py", *TINY, "amp=O1", f"hydra.run.dir={run}"], ROOT, env)
    assert out.returncode == 0, out.stderr[-3000:]
    start = [line for line in out.stdout.splitlines() if line.startswith("precision:")]
    assert len(start) == 1 and "requested fp16-O1, effective emulated-fp16-O1 on cpu" in start[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["requested_precision"] == "fp16-O1"
    assert summary["effective_precision"] == "emulated-fp16-O1" and summary["final_loss_scale"] > 0

    ev = tmp_path / "eval.json"
    out = run_tool(["tools/eval.py", *TINY, "amp=O1", f"checkpoint={run}", f"output={ev}",
                    f"hydra.run.dir={tmp_path / 'ev'}"], ROOT, env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(ev.read_text())
    # The best weights were saved at the final eval, so eval.py reproduces that number exactly.
    assert result["metrics"] == summary["metrics"]
    assert result["effective_precision"] == "emulated-fp16-O1" and result["num_samples"] == 48
    assert f"evaluation written to {tmp_path / 'ev' / 'eval.json'}, {ev}" in out.stderr

    out = run_tool(["tools/eval.py", *TINY, f"checkpoint={tmp_path}/missing", f"hydra.run.dir={tmp_path / 'e2'}"],
                   ROOT, env)
    assert out.returncode == 2 and "missing" in out.stderr


@pytest.mark.slow
def test_multirun_sweep_writes_one_folder_per_job(tmp_path, ampzoo_home):
    sweep = tmp_path / "sweep"
    out = run_tool(["tools/train.py", "-m", *TINY, "trainer.max_steps=2", "amp=fp32,O1", "seed=0,1",
                    f"hydra.sweep.dir={sweep}"], ROOT, {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == 4
    got = sorted((s["requested_precision"], s["seed"]) for s in map(lambda p: json.loads(p.read_text()), summaries))
    assert got == [("fp16-O1", 0), ("fp16-O1", 1), ("fp32", 0), ("fp32", 1)]
    effective = {json.loads(p.read_text())["effective_precision"] for p in summaries}
    assert effective == {"fp32", "emulated-fp16-O1"}


def test_sweep_without_sweep_dir_puts_all_jobs_in_one_stamped_folder_the_report_pairs(tmp_path, ampzoo_home):
    # The default hydra.sweep.dir is multirun/${run_stamp:}; Hydra resolves it again per job, and
    # each job takes seconds, so without one stamp per process the jobs land in different folders.
    out = run_tool([str(ROOT / "tools" / "train.py"), "-m", *TINY, "trainer.max_steps=2", "amp=fp32,O1",
                    "seed=0,1"], tmp_path, {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 0, out.stderr[-3000:]
    stamps = sorted(p.name for p in (tmp_path / "multirun").iterdir())
    assert len(stamps) == 1, stamps
    sweep = tmp_path / "multirun" / stamps[0]
    assert len(list(sweep.glob("*/summary.json"))) == 4
    # the README's next command: the report finds all four and pairs them by seed
    rep = run_tool(["tools/report.py", str(sweep)], ROOT)
    assert rep.returncode in (0, 1), rep.stderr
    assert "paired TOST (2 seeds paired (identical initial-weight, first-batch and RNG digests))" in rep.stdout
    assert "per-seed differences (emulated-fp16-O1 − fp32, pp): seed 0 " in rep.stdout
    assert "eval-only effect" in rep.stdout and "power: equivalence could be shown" in rep.stdout


@pytest.mark.slow
def test_benchmark_tool_runs_every_comparison(tmp_path, ampzoo_home):
    small = [o for o in TINY if not o.startswith("trainer.max_steps")]
    env = {"AMPZOO_HOME": str(ampzoo_home)}
    for extra in (["--against", "bare"], ["--against", "fp32", "amp=O1"], ["--against", "eager"]):
        out_json = tmp_path / "bench.json"
        out = run_tool(["tools/benchmark.py", "--steps", "2", "--warmup", "1", "--repeats", "1",
                        "--out", str(out_json), *extra[:2], *small, *extra[2:]], ROOT, env)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out_json.read_text())
        assert result["images_per_s"] > 0 and result["reference_images_per_s"] > 0
        assert ("ratio" in result) == (extra[1] == "bare")
        assert "run folder" not in out.stdout  # its runs live in deleted temporary folders
        assert result["compiled"] is (extra[1] == "eager")
        if extra[1] == "eager":
            assert "compiled/eager step time ratio" in out.stdout and result["step_time_ratio"] > 0
