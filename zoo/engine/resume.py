"""What a run continues (``trainer.resume``), how long it then runs, and the mark on what it continued.

A run is a chain of run folders. Each invocation of tools/train.py writes its own folder (Hydra's);
one that resumes another folder's checkpoint continues that run, and once it holds a checkpoint of
its own the folder it continued gets a summary.json saying so (``status: continued``,
``continued_by: <new folder>``). So a later ``trainer.resume=auto`` never takes that checkpoint up
again, and tools/report.py reads the chain's newest folder instead of failing on the old one. A
resume in the run's own folder (tools/sweep.py's, or a fixed ``hydra.run.dir``) is the same folder
going on.

``trainer.resume=auto`` continues this folder's own checkpoint, else the newest sibling folder (same
parent: same run name) that is *unfinished* (a checkpoint, no summary.json, no live process) and
whose settings match (only :data:`~zoo.engine.checkpoint.SAFE_TO_CHANGE_ON_RESUME` keys differ, or
any with ``trainer.resume_allow_changes=true``). Completed, continued and guard-stopped runs are
never taken; a line each (at most :data:`SKIP_LINES`) says why a newer folder was passed over, and
one says which was taken, or that the run starts fresh.

The run's length: a resume keeps the resumed run's ``trainer.max_steps`` / ``trainer.epochs``
unless this command line sets one of them, so ``trainer.max_steps=50`` killed and then
``trainer.resume=auto`` finishes the 50-step run with its 50-step LR schedule. A length set on the
command line is taken, and said (the LR schedule is then the new length's from the resumed step on).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from zoo.engine import checkpoint as ckpt
from zoo.engine.runinfo import write_json
from zoo.engine.runlock import holder_if_locked
from zoo.utils.runfolder import CKPT_DIR, last_checkpoint

log = logging.getLogger(__name__)

SKIP_LINES = 3  # at most this many "passed over" lines; the rest are counted
RUN_LENGTH_KEYS = ("max_steps", "epochs")  # trainer.*
_OFF = (None, False, "", "null", "none")


class ResumeError(ckpt.CheckpointError):
    """Resuming as asked is impossible (nothing at the path, a folder that holds a run already)."""


@dataclass
class ResumePlan:
    """The checkpoint a run continues, loaded, and what differs from it."""

    path: Path                      # the checkpoint file
    state: dict | None              # its content (the trainer drops it once loaded)
    changes: dict                   # check_resume_config's {"safe", "overridden", "checked"}
    step: int                       # the checkpoint's step
    continues: Path | None = None   # another, unfinished run folder: marked continued by this one
    record: dict = field(default_factory=dict)  # model, data, seed of the continued run (its mark)


# ---- a run folder's state -------------------------------------------------------------------------
def read_summary(run_dir: Path) -> dict | None:
    """The folder's summary.json, ``{}`` when unreadable, None when absent."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _saved_config(run_dir: Path) -> str | None:
    """The resolved config a run started with: its config.yaml (cheap), else its checkpoint's."""
    try:
        return (run_dir / "config.yaml").read_text()
    except OSError:
        pass
    try:
        return ckpt.load(last_checkpoint(run_dir)).get("config")
    except ckpt.CheckpointError:
        return None


