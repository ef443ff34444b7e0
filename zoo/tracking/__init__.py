"""Experiment tracking: MLflow, TensorBoard and W&B from every run and sweep, offline first.

``logger=[mlflow,tensorboard]`` (configs/logger/) selects the backends; :class:`Tracker` checks
them before training, follows metrics.jsonl, and logs the run's files at its end (docs/tracking.md).
"""
from __future__ import annotations

from zoo.tracking.base import Backend, LoggerStartError, RunInfo
from zoo.tracking.tracker import TRACKING_FILE, Tracker, read_tracking_file

__all__ = ["Backend", "LoggerStartError", "RunInfo", "TRACKING_FILE", "Tracker", "read_tracking_file"]
