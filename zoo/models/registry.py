"""A small timm-style model registry.

Model constructors register themselves with :func:`register_model`; users build
them by name with :func:`create_model`, optionally loading weights: a local file,
or a URL or registry name that the weights registry (``zoo.weights``) downloads
and :mod:`zoo.weights.loading` loads.
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Callable

import paddle

from zoo.weights.hub import DownloadError
from zoo.weights.loading import load_checkpoint, load_record, resolve_checkpoint_path

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


def create_model(name: str, pretrained=None, strict: bool | None = None, pretrained_fallback=None,
                 **overrides) -> paddle.nn.Layer:
    """Build the registered model ``name`` with ``overrides`` as constructor kwargs.

    ``pretrained`` is ``None`` (or ``False``) for random initialisation, a local weights file, an
    http(s) URL or a name from ``zoo.weights.list_weights()`` (downloaded into the cache and
    verified). ``strict=True`` fails with a ``ValueError`` listing missing, unexpected and
    shape-mismatched keys; the default (``None``) fails when under half the keys match, ``False``
    loads whatever matches. The load report is kept as ``model.pretrained_report`` (file, sha256,
    matched/missing/unexpected/shape_mismatch counts). Unknown names raise :class:`UnknownModelError`; a missing file raises
    ``FileNotFoundError``.

    ``pretrained_fallback``: weights to start from instead when ``pretrained`` cannot be downloaded
    (:class:`zoo.weights.hub.DownloadError`: no network, an HTTP error); never for any other failure
    (a wrong checksum, a missing file). The switch is a warning naming both and the reason, and the
    load report keeps ``requested`` and ``fallback_reason``, so summary.json says what a run started from.
    """
    if name not in _MODEL_REGISTRY:
        raise UnknownModelError(
            f"unknown model '{name}'; known: {', '.join(list_models())}"
        )
    # Validate (and fetch) the checkpoint before paying for model construction.
    path = spec = None
    fell_back = None
    if pretrained is not None and pretrained is not False:
        try:
            path, spec = resolve_checkpoint_path(pretrained)
        except DownloadError as err:
            if pretrained_fallback is None or pretrained_fallback is False:
                raise
            fell_back = {"requested": str(pretrained), "fallback_reason": str(err)}
            logger.warning("pretrained=%s could not be downloaded (%s); starting from pretrained_fallback=%s "
                           "instead (pretrained_fallback=null makes a failed download an error)",
                           pretrained, err, pretrained_fallback)
            path, spec = resolve_checkpoint_path(pretrained_fallback)
        if spec is not None and spec.model != name:
            logger.warning("pretrained=%s is made for model '%s', loading it into '%s'", spec.name, spec.model, name)
    model = _MODEL_REGISTRY[name](**overrides)
    model.pretrained_report = None
    if path is not None:
        report = load_checkpoint(model, path, strict=strict, key_adapter=spec.key_adapter if spec else None,
                                 member=spec.member if spec else None)
        model.pretrained_report = {**load_record(path, report), **(fell_back or {})}
    return model
