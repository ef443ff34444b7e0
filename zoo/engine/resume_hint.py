"""The command that resumes a stopped run, for the line a stop prints.

"resume with trainer.resume=auto" is only the key: the resume must also repeat the run's other
overrides (``trainer.max_steps=50``, ``model=...``), or it resumes into another schedule or finds
another run. When Hydra started the run (``tools/train.py``) its run folder holds the command line
(``.hydra/overrides.yaml``, and ``hydra.yaml`` with a ``hydra.run.dir=`` the user gave), so the
line can give the whole command; a run started from Python (:func:`zoo.engine.run.train`) gets
the key alone.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import yaml

__all__ = ["resume_command"]

_DROPPED = ("trainer.resume=", "hydra.mode=", "hydra.job.", "hydra.sweep.")


def _hydra_lists(out_dir: Path) -> tuple[list[str], list[str], str] | None:
    """(task overrides, hydra overrides, mode) of a Hydra run folder, or None."""
    try:
        task = yaml.safe_load((out_dir / ".hydra" / "overrides.yaml").read_text(encoding="utf-8"))
        hydra = yaml.safe_load((out_dir / ".hydra" / "hydra.yaml").read_text(encoding="utf-8"))["hydra"]
        if hydra["job"]["name"] != "train" or not isinstance(task, list):
            return None
        return [str(o) for o in task], [str(o) for o in hydra["overrides"]["hydra"]], str(hydra["mode"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None


def resume_command(out_dir) -> str:
    """``trainer.resume=auto: python tools/train.py <the run's overrides> trainer.resume=auto`` for a
    run tools/train.py started (a job of a ``-m`` sweep resumes by its folder, ``trainer.resume=<folder>``:
    ``auto`` looks only beside a single run's folder), else ``trainer.resume=auto``."""
    out_dir = Path(out_dir)
    found = _hydra_lists(out_dir)
    if found is None:
        return "trainer.resume=auto"
    task, hydra, mode = found
    resume = "trainer.resume=auto" if mode == "RUN" else f"trainer.resume={out_dir}"
    keep = [o for o in (*task, *hydra) if not o.startswith(_DROPPED)]
    return f"{resume}: " + shlex.join(["python", "tools/train.py", *keep, resume])
