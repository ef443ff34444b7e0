"""Run a sweep of ``tools/train.py`` a few jobs at a time, into one folder, resumably.

Hydra's ``-m`` runs a sweep's jobs one after another in one process. A parity table on a 2-core
machine wants two single-threaded jobs side by side (Paddle's CPU step is fastest on one thread),
wants pairs (every precision of one seed) to finish together so that a sweep stopped half way
still gives a paired report, and must survive a stop: a sweep of 25 fifteen-minute runs spans an
afternoon. :func:`plan` expands ``key=a,b`` overrides like Hydra's basic sweeper (cartesian
product; brackets and quotes are not split) with ``seed`` varying slowest; :func:`run_sweep`
runs the jobs, each in ``<sweep dir>/<key=value_key=value...>`` with its log beside it, skips jobs whose
summary.json says completed, resumes interrupted ones from their checkpoint, and keeps going
when one job fails (the failure is named at the end, with its log).
"""
from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from zoo.tracking.context import SWEEP_ENV
from zoo.utils.runfolder import last_checkpoint

_SAFE = re.compile(r"[^A-Za-z0-9._+-]")  # job folder names: a value's other characters become "_"


class _Stop(Exception):
    """SIGTERM reached the sweep: stop the running jobs cleanly, like Ctrl-C."""


class SweepError(ValueError):
    """An unusable sweep command line (the message names the override)."""


def split_values(value: str) -> list[str]:
    """``"fp32,O1"`` -> ``["fp32", "O1"]``; commas inside ``[]``, ``{}``, ``()`` or quotes do not split."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in value:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    parts.append(cur)
    if depth != 0 or quote:
        raise SweepError(f"'{value}': unbalanced brackets or quotes")
    return parts


@dataclass
class Job:
    swept: dict                 # key -> value of the swept overrides, in command-line order

    @property
    def name(self) -> str:
        """The job's folder name: its swept overrides, other characters of a value as "_"."""
        return "_".join(f"{k}={_SAFE.sub('_', v)}" for k, v in self.swept.items()) or "job"

    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.swept.items()]


def plan(overrides: list[str]) -> tuple[list[Job], list[str]]:
    """Jobs (the cartesian product of the comma-listed overrides, ``seed`` slowest) and the fixed
    overrides every job gets."""
    fixed, swept = [], {}
    for item in overrides:
        if item.startswith("-"):
            raise SweepError(f"'{item}': options go before '--'; after it only key=value overrides")
        if "=" not in item:
            raise SweepError(f"'{item}': expected key=value (key=a,b,c to sweep)")
        key, value = item.split("=", 1)
        if key.startswith("hydra.") and key.split(".")[1] in ("run", "sweep"):
            raise SweepError(f"'{item}': the sweep places each job itself; give the folder as --dir")
        values = split_values(value)
        if len(values) > 1:
            if key in swept:
                raise SweepError(f"'{key}' is swept twice")
            if len(set(values)) != len(values):
                raise SweepError(f"'{item}': a value is listed twice")
            swept[key] = values
        else:
            fixed.append(item)
    for key, values in swept.items():
        if len({_SAFE.sub("_", v) for v in values}) != len(values):
            raise SweepError(f"'{key}={','.join(values)}': values that differ only in characters other "
                             "than letters, digits and . _ + - would share a job folder")
    keys = list(swept)
    order = sorted(keys, key=lambda k: k != "seed")  # seed outermost: pairs finish together
    jobs = []
    for combo in itertools.product(*(swept[k] for k in order)):
        chosen = dict(zip(order, combo))
        jobs.append(Job({k: chosen[k] for k in keys}))
    return jobs, fixed


def job_state(folder: Path) -> str:
    """``done`` (summary.json says completed), ``resume`` (a checkpoint and no completed summary)
    or ``fresh``."""
    summary = folder / "summary.json"
    if summary.is_file():
        try:
            if json.loads(summary.read_text()).get("status", "completed") == "completed":
                return "done"
        except (OSError, ValueError):
            pass
    return "resume" if (last_checkpoint(folder)).is_file() else "fresh"


_OWN_KEYS = ("trainer.progress", "trainer.resume")  # what the sweep adds to every job


def _check_same_job(folder: Path, expected: list[str]) -> None:
    """A completed job is only skipped if it ran these overrides (its .hydra/overrides.yaml): a
    sweep folder reused with other settings would otherwise mix runs of two configurations."""
    import yaml

    recorded_file = folder / ".hydra" / "overrides.yaml"
    try:
        recorded = yaml.safe_load(recorded_file.read_text()) or []
    except (OSError, yaml.YAMLError):
        return  # not a Hydra run folder (copied summaries): the report's config check still applies
    def own(o):  # the sweep's own keys, and where a job is tracked (logger=...), which is not what it trains
        key = str(o).split("=", 1)[0].lstrip("+~")
        return key in _OWN_KEYS or key.split(".")[0] == "logger"

    recorded = {str(o) for o in recorded if not own(o)}
    wanted = {o for o in expected if not own(o)}
    if recorded != wanted:
        extra, missing = sorted(recorded - wanted), sorted(wanted - recorded)
        raise SweepError(f"{folder}: completed with other overrides than this sweep asks for "
                         f"(it had {extra or 'nothing else'}, the sweep wants {missing or 'nothing else'}; "
                         f"{recorded_file}). Use another --dir, or move that folder away")


def _run_dir(folder: Path) -> str:
    if "'" in str(folder):
        raise SweepError(f"{folder}: a sweep folder may not contain a single quote")
    return f"hydra.run.dir='{folder}'"  # quoted: Hydra's grammar would read '=' or brackets


