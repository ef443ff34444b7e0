"""What a finished (or stopped) run folder gives the tools after training: its weights and its config.

``tools/eval.py`` and ``tools/export.py`` take a run the same way, ``run=<run folder>`` (or a
training checkpoint / weights file; inside a run's ``checkpoints/`` it still belongs to that run):

- the weights: :func:`resolve_weights` (best weights, else the last checkpoint's, EMA when kept);
- the config: the run's ``config.yaml`` (the resolved config it trained with, docs/configuration.md),
  with the command line's explicit overrides on top (:func:`with_run_config`), so ``model=``,
  ``data.root=`` and the rest need not be typed again, and whatever is typed still wins.

The tools' older keys (``checkpoint=`` of eval, ``weights=`` of export) are aliases of ``run=``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from zoo.engine import checkpoint as ckpt

log = logging.getLogger(__name__)

RUN_KEY = "run"
RUN_CONFIG = "config.yaml"   # written by zoo.engine.run.train into every run folder
HYDRA_OVERRIDES = Path(".hydra") / "overrides.yaml"  # the training command line, when Hydra ran it
_SKIPPED_OVERRIDES = ("hydra.", "run=", "checkpoint=", "weights=", "output=")


class RunSourceError(ValueError):
    """``run=`` (or its alias) is unusable; the message starts with the key as typed."""


def run_source(cfg, alias: str | None = None) -> tuple[str, str] | None:
    """``(key as given, value)`` of ``run=`` or its older ``alias``, or None when neither is set."""
    run = cfg.get(RUN_KEY) if RUN_KEY in cfg else None
    old = cfg.get(alias) if alias and alias in cfg else None
    if run and old and str(run) != str(old):
        raise RunSourceError(f"{RUN_KEY}: {run} and {alias}={old} name different things; "
                             f"{alias}= is the older name of {RUN_KEY}=, pass one")
    if run:
        return RUN_KEY, str(run)
    if old:
        return alias, str(old)
    return None


def run_folder_of(source: str | Path) -> Path | None:
    """The run folder ``source`` belongs to (it, or the folder around its ``checkpoints/``), when it
    holds the run's ``config.yaml``; None for a weights file from elsewhere."""
    path = Path(source)
    for folder in (path, path.parent.parent if path.parent.name == ckpt.CKPT_DIR else None):
        if folder is not None and folder.is_dir() and (folder / RUN_CONFIG).is_file():
            return folder
    return None


def value_from_run(key: str, fallback, *sources):
    """``key`` of the first run among ``sources`` (run folders or files in them) that has a
    config.yaml, else ``fallback``: the ``${from_run:...}`` resolver of configs/eval.yaml and export.yaml."""
    for source in sources:
        folder = run_folder_of(source) if source else None
        if folder is not None:
            try:
                value = OmegaConf.select(OmegaConf.load(folder / RUN_CONFIG), str(key))
            except Exception:  # an unreadable config: the error comes later, naming the file
                value = None
            if value is not None:
                return value
    return fallback


def _typed_choice(group: str) -> str | None:
    """``group=<choice>`` as typed on the running Hydra tool's command line (the last one), or None."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return None
        overrides = list(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001  (no Hydra app: nothing was typed)
        return None
    typed = [o.split("=", 1)[1] for o in overrides if o.startswith(f"{group}=")]
    return typed[-1] if typed else None


def evaluated_run_name(fallback, *sources):
    """configs/eval.yaml's folder name: the run's ``run_name``, in the precision it is evaluated in.

    ``tools/eval.py run=<O1 run> amp=fp32`` evaluates in fp32, so its folder says fp32: a run name of
    the default form (``<model>_<data>_<amp>_seed<seed>``, configs/train.yaml) gets the typed amp in
    its amp's place, any other name ``_<amp>`` at its end. Without a run: ``fallback``."""
    name = value_from_run("run_name", None, *sources)
    if name is None:
        return fallback
    amp, trained = _typed_choice("amp"), value_from_run("amp.name", None, *sources)
    if amp is None or amp == trained:
        return name
    model, data, seed = (value_from_run(k, None, *sources) for k in ("model.name", "data.name", "seed"))
    if name == f"{model}_{data}_{trained}_seed{seed}":
        return f"{model}_{data}_{amp}_seed{seed}"
    return f"{name}_{amp}"


def resolve_weights(path: str | Path, key: str = "checkpoint") -> tuple[dict, str]:
    """Model weights from a run folder, a training checkpoint or a weights file, and what was used.

    A run folder gives its best weights (``checkpoints/best.pdparams``) when training kept them,
    else the last checkpoint. A training checkpoint gives its EMA weights when it has them (those
    are what training evaluated), else its model weights.
    """
    path = Path(path)
    if path.is_dir():
        best = ckpt.best_weights(path)
        path = best if best.is_file() else ckpt.last_checkpoint(path)
    if not path.is_file():
        raise ckpt.CheckpointError(f"{key}: nothing to evaluate at {path}")
    state = ckpt.read(path)
    if isinstance(state, dict) and "model" in state and "step" in state:
        if state.get("ema"):
            return state["ema"]["shadow"], f"{path} (EMA weights, step {state['step']})"
        return state["model"], f"{path} (step {state['step']})"
    if not isinstance(state, dict):
        raise ckpt.CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict")
    return state, str(path)


