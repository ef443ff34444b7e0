"""The task a config names (``model.task``), before it is built: its class, and the numeric rules of
its arguments that the class declares (``Task.SETTINGS``, zoo/tasks/base.py).

The config check (zoo/engine/run.py ``check_numbers``) runs before anything is built, so it asks the
task's class, not an instance, which keys it takes and within which bounds. The rules of DB's
``loss.alpha`` or PP-YOLOE's ``loss.tal_topk`` live beside the code that reads them, and a new
family's keys are checked without an edit here.
"""
from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import OmegaConf

from zoo.utils.checks import Bound, prefixed

__all__ = ["TASK_KEY", "task_class", "task_settings"]

TASK_KEY = "model.task"


def task_class(node) -> type | None:
    """The class ``node`` would build, located by Hydra's ``instantiate`` (so its target policy
    applies) as a partial that is never called; None when ``node`` names no target or it cannot be
    located. Building the task afterwards reports a bad target with Hydra's reason and the key."""
    if node is None or not OmegaConf.is_dict(node) or "_target_" not in node:
        return None
    try:
        deferred = instantiate(node, _partial_=True, _recursive_=False)
    except Exception:  # noqa: BLE001  (any failure to locate is reported by the build that follows)
        return None
    found = getattr(deferred, "func", None)
    return found if isinstance(found, type) else None


def task_settings(cfg) -> dict[str, Bound]:
    """``{"model.task.<key>": rule}`` of the task class ``cfg`` names; empty for a task without rules."""
    cls = task_class(OmegaConf.select(cfg, TASK_KEY, default=None))
    return prefixed(f"{TASK_KEY}.", dict(getattr(cls, "SETTINGS", None) or {}))