def _not_resumable(run_dir: Path, new_yaml: str | None, allow_changes: bool) -> tuple[str, int] | None:
    """Why ``trainer.resume=auto`` passes over ``run_dir`` (and the log level to say it at), or None."""
    summary = read_summary(run_dir)
    if summary is not None:
        status = summary.get("status", "completed") if summary else "unreadable summary.json"
        if status == "continued":
            return f"continued by {summary.get('continued_by')}", logging.INFO
        if status == "stopped_by_guard":
            return (f"stopped by the numerics guard at step {summary.get('steps')} (amp.guard.*); auto never "
                    f"resumes it (trainer.resume={run_dir} does, if you mean it)"), logging.WARNING
        return str(status), logging.INFO
    if not last_checkpoint(run_dir).is_file():
        return "no checkpoint (stopped before its first)", logging.INFO
    holder = holder_if_locked(run_dir)
    if holder:  # not killed: still running; continuing it would fork it
        return f"still running ({holder})", logging.WARNING
    saved = _saved_config(run_dir) if new_yaml is not None and not allow_changes else None
    if saved:
        unsafe = ckpt.unsafe_changes(saved, new_yaml)
        if unsafe:
            listing = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(unsafe.items())[:4])
            more = f"; and {len(unsafe) - 4} more" if len(unsafe) > 4 else ""
            return (f"unfinished, but its settings differ: {listing}{more} (trainer.resume={run_dir} "
                    "trainer.resume_allow_changes=true continues it anyway)"), logging.WARNING
    return None


def _looks_like_run(path: Path) -> bool:
    return path.is_dir() and not path.name.startswith(".") and any(
        (path / name).exists() for name in ("config.yaml", "summary.json", CKPT_DIR))


def _auto(out_dir: Path, new_yaml: str | None, allow_changes: bool) -> Path | None:
    """``trainer.resume=auto``'s checkpoint, or None (start fresh); says what it took and passed over."""
    own = last_checkpoint(out_dir)
    if own.is_file():
        log.info("trainer.resume=auto: continuing this run folder's own checkpoint %s", own)
        return own
    parent = out_dir.parent
    siblings = sorted((p for p in parent.iterdir() if p != out_dir and _looks_like_run(p)),
                      key=lambda p: p.name, reverse=True) if parent.is_dir() else []
    passed = []
    for sib in siblings:  # newest first: run folders are named by their time stamp
        why = _not_resumable(sib, new_yaml, allow_changes)
        if why is None:
            _say_passed(passed)
            log.info("trainer.resume=auto: continuing %s, the newest unfinished run under %s with these settings",
                     sib, parent)
            return last_checkpoint(sib)
        passed.append((sib, *why))
    _say_passed(passed)
    log.info("trainer.resume=auto: no unfinished run under %s with these settings; starting fresh", parent)
    return None


def _say_passed(passed: list) -> None:
    for sib, reason, level in passed[:SKIP_LINES]:
        log.log(level, "trainer.resume=auto: passing over %s: %s", sib.name, reason)
    if len(passed) > SKIP_LINES:
        log.info("trainer.resume=auto: passing over %d more (completed, continued or not resumable)",
                 len(passed) - SKIP_LINES)


def find_resume(resume, out_dir: Path, new_yaml: str | None = None, allow_changes: bool = False) -> Path | None:
    """Resolve ``trainer.resume`` (null | auto | a checkpoint or run folder) to a checkpoint file.

    ``new_yaml``: this run's resolved config, which ``auto`` compares candidates' settings with
    (None: not compared)."""
    if resume in _OFF:
        return None
    out_dir = Path(out_dir)
    if resume == "auto":
        return _auto(out_dir, new_yaml, allow_changes)
    path = Path(str(resume))
    if path.is_dir():
        path = last_checkpoint(path)
    if not path.is_file():
        raise ResumeError(f"trainer.resume={resume}: no checkpoint at {path}")
    summary = read_summary(path.parent.parent) if path.parent.name == CKPT_DIR else None
    if summary and summary.get("status") == "continued":
        log.warning("trainer.resume=%s: that run was continued by %s already; continuing it again forks it",
                    resume, summary.get("continued_by"))
    return path


# ---- the run's length -----------------------------------------------------------------------------
def _given_keys(command_line) -> set[str]:
    """Keys the command line sets (``key=v``, ``+key=v``, ``++key=v``, ``~key``)."""
    return {str(o).split("=", 1)[0].lstrip("+~") for o in command_line}


def _length_text(values: dict) -> str:
    return ", ".join(f"trainer.{k}={values[k]}" for k in RUN_LENGTH_KEYS if k == "max_steps" or values[k])


