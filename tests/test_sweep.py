"""tools/sweep.py: expansion like Hydra's -m, pairs first, N jobs at a time, skip / resume, failures."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, TINY, run_tool

from zoo.engine.sweep import SweepError, job_state, plan, split_values


def test_plan_is_the_cartesian_product_with_seed_slowest():
    jobs, fixed = plan(["model=resnet_tiny", "amp=fp32,O1", "seed=0,1,2", "data.builder.multiscale=[96,128]"])
    assert fixed == ["model=resnet_tiny", "data.builder.multiscale=[96,128]"]  # brackets do not split
    assert [j.overrides() for j in jobs[:3]] == [["amp=fp32", "seed=0"], ["amp=O1", "seed=0"], ["amp=fp32", "seed=1"]]
    assert len(jobs) == 6 and len({j.name for j in jobs}) == 6
    assert jobs[0].name == "amp=fp32_seed=0"
    assert split_values("a,'b,c',[1,2],{x:1,y:2}") == ["a", "'b,c'", "[1,2]", "{x:1,y:2}"]


@pytest.mark.parametrize("args,message", [
    (["amp"], "'amp': expected key=value"),
    (["hydra.sweep.dir=x"], "give the folder as --dir"),
    (["amp=fp32,fp32"], "a value is listed twice"),
    (["x=[1,2"], "unbalanced brackets"),
    (["f=a/b,a_b"], "would share a job folder"),
    (["--jobs=2"], "options go before '--'"),
])
def test_plan_rejects_what_it_cannot_run(args, message):
    with pytest.raises(SweepError, match=message):
        plan(args)


def test_job_state(tmp_path):
    assert job_state(tmp_path / "none") == "fresh"
    (tmp_path / "ck" / "checkpoints").mkdir(parents=True)
    (tmp_path / "ck" / "checkpoints" / "last.pdckpt").write_bytes(b"x")
    assert job_state(tmp_path / "ck") == "resume"
    (tmp_path / "ck" / "summary.json").write_text(json.dumps({"status": "stopped"}))
    assert job_state(tmp_path / "ck") == "resume"
    (tmp_path / "ck" / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert job_state(tmp_path / "ck") == "done"


@pytest.mark.slow
def test_sweep_runs_two_at_a_time_skips_done_jobs_and_names_a_failure(tmp_path, ampzoo_home):
    sweep = tmp_path / "sweep"
    env = {"AMPZOO_HOME": str(ampzoo_home)}
    args = ["tools/sweep.py", "--jobs", "2", "--dir", str(sweep), *TINY, "amp=fp32,O1,O9", "seed=0,1"]
    first = run_tool(args, ROOT, env)
    assert first.returncode == 1, first.stdout + first.stderr
    out = first.stdout
    assert "6 jobs, 0 already completed, 6 to run, 2 at a time, 1 thread(s) each" in out
    # Hydra's own error line, not its traceback hint
    assert "[3/6] amp=O9_seed=0: FAILED (exit 2) after " in out and "min: error: amp=O9: no such choice" in out
    assert f"failed: amp=O9_seed=1 (log {sweep / 'logs' / 'amp=O9_seed=1.log'})" in out
    assert "4 of 6 job(s) completed" in out
    done = sorted(p.parent.name for p in sweep.glob("*/summary.json"))
    assert done == ["amp=O1_seed=0", "amp=O1_seed=1", "amp=fp32_seed=0", "amp=fp32_seed=1"]
    for name in done:  # each job ran what its folder says
        s = json.loads((sweep / name / "summary.json").read_text())
        assert (s["requested_precision"], s["seed"]) == {"amp=O1": ("fp16-O1",), "amp=fp32": ("fp32",)}[
            name.split("_")[0]] + (int(name[-1]),)
    # the four runs pair in the report
    report = run_tool(["tools/report.py", str(sweep)], ROOT, env)
    assert report.returncode in (0, 1) and "paired TOST (2 seeds paired" in report.stdout
    # again without the bad value: nothing left to run
    again = run_tool(args[:-2] + ["amp=fp32,O1", "seed=0,1"], ROOT, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 jobs, 4 already completed, 0 to run" in again.stdout and "started" not in again.stdout
    # the same folder with another setting: refused before anything runs, naming the job and the difference
    other = run_tool(args[:-2] + ["amp=fp32,O1", "seed=0,1", "optim.lr=0.5"], ROOT, env)
    assert other.returncode == 2 and "started" not in other.stdout
    assert (f"error: {sweep / 'amp=fp32_seed=0'}: completed with other overrides than this sweep asks for "
            "(it had nothing else, the sweep wants ['optim.lr=0.5']") in other.stderr


def test_a_sweep_where_nothing_completed_says_so_instead_of_the_report_command(tmp_path, ampzoo_home):
    sweep = tmp_path / "sweep"
    out = run_tool(["tools/sweep.py", "--jobs", "2", "--dir", str(sweep), *TINY, "amp=O8,O9"], ROOT,
                   {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert "report:" not in out.stdout and "tools/report.py" not in out.stdout
    assert lines[-3:] == [f"failed: amp=O8 (log {sweep / 'logs' / 'amp=O8.log'})",
                          f"failed: amp=O9 (log {sweep / 'logs' / 'amp=O9.log'})",
                          f"nothing completed: no job of {sweep} has a summary.json to report; see the logs above"]
    assert "0 of 2 job(s) completed" in out.stdout


@pytest.mark.slow
def test_sigterm_stops_jobs_at_a_checkpoint_and_the_same_command_resumes(tmp_path, ampzoo_home):
    sweep = tmp_path / "sweep"
    args = [sys.executable, "tools/sweep.py", "--jobs", "1", "--dir", str(sweep), *TINY,
            "trainer.max_steps=100000", "trainer.ckpt_every=2", "amp=fp32", "seed=0,1"]
    env = dict(os.environ, AMPZOO_HOME=str(ampzoo_home), PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = sweep / "seed=0" / "metrics.jsonl"  # only swept keys name a job
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count('"train"') >= 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 143, out
    assert "interrupted: 1 running job(s) stopped at their last step and checkpointed" in out
    assert job_state(sweep / "seed=0") == "resume"
    assert not (sweep / "seed=1").exists()  # never started
    # the same command, shortened so the test ends: resumes job 0 from its checkpoint
    resumed = run_tool([a for a in args[1:] if a != "trainer.max_steps=100000"] + ["trainer.max_steps=200",
                        "trainer.resume_allow_changes=true"], ROOT, {"AMPZOO_HOME": str(ampzoo_home)})
    assert "[1/2] seed=0: resuming from its checkpoint" in resumed.stdout, resumed.stdout
    assert resumed.returncode == 0, resumed.stdout
    s = json.loads((sweep / "seed=0" / "summary.json").read_text())
    assert s["status"] == "completed" and s["resumed_from"]


def test_readme_sweep_commands_plan_and_compose():
    """Every `tools/sweep.py` command in the README and docs/ expands, and each of its jobs composes."""
    from conftest import compose

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "".join(p.read_text() for p in pages).replace("\\\n", " ")
    commands = [ln.split("python tools/sweep.py", 1)[1].split() for ln in text.splitlines()
                if ln.startswith("python tools/sweep.py")]
    assert len(commands) >= 4
    for argv in commands:
        overrides = argv[argv.index("--") + 1:]
        jobs, fixed = plan(overrides)
        assert len(jobs) >= 2 and any(j.swept.get("amp") == "fp32" for j in jobs)
        for amp in dict.fromkeys(j.swept["amp"] for j in jobs):  # one job per precision composes
            compose([*fixed, *next(j for j in jobs if j.swept["amp"] == amp).overrides()])
