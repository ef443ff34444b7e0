"""TensorBoard: event files beside metrics.jsonl, written with tensorboardX (no TensorFlow).

Scalars at their training step (``train/loss``, ``train/loss_scale``, ``eval/top1``, ...), the run's
tags as a text table, the detection drawings as images. ``tensorboard --logdir outputs`` shows
every run folder as a run.

A resumed run rewrites its folder's event files from its history (metrics.jsonl up to the resumed
step, which the trainer has just carried over), then appends: the steps a killed run logged after
its last checkpoint are redone once, not shown twice, and a resume into a new folder, or with
tensorboard turned on only now, still shows the whole curve.
"""
from __future__ import annotations

from pathlib import Path

from zoo.tracking.base import INSTALL_HINT, Backend, LoggerStartError, RunInfo

EVENTS = "events.out.tfevents.*"


class TensorBoardBackend(Backend):
    name = "tensorboard"

    def __init__(self, flush_secs: int = 30, images: bool = True, logdir: str | None = None):
        self.flush_secs, self.images, self.logdir = int(flush_secs), bool(images), logdir
        self.dir: Path | None = None
        self.writer = None
        self.step = 0
        self.text = ""

    def check(self) -> None:
        try:
            import tensorboardX  # noqa: F401
        except ImportError as e:
            raise LoggerStartError(f"logger=tensorboard: the tensorboardX package is missing ({e}); install it "
                                   f"with {INSTALL_HINT} (or pip install tensorboardX), or run without "
                                   "logger=tensorboard") from None

    def _writer(self):
        if self.writer is None:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(logdir=str(self.dir), flush_secs=self.flush_secs)
            self.writer.add_text("run", self.text, 0)
        return self.writer

    def start(self, info: RunInfo, params: dict, tags: dict) -> dict:
        self.dir = Path(self.logdir) if self.logdir else Path(info.out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        rows = "".join(f"| {k} | {str(v).replace('|', '/')} |\n" for k, v in sorted(tags.items()))
        self.text = f"| tag | value |\n|---|---|\n{rows}"
        if info.resume_dir is None:
            self._writer()  # fails now (an unwritable folder) rather than at the first log step
        return {"logdir": str(self.dir)}

    def resume(self, step: int, history: list) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        for old in self.dir.glob(EVENTS):
            old.unlink()
        writer = self._writer()
        for s, metrics, wall in history:
            for key, value in metrics.items():
                writer.add_scalar(key, value, s, walltime=wall)
        self.step = step
        writer.flush()

    def log_metrics(self, step: int, metrics: dict, wall_time: float | None = None) -> None:
        writer = self._writer()
        for key, value in metrics.items():
            writer.add_scalar(key, value, step, walltime=wall_time)
        self.step = max(self.step, step)

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        if not (self.images and folder == "drawings" and Path(path).suffix.lower() == ".png"):
            return
        import numpy as np
        from PIL import Image

        with Image.open(path) as im:
            pixels = np.asarray(im.convert("RGB"))
        self._writer().add_image(f"drawings/{Path(path).stem}", pixels, self.step, dataformats="HWC")

    def finish(self, status: str) -> None:
        if self.writer is not None:
            self.writer.add_text("status", status, self.step)
            self.writer.close()
            self.writer = None
