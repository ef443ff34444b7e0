"""The run's metrics log: one JSON object per line (``metrics.jsonl``), written by rank 0."""
from __future__ import annotations

import json
from pathlib import Path

from zoo.utils.fileio import with_filename


class MetricsLog:
    """Append-only JSON-lines log. ``kind`` is ``train`` (per log step), ``eval`` or ``guard``.

    Listeners (the run's loggers, zoo.tracking.Tracker) see each line after it is on disk
    (``on_record``) and, on a resume, the lines carried over (``on_resume``)."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        self.listeners: list = []

    def follow(self, listener) -> None:
        """Add a listener with ``on_record(kind, step, values)`` and ``on_resume(step, records)``."""
        self.listeners.append(listener)

    def write(self, kind: str, step: int, **values) -> None:
        if not self.enabled:
            return
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps({"kind": kind, "step": step, **values}, sort_keys=True) + "\n")
        except OSError as e:
            raise with_filename(e, self.path) from e
        for listener in self.listeners:
            listener.on_record(kind, step, values)

    def carry_over(self, previous: Path, up_to_step: int, drop_eval_at: int | None = None) -> int:
        """Copy a killed run's lines up to the resumed step, so this log holds the whole curve.

        ``drop_eval_at``: a step whose evaluation the resumed run does again (one stopped midway, or
        the final one); its old ``eval`` line is left out so the log holds it once."""
        if not self.enabled:
            return 0
        if not previous.is_file():
            self._resumed(up_to_step, [])
            return 0
        kept = []
        for line in previous.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            step = rec.get("step", 0)
            if step <= up_to_step and not (rec.get("kind") == "eval" and step == drop_eval_at):
                kept.append(line)
        # Resuming in the same folder: drop lines logged after the checkpoint, they will be redone.
        same = self.path.exists() and previous.resolve() == self.path.resolve()
        with open(self.path, "w" if same else "a") as f:
            f.writelines(line + "\n" for line in kept)
        self._resumed(up_to_step, [json.loads(line) for line in kept])
        return len(kept)

    def _resumed(self, step: int, records: list[dict]) -> None:
        for listener in self.listeners:
            listener.on_resume(step, records)


def read_metrics(path: Path, kind: str | None = None) -> list[dict]:
    """All records of a metrics log (optionally one kind), naming the line of a corrupt record."""
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not a JSON record ({e.msg})") from e
        if kind is None or rec.get("kind") == kind:
            out.append(rec)
    return out
