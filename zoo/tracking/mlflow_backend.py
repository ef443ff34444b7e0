"""MLflow: an experiment per model/data, a run per training run, a parent run per sweep.

The store is a local SQLite file by default (``sqlite:///outputs/mlflow.db``, beside the run
folders; MLflow 3 refuses its old ``./mlruns`` file store from 3.13 on), any tracking URI by
config. Params are the composed config flattened; tags the requested and effective precision, the
device, the recipe; metrics every metrics.jsonl line at its step; artifacts the run's files.

Steps are never logged twice: a resumed run continues the run named in the resumed folder's
tracking.json and logs a metric only at a step past the last one the store holds for it (MLflow
has no way to delete a logged value). A sweep's jobs (Hydra ``-m``, tools/sweep.py) are children of
one parent run per sweep folder and experiment, recorded in ``<sweep>/mlflow_parent.json`` under a
file lock, since tools/sweep.py starts jobs side by side.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from zoo.tracking.base import INSTALL_HINT, Backend, LoggerStartError, RunInfo

DEFAULT_URI = "sqlite:///outputs/mlflow.db"
ARTIFACTS_DIR = ".mlartifacts"       # a local store's artifacts, beside its file
PARENT_FILE = "mlflow_parent.json"   # in a sweep folder: its parent run(s)
PARENT_TAG = "mlflow.parentRunId"    # how MLflow (and its UI) nests a run under another
MAX_PARAM = 6000                     # MLflow 3's limits (mlflow.utils.validation)
MAX_TAG = 8000
BATCH = 100                          # params / tags per log_batch call
METRIC_BATCH = 1000


def resolve_uri(uri: str | None) -> str:
    """The tracking URI as MLflow gets it: a relative sqlite path made absolute (a resumed run or the
    report may run from another folder); a bare folder refused (MLflow's retired file store)."""
    uri = str(uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI)
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(uri[len('sqlite:///'):]).expanduser().resolve()}"
    if "://" not in uri or uri.startswith("file:"):
        raise LoggerStartError(f"logger.mlflow.tracking_uri: {uri} is a folder (MLflow's file store, which "
                               f"MLflow 3.13+ refuses); use a SQLite file, e.g. sqlite:///{uri.rstrip('/')}/mlflow.db")
    return uri


def sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def server_problem(uri: str, timeout: float = 5.0) -> str | None:
    """Why the MLflow server at ``uri`` does not answer its /health endpoint, or None when it does."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
            return None
    except urllib.error.HTTPError as e:  # it answered (behind auth or a proxy): reachable
        return None if e.code < 500 else f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e))


def _quiet_store_logs() -> None:
    # a new SQLite store logs each of its ~50 schema migrations at INFO
    for name in ("alembic", "mlflow.store.db.utils", "mlflow.store.sql_alchemy"):
        logging.getLogger(name).setLevel(logging.WARNING)


class MLflowBackend(Backend):
    name = "mlflow"

    def __init__(self, tracking_uri: str | None = None, experiment_name: str | None = None,
                 run_name: str | None = None, artifacts: bool = True, tags: dict | None = None):
        self.uri = tracking_uri
        self.experiment_name, self.run_name = experiment_name, run_name
        self.artifacts, self.tags = bool(artifacts), dict(tags or {})
        self.client = None
        self.run_id: str | None = None
        self.parent_id: str | None = None
        self.experiment_id: str | None = None
        self.logged: dict[str, int] = {}  # metric -> last step the store holds

    # ---- start -------------------------------------------------------------------------------
    def check(self) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise LoggerStartError(f"logger=mlflow: the mlflow package is missing ({e}); install it with "
                                   f"{INSTALL_HINT} (or pip install 'mlflow>=3'), or run without logger=mlflow") from None
        _quiet_store_logs()
        self.uri = resolve_uri(self.uri)
        db = sqlite_path(self.uri)
        if db is not None:
            try:
                db.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LoggerStartError(f"logger=mlflow: cannot create the store's folder {db.parent} ({e.strerror or e}); "
                                       "set logger.mlflow.tracking_uri=sqlite:///<a writable folder>/mlflow.db") from None
            if not os.access(db.parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
                raise LoggerStartError(f"logger=mlflow: the store {db} is not writable; set "
                                       "logger.mlflow.tracking_uri=sqlite:///<a writable folder>/mlflow.db")
        elif self.uri.startswith(("http://", "https://")):
            problem = server_problem(self.uri)
            if problem:
                raise LoggerStartError(f"logger=mlflow: no MLflow server answers at {self.uri} ({problem}); start "
                                       "it (mlflow server --host 127.0.0.1 --port 5000) or set "
                                       "logger.mlflow.tracking_uri (the default is a local SQLite file)")
            # a server that goes away mid-run costs a few seconds, not MLflow's default minutes of retries
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        self.client = MlflowClient(tracking_uri=self.uri)
        try:
            self.client.search_experiments(max_results=1)
        except Exception as e:  # noqa: BLE001  (any store error: a corrupt file, a refused login, ...)
            first = str(e).splitlines()[0] if str(e) else ""
            raise LoggerStartError(f"logger=mlflow: cannot open the tracking store {self.uri} ({type(e).__name__}: "
                                   f"{first}); fix it or set logger.mlflow.tracking_uri") from None

    def _experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            # beside a local store, in a hidden folder: tools that look for run folders under outputs/
            # (tools/report.py outputs) must not take the artifact copies of summary.json for runs
            db = sqlite_path(self.uri)
            where = (db.parent / ARTIFACTS_DIR).as_uri() if db is not None else None
            try:
                return self.client.create_experiment(name, artifact_location=where)
            except Exception:  # another job of the sweep created it first
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if exp.lifecycle_stage != "active":
            raise LoggerStartError(f"logger=mlflow: experiment {name!r} is deleted in {self.uri}; restore it "
                                   f"(mlflow experiments restore --experiment-id {exp.experiment_id}) or set "
                                   "logger.mlflow.experiment_name")
        return exp.experiment_id

    def _live_run(self, run_id: str | None):
        if not run_id:
            return None
        try:
            run = self.client.get_run(run_id)
        except Exception:  # noqa: BLE001  (gone from this store)
            return None
        return run if run.info.lifecycle_stage == "active" else None

    def start(self, info: RunInfo, params: dict, tags: dict) -> dict:
        self.experiment_id = self._experiment(self.experiment_name or info.experiment)
        prev = info.previous
        run = self._live_run(prev.get("run_id")) if prev.get("tracking_uri") == self.uri else None
        if run is not None:  # a resumed run: the same MLflow run, its logged steps kept
            self.run_id = run.info.run_id
            self.experiment_id = run.info.experiment_id
            self.parent_id = run.data.tags.get(PARENT_TAG)
            self.client.update_run(self.run_id, status="RUNNING")
            self.client.set_tag(self.run_id, "resumed_in", str(info.out_dir))
            self.logged = {key: max((m.step for m in self.client.get_metric_history(self.run_id, key)), default=-1)
                           for key in run.data.metrics}
        else:
            all_tags = {**tags, **{k: str(v) for k, v in self.tags.items()},
                        "mlflow.source.name": "tools/train.py", "mlflow.source.type": "LOCAL"}
            if tags.get("git_revision"):
                all_tags["mlflow.source.git.commit"] = tags["git_revision"]
            if info.sweep_dir is not None:
                self.parent_id = self._parent(info.sweep_dir, tags)
                all_tags[PARENT_TAG] = self.parent_id
            run = self.client.create_run(self.experiment_id, run_name=self.run_name or info.run_name,
                                         tags={k: str(v)[:MAX_TAG] for k, v in all_tags.items()})
            self.run_id = run.info.run_id
            self._log_params(params)
        if self.parent_id:
            self.client.update_run(self.parent_id, status="RUNNING")
        return {"tracking_uri": self.uri, "experiment_id": self.experiment_id, "run_id": self.run_id,
                "parent_run_id": self.parent_id}

    def _log_params(self, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], v[:MAX_PARAM]) for k, v in params.items()]
        for i in range(0, len(items), BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + BATCH])

    def _parent(self, sweep_dir: Path, tags: dict) -> str:
        """The sweep's parent run in this store and experiment, created by its first job."""
        sweep_dir = Path(sweep_dir).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        record_file = sweep_dir / PARENT_FILE
        with open(sweep_dir / f".{PARENT_FILE}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            try:
                record = json.loads(record_file.read_text())
            except (OSError, ValueError):
                record = {"runs": []}
            for entry in record.get("runs", []):
                if entry.get("tracking_uri") == self.uri and entry.get("experiment_id") == self.experiment_id \
                        and self._live_run(entry.get("run_id")) is not None:
                    return entry["run_id"]
            keep = {k: tags[k] for k in ("model", "data", "git_revision", "device") if k in tags}
            run = self.client.create_run(self.experiment_id, run_name=sweep_dir.name,
                                         tags={**keep, "sweep_dir": str(sweep_dir), "ampzoo.role": "sweep",
                                               "mlflow.source.name": "tools/train.py -m",
                                               "mlflow.source.type": "LOCAL"})
            record.setdefault("runs", []).append({"tracking_uri": self.uri, "experiment_id": self.experiment_id,
                                                  "run_id": run.info.run_id})
            tmp = record_file.with_name(f".{PARENT_FILE}.tmp")
            tmp.write_text(json.dumps(record, indent=2) + "\n")
            os.replace(tmp, record_file)
            return run.info.run_id

    # ---- during the run ----------------------------------------------------------------------
    def _log(self, entries) -> None:
        """(step, metrics, wall time) entries, each metric only past the last step the store holds."""
        from mlflow.entities import Metric

        batch = []
        for step, metrics, wall in entries:
            stamp = int((wall if wall else time.time()) * 1000)
            for key, value in metrics.items():
                if step > self.logged.get(key, -1):
                    batch.append(Metric(key, value, stamp, step))
                    self.logged[key] = step
        for i in range(0, len(batch), METRIC_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i:i + METRIC_BATCH])

    def log_metrics(self, step: int, metrics: dict, wall_time: float | None = None) -> None:
        self._log([(step, metrics, wall_time)])

    def resume(self, step: int, history: list) -> None:
        self._log(history)  # what the store misses (a new run, or lines logged while it was off)

    def set_tags(self, tags: dict) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)[:MAX_TAG]) for k, v in tags.items()])

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        if self.artifacts:
            self.client.log_artifact(self.run_id, str(path), folder)

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)
        if self.parent_id:  # the sweep's run ends with its last running job
            running = self.client.search_runs([self.experiment_id], max_results=1,
                                              filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_id}' "
                                                            "and attributes.status = 'RUNNING'")
            if not running:
                self.client.set_terminated(self.parent_id, "FINISHED")
