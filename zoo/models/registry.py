"""A small timm-style model registry.

Model constructors register themselves with :func:`register_model`; users build
them by name with :func:`create_model`, optionally loading a local ``.pdparams``
checkpoint. Downloading published weights by name or URL belongs to the weights
registry (``zoo.weights``), not to this module.
"""

from __future__ import annotations

import fnmatch
import io
import logging
import os
import tarfile
import warnings
from typing import Callable

import paddle

logger = logging.getLogger(__name__)

# name -> constructor; module-level so every import sees one shared registry.
_MODEL_REGISTRY: dict[str, Callable[..., paddle.nn.Layer]] = {}


class UnknownModelError(ValueError):
    """Raised by :func:`create_model` for a name that nobody registered."""


def register_model(fn: Callable[..., paddle.nn.Layer]) -> Callable[..., paddle.nn.Layer]:
    """Register ``fn`` under ``fn.__name__`` and return it unchanged.

    ``fn(**kwargs)`` must return a ``paddle.nn.Layer``. Registering a second
    constructor under an existing name raises ``ValueError`` rather than
    silently shadowing the first one.
    """
    name = fn.__name__
    if name in _MODEL_REGISTRY:
        raise ValueError(f"model '{name}' is already registered")
    _MODEL_REGISTRY[name] = fn
    return fn


def list_models(pattern: str | None = None) -> list[str]:
    """Return the sorted registered model names, filtered by an fnmatch ``pattern``."""
    names = sorted(_MODEL_REGISTRY)
    if pattern is not None:
        names = fnmatch.filter(names, pattern)
    return names


def _shape(value) -> tuple[int, ...]:
    # Works for paddle Tensors, numpy arrays and anything else exposing .shape.
    return tuple(int(d) for d in value.shape)


def compare_state_dict(model_state: dict, ckpt_state: dict) -> dict:
    """Compare a model's state dict with a checkpoint's, key by key.

    Returns a dict of sorted key lists:

    - ``matched``: in both, same shape;
    - ``missing``: in the model only;
    - ``unexpected``: in the checkpoint only;
    - ``shape_mismatch``: in both, different shapes.
    """
    model_keys, ckpt_keys = set(model_state), set(ckpt_state)
    common = model_keys & ckpt_keys
    mismatch = {k for k in common if _shape(model_state[k]) != _shape(ckpt_state[k])}
    return {
        "matched": sorted(common - mismatch),
        "missing": sorted(model_keys - ckpt_keys),
        "unexpected": sorted(ckpt_keys - model_keys),
        "shape_mismatch": sorted(mismatch),
    }


def _format_report(report: dict, limit: int = 5) -> str:
    """One line: counts per category, plus the first few offending keys."""
    parts = []
    for category in ("matched", "missing", "unexpected", "shape_mismatch"):
        keys = report[category]
        text = f"{category}={len(keys)}"
        if keys and category != "matched":
            shown = ", ".join(keys[:limit]) + (", ..." if len(keys) > limit else "")
            text += f" [{shown}]"
        parts.append(text)
    return "; ".join(parts)


_WEIGHTS_REGISTRY_HINT = (
    "pretrained={!r}: downloading pretrained weights by name or URL is handled by "
    "the weights registry (zoo.weights, not yet available); for now pass a path "
    "to a local .pdparams file"
)


def _resolve_checkpoint_path(pretrained) -> str:
    """Turn ``pretrained`` into an existing local file path, or raise.

    Strings that look like a URL or a bare weight name are refused with a
    pointer to the weights registry; anything path-like must exist.
    """
    if pretrained is True:
        raise ValueError(_WEIGHTS_REGISTRY_HINT.format(pretrained))
    if not isinstance(pretrained, (str, os.PathLike)):
        raise TypeError(
            f"pretrained must be None or a path to a local .pdparams file, "
            f"got {type(pretrained).__name__}"
        )
    path = os.fspath(pretrained)
    if os.path.isfile(path):
        return path
    looks_like_url = "://" in path
    looks_like_path = path.endswith(".pdparams") or any(
        sep in path for sep in (os.sep, os.altsep) if sep
    )
    if looks_like_url or not looks_like_path:
        raise ValueError(_WEIGHTS_REGISTRY_HINT.format(pretrained))
    raise FileNotFoundError(f"pretrained checkpoint not found: '{path}'")