def _leaves(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        out: dict = {}
        for k, v in node.items():
            out.update(_leaves(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def _resolved_leaves(composed: DictConfig, saved: DictConfig) -> dict:
    """Every leaf of ``composed``, resolved; its mandatory values still ``???`` (``data.root`` of
    data=imagenet, not typed this time) taken from the run's saved config, so both compose alike."""
    node = OmegaConf.create(OmegaConf.to_container(composed, resolve=False))
    OmegaConf.set_struct(node, False)
    for key, value in _leaves(OmegaConf.to_container(node, resolve=False)).items():
        if value == "???" and OmegaConf.select(saved, key) is not None:
            OmegaConf.update(node, key, OmegaConf.select(saved, key), merge=False)
    return _leaves(OmegaConf.to_container(node, resolve=True, throw_on_missing=False))


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def _training_overrides(folder: Path, saved: DictConfig, config_dir: Path | None,
                        recorded: bool = True) -> list[str]:
    """The command line the run was trained with: Hydra's record of it (unless ``recorded`` is
    false), else its group choices read off the saved config (model, amp, data names that are
    config files)."""
    recorded = folder / HYDRA_OVERRIDES if recorded else None
    if recorded is not None and recorded.is_file():
        try:
            items = OmegaConf.to_container(OmegaConf.load(recorded))
            return [str(o) for o in items if not str(o).startswith(_SKIPPED_OVERRIDES)]
        except Exception:
            log.warning("%s cannot be read; composing from the saved config's choices", recorded)
    out = []
    for group in ("model", "amp", "data"):
        name = OmegaConf.select(saved, f"{group}.name")
        if name is not None and (config_dir is None or (config_dir / group / f"{name}.yaml").is_file()):
            out.append(f"{group}={name}")
    return out


def with_run_config(cfg: DictConfig, overrides: Sequence[str], compose: Callable[[list[str]], DictConfig],
                    alias: str, config_dir: str | Path | None = None) -> tuple[DictConfig, list[str]]:
    """The config a tool runs with when given a run: the run's saved config, the tool's own keys
    (``export.*``, ``output``, ...), and the command line's explicit ``overrides`` on top.

    ``cfg`` is the tool's config as Hydra composed it (its defaults + ``overrides``); ``compose``
    composes the tool's config with other overrides (``hydra.compose``). What the command line
    changes is measured, not guessed: the tool's config is composed once with the run's own
    training command line and once with this command line on top of it (what it sets replacing the
    run's), and every value that differs is set on the saved config. So a repeated ``model=`` or
    ``data.builder.num_val=48`` changes nothing, ``amp=O1`` brings the O1 group and recipe, and a
    key the run never had is added. Returns the config and the one-line notes for the user.

    Without ``run=`` (or the alias), or for a weights file that belongs to no run folder, ``cfg``
    is returned as it is: everything comes from the command line, as before.
    """
    notes: list[str] = []
    given = run_source(cfg, alias)
    if given is None:
        return cfg, notes
    key, value = given
    if key != RUN_KEY:
        notes.append(f"note: {alias}= is now run= (a run folder, whose config.yaml is read too, or a "
                     f"checkpoint / weights file); {alias}= still works")
    folder = run_folder_of(value)
    if folder is None:
        return cfg, notes
    saved = OmegaConf.load(folder / RUN_CONFIG)
    cli = [str(o) for o in overrides]
    typed = {_key(o) for o in cli}
    config_dir = Path(config_dir) if config_dir else None

    def composed(recorded: bool) -> tuple[DictConfig, DictConfig]:
        trained = _training_overrides(folder, saved, config_dir, recorded)
        return compose(trained), compose([o for o in trained if _key(o) not in typed] + cli)

    try:
        before, after = composed(recorded=True)
    except Exception:  # the run's command line no longer composes (configs changed): its choices only
        before, after = composed(recorded=False)
    old, new = _resolved_leaves(before, saved), _resolved_leaves(after, saved)
    merged = OmegaConf.create(OmegaConf.to_container(saved, resolve=True))
    OmegaConf.set_struct(merged, False)
    for k, v in new.items():  # the tool's own keys (export.*, output, run, ...) and its run_name
        top = k.split(".")[0]
        if top not in saved or top == "run_name":
            OmegaConf.update(merged, k, v, merge=False, force_add=True)
    changed = [k for k in new if k not in old or old[k] != new[k]]
    for k in changed:
        OmegaConf.update(merged, k, new[k], merge=False, force_add=True)
    for k in (k for k in old if k not in new):  # ~key on the command line
        parent, _, leaf = k.rpartition(".")
        node = OmegaConf.select(merged, parent) if parent else merged
        if isinstance(node, DictConfig) and leaf in node:
            del node[leaf]
    merged[RUN_KEY] = value
    if alias in merged:
        merged[alias] = value
    shown = [k for k in changed if k.split(".")[0] in saved and k != "run_name"]
    notes.append(f"config: {folder / RUN_CONFIG}" + (f", with {', '.join(f'{k}={new[k]}' for k in shown[:8])}"
                                                     f"{' ...' if len(shown) > 8 else ''} from the command line"
                                                     if shown else ""))
    return merged, notes