def _command(train: Path, fixed: list[str], job: Job, sweep_dir: Path, state: str) -> list[str]:
    """The job's train.py command line (a resumed job names its own folder as the checkpoint)."""
    folder = sweep_dir / job.name
    cmd = [sys.executable, str(train), *fixed, *job.overrides(), _run_dir(folder), "trainer.progress=false"]
    return cmd + [f"trainer.resume='{folder}'"] if state == "resume" else cmd


def _result(folder: Path) -> str:
    try:
        s = json.loads((folder / "summary.json").read_text())
        pm = s["primary_metric"]
        return f"{pm['name']} {100 * float(pm['value']):.2f} ({s.get('effective_precision')})"
    except (OSError, ValueError, KeyError, TypeError):
        return "no summary"


def _last_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()
                 and "Warning: " not in ln and not ln.strip().startswith("warnings.warn(")]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("error:")]
    if errors:  # the trainer's one-line user error
        return errors[-1][:300]
    if any(ln.startswith("Config search path:") for ln in lines):  # Hydra's compose error: its first line
        return lines[0][:300]
    return (lines or [""])[-1][:300]  # a traceback's last line


def run_sweep(train: Path, overrides: list[str], sweep_dir: Path, jobs_at_once: int = 2, threads: int = 1,
              dry_run: bool = False, out=sys.stdout, poll_s: float = 1.0) -> int:
    """Run the sweep; 0 when every job completed, 1 when some failed, 130 / 143 when stopped by
    Ctrl-C / SIGTERM (running jobs get SIGTERM, checkpoint and stop; the same call resumes).
    The closing lines name each failed job's log, then the report command, unless no job of the
    sweep has completed (now or in an earlier call): then they say that nothing completed.
    ``train`` is the training script each job runs (tools/sweep.py passes tools/train.py: the
    engine does not reach into the repository by path)."""
    jobs, fixed = plan(overrides)
    if jobs_at_once < 1 or threads < 1:
        raise SweepError("--jobs and --threads must be at least 1")
    sweep_dir = Path(sweep_dir).resolve()
    logs = sweep_dir / "logs"

    def say(msg):
        print(msg, file=out, flush=True)

    todo = []
    for i, job in enumerate(jobs, 1):
        state = job_state(sweep_dir / job.name)
        if state == "done":
            _check_same_job(sweep_dir / job.name, [*fixed, *job.overrides()])
            say(f"[{i}/{len(jobs)}] {job.name}: already completed, {_result(sweep_dir / job.name)}")
        else:
            todo.append((i, job, state))
    say(f"sweep {sweep_dir}: {len(jobs)} jobs, {len(jobs) - len(todo)} already completed, "
        f"{len(todo)} to run, {jobs_at_once} at a time, {threads} thread(s) each")
    if dry_run:
        for i, job, state in todo:
            say(f"[{i}/{len(jobs)}] would run ({state}): {' '.join(_command(train, fixed, job, sweep_dir, state)[1:])}")
        return 0
    logs.mkdir(parents=True, exist_ok=True)
    # the jobs' loggers find the sweep by SWEEP_ENV: each job is a single Hydra run in its own folder
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), **{SWEEP_ENV: str(sweep_dir)})
    running: dict = {}
    failed: list = []
    start_all = time.time()
    queue = list(todo)

    def on_term(signum, frame):
        raise _Stop(signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while queue or running:
            while queue and len(running) < jobs_at_once:
                i, job, state = queue.pop(0)
                cmd = _command(train, fixed, job, sweep_dir, state)
                log = logs / f"{job.name}.log"
                handle = open(log, "a")
                proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
                running[proc] = (i, job, log, handle, time.time())
                say(f"[{i}/{len(jobs)}] {job.name}: {'resuming from its checkpoint' if state == 'resume' else 'started'}"
                    f" (log {log})")
            time.sleep(poll_s)
            for proc in [p for p in running if p.poll() is not None]:
                i, job, log, handle, t0 = running.pop(proc)
                handle.close()
                minutes = (time.time() - t0) / 60
                if proc.returncode == 0 and job_state(sweep_dir / job.name) == "done":
                    say(f"[{i}/{len(jobs)}] {job.name}: completed in {minutes:.1f} min, {_result(sweep_dir / job.name)}")
                else:
                    failed.append((i, job, log))
                    say(f"[{i}/{len(jobs)}] {job.name}: FAILED (exit {proc.returncode}) after {minutes:.1f} min: "
                        f"{_last_line(log)}")
    except (KeyboardInterrupt, _Stop) as stop:
        for proc in running:  # the trainer checkpoints on SIGTERM and exits 143
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, (_, _, _, handle, _) in running.items():
            proc.wait()
            handle.close()
        say(f"interrupted: {len(running)} running job(s) stopped at their last step and checkpointed; "
            "the same command resumes them and skips the completed ones")
        return 143 if isinstance(stop, _Stop) else 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    hours = (time.time() - start_all) / 3600
    say(f"sweep finished in {hours:.2f} h: {len(todo) - len(failed)} of {len(todo)} job(s) completed")
    for _, job, log in sorted(failed, key=lambda f: f[0]):  # in job order, not the order they ended
        say(f"failed: {job.name} (log {log})")
    if len(failed) == len(jobs):  # none ran to completion, now or before: there is nothing to report on
        say(f"nothing completed: no job of {sweep_dir} has a summary.json to report; see the logs above")
        return 1
    say(f"report: python tools/report.py {sweep_dir}")
    return 1 if failed else 0
