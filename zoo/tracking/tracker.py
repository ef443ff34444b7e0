"""The run's loggers together: checked before anything is built, fed from metrics.jsonl, never fatal
once training runs.

``Tracker.from_config(cfg.logger)`` builds and checks each selected backend (``logger=[mlflow,
tensorboard]``); a logger that cannot start raises :class:`LoggerStartError` (one ``error:`` line,
nothing trained). After that, a backend that fails is reported once, turned off, and the run goes on:
the metrics.jsonl line is written before any backend sees it, and checkpoints never wait for one.
Only rank 0 tracks (``enabled=False`` elsewhere).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from zoo.tracking.base import Backend, LoggerStartError, RunInfo, as_text, flatten, is_number, record_metrics

log = logging.getLogger(__name__)

TRACKING_FILE = "tracking.json"  # in the run folder: which run of which tool this folder is (resume finds it)
BACKENDS = {
    "mlflow": "zoo.tracking.mlflow_backend:MLflowBackend",
    "tensorboard": "zoo.tracking.tensorboard_backend:TensorBoardBackend",
    "wandb": "zoo.tracking.wandb_backend:WandbBackend",
}
# the run's files, logged at the end (drawings/ too: the detection tasks' PNGs)
ARTIFACTS = ("config.yaml", "summary.json", "metrics.jsonl", "data_problems.txt")
# summary.json numbers logged once, at the last step, as final/<key>
SUMMARY_METRICS = ("wall_time_s", "train_time_s", "images_per_s", "peak_memory_mb", "final_loss_scale",
                   "skipped_steps")


def make_backend(name: str, settings: dict) -> Backend:
    if name not in BACKENDS:
        raise LoggerStartError(f"logger={name}: no such logger; valid: {', '.join(BACKENDS)} (configs/logger/)")
    module, cls = BACKENDS[name].split(":")
    try:
        return getattr(importlib.import_module(module), cls)(**settings)
    except TypeError as e:  # a key the backend does not take
        raise LoggerStartError(f"logger.{name}: {e}") from None


def read_tracking_file(folder: Path | None) -> dict:
    if folder is None:
        return {}
    try:
        data = json.loads((Path(folder) / TRACKING_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _default_warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Tracker:
    """Fan-out to the run's backends; a listener of :class:`zoo.engine.metrics_log.MetricsLog`."""

    def __init__(self, backends: list[Backend], warn=None):
        self.backends = list(backends)
        self.warn = warn or _default_warn
        self.out_dir: Path | None = None
        self.started: list[Backend] = []
        self.failed: dict[str, str] = {}
        self.guard_counts: dict[str, int] = {}

    @classmethod
    def from_config(cls, logger_cfg: dict | None, enabled: bool = True, warn=None) -> Tracker:
        """The loggers of ``cfg.logger`` (``{name: settings}``), each checked: raises
        :class:`LoggerStartError` for one that cannot start. ``enabled=False`` (ranks other than 0):
        no logger at all."""
        if not enabled or not logger_cfg:
            return cls([], warn)
        backends = []
        for name, settings in logger_cfg.items():
            backend = make_backend(str(name), dict(settings or {}))
            backend.check()
            backends.append(backend)
        return cls(backends, warn)

    def __bool__(self) -> bool:
        return bool(self.backends)

    # ---- start and end ------------------------------------------------------------------------
    def start(self, config: dict, out_dir: Path, facts: dict, resume_dir: Path | None = None,
              context: dict | None = None) -> None:
        """Open each backend's run: ``config`` (resolved, plain) flattened as params, ``facts``
        (precision requested / effective, device, revision) and ``context`` (sweep folder, recipe:
        zoo.tracking.context) as tags. ``resume_dir``: the folder of the checkpoint being resumed,
        whose tracking.json names the runs to continue."""
        if not self.backends:
            return
        context = context or {}
        self.out_dir = Path(out_dir)
        sweep = context.get("sweep_dir")
        info = RunInfo(out_dir=self.out_dir, run_name=str(config.get("run_name") or self.out_dir.name),
                       experiment=f"{config['model']['name']}_{config['data']['name']}",
                       resume_dir=Path(resume_dir) if resume_dir else None,
                       sweep_dir=Path(sweep) if sweep else None)
        # the logger settings may hold a server's address or a token: not a param
        params = {k: as_text(v) for k, v in flatten({k: v for k, v in config.items() if k != "logger"}).items()}
        tags = {"model": config["model"]["name"], "data": config["data"]["name"], "seed": config.get("seed"),
                "run_dir": str(self.out_dir), **facts, **context.get("tags", {})}
        tags = {k: as_text(v) for k, v in tags.items() if v is not None}
        previous = read_tracking_file(info.resume_dir)
        ids = read_tracking_file(self.out_dir)
        for backend in self.backends:
            try:
                ids[backend.name] = backend.start(replace(info, previous=previous.get(backend.name) or {}),
                                                  params, tags) or {}
            except Exception as err:
                for opened in self.started:  # a run half-opened in another tool is closed, not left running
                    with contextlib.suppress(Exception):
                        opened.finish("FAILED")
                self.started = []
                if isinstance(err, LoggerStartError):
                    raise
                raise LoggerStartError(f"logger={backend.name}: cannot start its run ({type(err).__name__}: "
                                       f"{err}); run without logger={backend.name} or fix the store "
                                       "(docs/tracking.md)") from err
            self.started.append(backend)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.out_dir / f".{TRACKING_FILE}.tmp"
        tmp.write_text(json.dumps(ids, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.out_dir / TRACKING_FILE)

    @contextlib.contextmanager
    def running(self):
        """Finish the started runs when the block ends: FINISHED, KILLED (Ctrl-C, SIGTERM) or FAILED."""
        try:
            yield self
        except KeyboardInterrupt:
            self.finish("KILLED")
            raise
        except BaseException:
            self.finish("FAILED")
            raise
        else:
            self.finish("FINISHED")

    def finish(self, status: str) -> None:
        """Log the run's files and summary numbers, then close each run with ``status``."""
        if not self.started or self.out_dir is None:
            return
        summary = self._summary()
        files = [(self.out_dir / name, None) for name in ARTIFACTS if (self.out_dir / name).is_file()]
        files += [(p, "drawings") for p in sorted((self.out_dir / "drawings").glob("*.png"))]
        final = self._summary_metrics(summary)
        tags = {k: as_text(summary[k]) for k in ("status", "effective_precision") if summary.get(k) is not None}
        for backend in list(self.started):
            if final:
                self._call(backend, "log_metrics", int(summary.get("steps") or 0), final, None)
            if tags:
                self._call(backend, "set_tags", tags)
            for path, folder in files:
                self._call(backend, "log_artifact", path, folder)
            self._call(backend, "finish", status)
        self.started = []

    def _summary(self) -> dict:
        try:
            data = json.loads((self.out_dir / "summary.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def _summary_metrics(summary: dict) -> dict[str, float]:
        out = {f"final/{k}": float(v) for k, v in (summary.get("metrics") or {}).items() if is_number(v)}
        out.update({f"final/{k}": float(summary[k]) for k in SUMMARY_METRICS if is_number(summary.get(k))})
        return out

    # ---- MetricsLog listener ------------------------------------------------------------------
    def metrics_of(self, kind: str, record: dict) -> dict[str, float]:
        """A metrics.jsonl record as metrics; a guard line counts its event (``guard/skipped_step``:
        how many so far)."""
        if kind == "guard":
            event = str(record.get("event", "event"))
            self.guard_counts[event] = self.guard_counts.get(event, 0) + 1
            return {f"guard/{event}": float(self.guard_counts[event])}
        return record_metrics(kind, record)

    def on_record(self, kind: str, step: int, record: dict) -> None:
        """One metrics.jsonl line, already on disk."""
        if not self.started:
            return
        metrics = self.metrics_of(kind, record)
        if metrics:
            for backend in list(self.started):
                self._call(backend, "log_metrics", int(step), metrics, record.get("time"))

    def on_resume(self, step: int, records: list[dict]) -> None:
        """The run resumed at ``step`` with ``records`` (metrics.jsonl up to it) as its history."""
        if not self.started:
            return
        self.guard_counts = {}
        history, wall = [], None
        for r in records:  # eval and guard lines have no time of their own: the train line's before them
            wall = r.get("time", wall)
            history.append((int(r.get("step", 0)), self.metrics_of(str(r.get("kind")), r), wall))
        for backend in list(self.started):
            self._call(backend, "resume", int(step), [h for h in history if h[1]])

    # ---- failures -----------------------------------------------------------------------------
    def _call(self, backend: Backend, method: str, *args) -> None:
        try:
            getattr(backend, method)(*args)
        except Exception as err:  # noqa: BLE001  (a logger never stops the run)
            self.started.remove(backend)
            said = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            self.failed[backend.name] = said
            self.warn(f"warning: logger={backend.name} failed ({method}: {said}); it is off for the rest "
                      "of this run. metrics.jsonl and the checkpoints are complete; resuming the run "
                      f"(trainer.resume=...) logs what {backend.name} missed")
            if method != "finish":  # close its run if the tool still answers, so it does not stay "running"
                with contextlib.suppress(Exception):
                    backend.finish("FAILED")
