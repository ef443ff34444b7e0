"""What every tracking backend implements, and the conversions they share.

A backend gets four calls (mmengine's visualizer backends and Lightning's loggers have the same
shape): :meth:`Backend.start` with the run's facts, its flattened config and tags;
:meth:`Backend.log_metrics` once per metrics.jsonl line; :meth:`Backend.log_artifact` for the run's
files at the end; :meth:`Backend.finish` with the run's status. Two more have defaults:
:meth:`Backend.check` (before anything is built: can this logger start at all?) and
:meth:`Backend.resume` (a resumed run hands over its history so far, to log what is not there yet).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = 'pip install -e ".[tracking]"'


class LoggerStartError(ValueError):
    """A logger cannot start (package missing, store not writable, server unreachable); the message
    names the logger and the fix. Raised before training, shown as one ``error:`` line."""


@dataclass
class RunInfo:
    """What a backend needs to know about the run it records."""

    out_dir: Path                  # the run folder (metrics.jsonl, summary.json, ...)
    run_name: str                  # configs/train.yaml run_name
    experiment: str                # <model>_<data>
    resume_dir: Path | None = None  # the folder of the checkpoint this run resumes, if it resumes
    previous: dict = field(default_factory=dict)  # that folder's tracking.json entry of this backend
    sweep_dir: Path | None = None  # the sweep folder when the run is a job of one (Hydra -m, tools/sweep.py)


class Backend:
    """One tracking tool. Errors raised from the logging calls are the Tracker's to handle (it warns
    once and turns the backend off); :meth:`check` and :meth:`start` raise :class:`LoggerStartError`."""

    name = "?"

    def check(self) -> None:
        """Raise :class:`LoggerStartError` unless this logger can start (import, store, server)."""

    def start(self, info: RunInfo, params: dict[str, str], tags: dict[str, str]) -> dict:
        """Open the run; return what identifies it, kept in the run folder's tracking.json."""
        raise NotImplementedError

    def resume(self, step: int, history: list[tuple[int, dict[str, float], float | None]]) -> None:
        """The run resumed at ``step``; ``history`` is its metrics so far, as (step, metrics, wall
        time) in log order. Log what this backend does not hold yet, and never a step twice."""

    def log_metrics(self, step: int, metrics: dict[str, float], wall_time: float | None = None) -> None:
        raise NotImplementedError

    def set_tags(self, tags: dict[str, str]) -> None:
        """Tags known at the end (summary.json's status)."""

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        """A file of the run (``folder``: where it goes among the run's artifacts, e.g. drawings)."""

    def finish(self, status: str) -> None:
        """``status``: FINISHED, FAILED or KILLED (MLflow's names)."""


def flatten(node, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    if isinstance(node, dict):
        out: dict = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def as_text(value) -> str:
    """A config value as a param/tag string: strings as they are, the rest as JSON (null, true, [1, 2])."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# metrics.jsonl fields that are not curves
_NOT_METRICS = {"kind", "step", "time"}


def record_metrics(kind: str, record: dict) -> dict[str, float]:
    """A metrics.jsonl record as metric names: ``train/loss``, ``train/loss_scale``, ``eval/top1``, ...

    Numbers only (an fp32 run's loss scale is null); inf and NaN are kept, so a diverging loss shows."""
    return {f"{kind}/{k}": float(v) for k, v in record.items() if k not in _NOT_METRICS and is_number(v)}
