"""What the loggers learn from the entry point rather than the config: the sweep a run belongs to
and the recipe it was composed with.

tools/train.py passes :func:`hydra_context` of its Hydra runtime config to the engine. A job of a
Hydra ``-m`` sweep knows its sweep folder from ``hydra.sweep.dir``; a job of tools/sweep.py runs
as a single Hydra run in its own folder, so the sweep runner names the sweep in
:data:`SWEEP_ENV`. The recipe is a group choice (``recipe: resnet/O1``): its file's entries become
tags (``recipe.amp.init_loss_scaling``), what the recipe set, beside the params (what ran).
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from zoo.tracking.base import flatten

SWEEP_ENV = "AMPZOO_SWEEP_DIR"  # set by zoo.engine.sweep for its jobs
RECIPE_GROUPS = ("recipe", "model_recipe")


def recipe_entries(config_dirs: list[Path], group: str, choice: str) -> dict | None:
    """The keys the chosen recipe file sets (flattened, its defaults list left out), or None when
    there is no such file (the group is ``optional``: Hydra records the choice all the same)."""
    for folder in config_dirs:
        path = Path(folder) / group / f"{choice}.yaml"
        if path.is_file():
            data = yaml.safe_load(path.read_text()) or {}
            if not isinstance(data, dict):
                return {}
            data.pop("defaults", None)
            return flatten(data)
    return None


def hydra_context(hydra_cfg, environ=None) -> dict:
    """``{"sweep_dir": folder or None, "tags": {recipe: ..., recipe.<key>: ...}}`` from
    ``HydraConfig.get()``."""
    environ = os.environ if environ is None else environ
    cwd = Path(str(hydra_cfg.runtime.cwd))
    sweep = environ.get(SWEEP_ENV)
    if not sweep and str(hydra_cfg.mode).endswith("MULTIRUN"):
        sweep = str(cwd / str(hydra_cfg.sweep.dir))
    dirs = [Path(str(s.path)) for s in hydra_cfg.runtime.config_sources if str(s.schema) == "file"]
    tags: dict = {}
    for group in RECIPE_GROUPS:
        choice = hydra_cfg.runtime.choices.get(group)
        entries = recipe_entries(dirs, group, str(choice)) if choice else None
        tags[group] = str(choice) if entries is not None else "none"
        tags.update({f"{group}.{k}": v for k, v in (entries or {}).items()})
    return {"sweep_dir": str(Path(sweep).resolve()) if sweep else None, "tags": tags}
