"""Weights & Biases, optional: offline by default (``WANDB_MODE`` or ``logger.wandb.mode``), into
``<run folder>/wandb/``; ``wandb sync`` uploads it later. A resumed run continues the same W&B run
id (W&B itself ignores a step at or before its last one, so nothing is logged twice)."""
from __future__ import annotations

import uuid
from pathlib import Path

from zoo.tracking.base import INSTALL_HINT, Backend, LoggerStartError, RunInfo


class WandbBackend(Backend):
    name = "wandb"

    def __init__(self, project: str = "ampzoo", entity: str | None = None, mode: str = "offline",
                 group: str | None = None, tags: list | None = None):
        self.project, self.entity, self.mode = project, entity, str(mode)
        self.group, self.tags = group, [str(t) for t in (tags or [])]
        self.run = None
        self.files: list[Path] = []  # the run's files, one W&B artifact at the end
        self.held = -1       # the last step a resumed W&B run already holds
        self.last_step = -1

    def check(self) -> None:
        if self.mode not in ("offline", "online", "disabled"):
            raise LoggerStartError(f"logger.wandb.mode: expected offline, online or disabled, got {self.mode!r}")
        try:
            import wandb  # noqa: F401
        except ImportError as e:
            raise LoggerStartError(f"logger=wandb: the wandb package is missing ({e}); install it with "
                                   "pip install wandb, or run without logger=wandb") from None

    def start(self, info: RunInfo, params: dict, tags: dict) -> dict:
        import wandb

        group = self.group or (info.sweep_dir.name if info.sweep_dir else None)
        run_id = info.previous.get("id") or uuid.uuid4().hex[:12]
        self.run = wandb.init(project=self.project, entity=self.entity, mode=self.mode, dir=str(info.out_dir),
                              id=run_id, resume="allow", name=info.run_name, group=group,
                              job_type="train", tags=self.tags or None,
                              config={**params, **{f"run.{k}": v for k, v in tags.items()}}, reinit="create_new")
        self.held = int(getattr(self.run, "step", 0) or 0) - 1 if info.previous.get("id") else -1
        return {"id": run_id, "project": self.project, "mode": self.mode}

    def resume(self, step: int, history: list) -> None:
        for s, metrics, _ in history:
            self.log_metrics(s, metrics)

    def log_metrics(self, step: int, metrics: dict, wall_time: float | None = None) -> None:
        if step > self.held and step >= self.last_step:  # W&B drops a step before its last one anyway
            self.run.log(metrics, step=step)
            self.last_step = step

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        import wandb

        if folder == "drawings" and Path(path).suffix.lower() == ".png":
            self.run.log({f"drawings/{Path(path).stem}": wandb.Image(str(path))}, step=max(self.last_step, 0))
        else:  # not run.save: W&B keeps its own config.yaml among a run's files
            self.files.append(Path(path))

    def finish(self, status: str) -> None:
        import wandb

        if self.files:
            files = wandb.Artifact(f"run-{self.run.id}-files", type="run-files")
            for path in self.files:
                files.add_file(str(path), name=path.name)
            self.run.log_artifact(files)
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