def read_state(path: str) -> dict:
    """State dict of a ``.pdparams`` file, or of the one inside a PaddleOCR ``*_train.tar``.

    A tar is read member by member in memory (nothing is extracted to disk, so member paths
    cannot escape anywhere); ``best_accuracy.pdparams`` is preferred, else the only ``.pdparams``.
    """
    if tarfile.is_tarfile(path):
        with tarfile.open(path) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".pdparams")]
            best = [m for m in members if m.name.endswith("best_accuracy.pdparams")]
            chosen = best or members
            if len(chosen) != 1:
                raise ValueError(f"{path}: expected one best_accuracy.pdparams (or a single .pdparams) "
                                 f"inside, found {[m.name for m in members]}")
            state = paddle.load(io.BytesIO(tar.extractfile(chosen[0]).read()))
    else:
        state = paddle.load(path)
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint '{path}' does not hold a state dict")
    return state


def _adapt_prefix(model_state: dict, ckpt_state: dict) -> tuple[dict, str | None]:
    """Add ``backbone.`` to a backbone-only checkpoint's keys (PaddleOCR's pretrained backbones)."""
    if not ckpt_state or any(k in model_state for k in ckpt_state):
        return ckpt_state, None
    prefixed = {f"backbone.{k}": v for k, v in ckpt_state.items()}
    if sum(k in model_state for k in prefixed) >= len(prefixed) / 2:
        return prefixed, "backbone."
    return ckpt_state, None


def load_checkpoint(model: paddle.nn.Layer, path: str) -> dict:
    """Load a local ``.pdparams`` file (or PaddleOCR ``*_train.tar``) into ``model``; return the report.

    A backbone-only checkpoint gets the ``backbone.`` prefix its keys lack. Shape-mismatched
    entries are dropped before ``set_state_dict`` so those parameters keep their initial values
    instead of depending on Paddle's own mismatch handling.
    """
    ckpt_state, prefix = _adapt_prefix(model.state_dict(), read_state(path))
    if prefix:
        logger.info("'%s' holds a backbone only: loading its keys under '%s'", path, prefix)
    report = compare_state_dict(model.state_dict(), ckpt_state)
    bad = set(report["shape_mismatch"]) | set(report["unexpected"])
    with warnings.catch_warnings():
        # Paddle warns per skipped key; the report below already says it once.
        warnings.filterwarnings("ignore", message="Skip loading for")
        model.set_state_dict({k: v for k, v in ckpt_state.items() if k not in bad})
    clean = not (report["missing"] or report["unexpected"] or report["shape_mismatch"])
    level = logging.INFO if clean else logging.WARNING
    logger.log(level, "loaded '%s': %s", path, _format_report(report))
    return report


def create_model(name: str, pretrained=None, **overrides) -> paddle.nn.Layer:
    """Build the registered model ``name`` with ``overrides`` as constructor kwargs.

    ``pretrained`` is ``None`` (or ``False``) for random initialisation, or the
    path of a local ``.pdparams`` file to load. Unknown names raise
    :class:`UnknownModelError`; a missing file raises ``FileNotFoundError``.
    """
    if name not in _MODEL_REGISTRY:
        raise UnknownModelError(
            f"unknown model '{name}'; known: {', '.join(list_models())}"
        )
    # Validate the checkpoint argument before paying for model construction.
    path = None
    if pretrained is not None and pretrained is not False:
        path = _resolve_checkpoint_path(pretrained)
    model = _MODEL_REGISTRY[name](**overrides)
    if path is not None:
        load_checkpoint(model, path)
    return model