def settle_run_length(cfg: DictConfig, saved_yaml: str | None, command_line) -> None:
    """Keep the resumed run's length in ``cfg`` unless ``command_line`` sets it (None: the caller's
    config is what it asks for, as when set); say which, when the two differ."""
    if not saved_yaml:
        return
    saved = (yaml.safe_load(saved_yaml) or {}).get("trainer") or {}
    old = {k: saved.get(k) for k in RUN_LENGTH_KEYS}
    new = {k: cfg.trainer.get(k) for k in RUN_LENGTH_KEYS}
    if old == new or old["max_steps"] is None:
        return
    given = _given_keys(command_line) if command_line is not None else None
    if given is None or given & {f"trainer.{k}" for k in RUN_LENGTH_KEYS}:
        log.warning("trainer.resume: the run's length changes from %s to %s (%s); the learning-rate "
                    "schedule is the new length's from the resumed step on", _length_text(old),
                    _length_text(new), "set on the command line" if given is not None else "this config's")
        return
    for k in RUN_LENGTH_KEYS:
        OmegaConf.update(cfg, f"trainer.{k}", old[k], merge=False)
    log.warning("trainer.resume: keeping the resumed run's length, %s (this command line sets none; "
                "a fresh run would have %s); pass trainer.max_steps=N to change it", _length_text(old),
                _length_text(new))


# ---- planning and marking -------------------------------------------------------------------------
def plan(cfg: DictConfig, out_dir: Path, command_line=None) -> ResumePlan | None:
    """Find and load what this run continues (``cfg.trainer.resume``), settle its length in ``cfg``
    (:func:`settle_run_length`) and check its settings; None for a fresh run.

    Raises :class:`ResumeError` when ``out_dir`` already holds a checkpoint and no resume was asked
    for (nothing is overwritten), and :class:`~zoo.engine.checkpoint.CheckpointError` for a checkpoint
    that cannot be read or whose settings differ."""
    out_dir = Path(out_dir)
    allow = bool(cfg.trainer.get("resume_allow_changes", False))
    new_yaml = ckpt.checkpoint_config(cfg)  # as the trainer saves it: without ``logger``
    path = find_resume(cfg.trainer.get("resume"), out_dir, new_yaml, allow)
    own = last_checkpoint(out_dir)
    if path is None and own.is_file():
        raise ResumeError(
            f"{out_dir} already holds a run ({own}); pass trainer.resume=auto to continue it "
            "or choose another hydra.run.dir. Nothing was overwritten.")
    if path is None:
        return None
    state = ckpt.load(path)
    settle_run_length(cfg, state.get("config"), command_line)
    changes = ckpt.check_resume_config(state.get("config"), ckpt.checkpoint_config(cfg), path, allow)
    folder = path.parent.parent if path.parent.name == CKPT_DIR else None
    continues = None
    if folder is not None and folder.resolve() != out_dir.resolve() and read_summary(folder) is None:
        continues = folder
    saved = yaml.safe_load(state.get("config") or "") or {}
    record = {"model": (saved.get("model") or {}).get("name"), "data": (saved.get("data") or {}).get("name"),
              "seed": saved.get("seed")}
    return ResumePlan(path, state, changes, int(state["step"]), continues, record)


def mark_continued(run_dir: Path, by: Path, step: int, record: dict | None = None) -> bool:
    """Write ``run_dir``'s summary.json as continued by ``by`` from checkpoint ``step``, unless it has a
    summary already or a live process holds it. True when written."""
    run_dir = Path(run_dir)
    if read_summary(run_dir) is not None or holder_if_locked(run_dir):
        return False
    write_json(run_dir / "summary.json", {
        **(record or {}), "status": "continued", "continued_by": str(by), "steps": step,
        "checkpoint": str(last_checkpoint(run_dir)), "run_dir": str(run_dir)})
    log.info("%s: summary.json says continued by %s (from its step %d)", run_dir, by, step)
    return True
