"""tools/report.py's verdict on a sweep, logged to the sweep's MLflow parent run (when it has one)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from zoo.tracking.base import INSTALL_HINT
from zoo.tracking.mlflow_backend import PARENT_FILE

_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")  # what MLflow allows in a metric or tag name


def parent_runs(inputs) -> list[dict]:
    """The parent runs (tracking_uri, experiment_id, run_id) of the sweep folders among ``inputs``."""
    found = []
    for item in inputs:
        record = Path(item) / PARENT_FILE
        if record.is_file():
            try:
                found += json.loads(record.read_text()).get("runs", [])
            except (OSError, ValueError):
                continue
    return found


def verdicts(report: dict) -> tuple[dict, dict]:
    """Tags (the overall verdict, one per group and precision) and metrics (each side's difference
    from FP32 and its CI) of a report.json."""
    tags = {"report.verdict": "all equivalent" if report.get("all_equivalent") else "not all equivalent"}
    metrics = {}
    for entry in report.get("groups", []):
        for side in entry.get("amp", []):
            name = _KEY.sub("_", f"{entry.get('group')}/{side.get('precision')}")
            tags[f"report.{name}"] = str(side.get("verdict"))
            if isinstance(side.get("diff"), (int, float)):
                metrics[f"report/{name}/diff"] = float(side["diff"])
            ci = side.get("ci")
            if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(c, (int, float)) for c in ci):
                metrics[f"report/{name}/ci_low"], metrics[f"report/{name}/ci_high"] = map(float, ci)
    return tags, metrics


def log_report(inputs, report_dir: Path, warn) -> list[str]:
    """Log ``report_dir`` (report.md, report.json, index.html, plots) as artifacts under ``report/``,
    the verdicts as tags and the differences as metrics, to each sweep's parent run. Returns the run
    ids logged to; a store that fails is a warning (the report itself is written)."""
    parents = parent_runs(inputs)
    if not parents:
        return []
    try:
        from mlflow.entities import Metric, RunTag
        from mlflow.tracking import MlflowClient
    except ImportError as e:
        warn(f"warning: the sweep has an MLflow run but mlflow is missing ({e}); the report is not logged "
             f"to it ({INSTALL_HINT})")
        return []
    report_dir = Path(report_dir)
    tags, metrics = verdicts(json.loads((report_dir / "report.json").read_text()))
    done = []
    for entry in parents:
        run_id = entry.get("run_id")
        try:
            client = MlflowClient(tracking_uri=entry["tracking_uri"])
            stamp = int(Path(report_dir / "report.json").stat().st_mtime * 1000)
            client.log_batch(run_id, metrics=[Metric(k, v, stamp, 0) for k, v in metrics.items()],
                             tags=[RunTag(k, v) for k, v in tags.items()])
            client.log_artifacts(run_id, str(report_dir), "report")
            done.append(run_id)
        except Exception as err:  # noqa: BLE001  (the report is on disk whatever the store does)
            warn(f"warning: the report was not logged to MLflow run {run_id} at {entry.get('tracking_uri')} "
                 f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")
    return done
