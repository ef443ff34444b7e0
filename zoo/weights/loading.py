"""Loading weights into a model: compare state dicts, read weight files safely, report what fitted.

:func:`load_checkpoint` reads ``.pdparams`` / ``.safetensors`` / PaddleOCR ``*_train.tar`` files
(pickles through :func:`zoo.weights.safe_load`, never ``paddle.load``), adapts key prefixes, casts
float dtypes and loads what matches; the model registry (``zoo.models``) calls it for
``create_model(..., pretrained=...)``, the engine for ``check_fits``.
"""
from __future__ import annotations

import logging
import os
import tarfile
import warnings

import paddle

from zoo.weights.deploy_form import is_inference_params, load_deploy_form
from zoo.weights.hub import resolve, sha256_file
from zoo.weights.safe_pickle import load as safe_load
from zoo.weights.safetensors import load_file

logger = logging.getLogger(__name__)

__all__ = ["MIN_MATCHED_SHARE", "compare_state_dict", "format_report", "load_checkpoint", "load_record",
           "read_state", "resolve_checkpoint_path"]


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


def format_report(report: dict, limit: int = 5) -> str:
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


def resolve_checkpoint_path(pretrained):
    """Turn ``pretrained`` (path, http(s) URL or weights name) into a local file and its registry entry.

    URLs and names are downloaded into the cache by :func:`zoo.weights.resolve`.
    """
    if pretrained is True:
        raise ValueError("pretrained=True: name the weights (zoo.weights.list_weights()), or give a path or URL")
    if not isinstance(pretrained, (str, os.PathLike)):
        raise TypeError(f"pretrained must be None, a path, a URL or a weights name, got {type(pretrained).__name__}")
    path, spec = resolve(pretrained)
    return str(path), spec


def _check_tar_members(path: str, tar: tarfile.TarFile) -> None:
    """Refuse archives whose member names or link targets would leave the archive's folder."""
    for m in tar.getmembers():
        names = [m.name] + ([m.linkname] if m.issym() or m.islnk() else [])
        for name in names:
            parts = name.replace("\\", "/").split("/")
            if name.startswith(("/", "\\")) or ".." in parts or (parts and parts[0].endswith(":")):
                raise ValueError(f"{path}: refusing tar member '{m.name}'"
                                 + (f" -> '{name}'" if name != m.name else "")
                                 + ": absolute or '..' paths are not allowed in weight archives")


def _read_tar_state(path: str, member: str | None) -> dict:
    with tarfile.open(path) as tar:
        _check_tar_members(path, tar)
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".pdparams")]
        if member is not None:
            chosen = [m for m in members if m.name == member]
            if not chosen:
                raise ValueError(f"{path}: no member '{member}' inside; .pdparams members: {[m.name for m in members]}")
        else:
            chosen = [m for m in members if m.name.endswith("best_accuracy.pdparams")] or members
        if len(chosen) != 1:
            raise ValueError(f"{path}: expected one best_accuracy.pdparams (or a single .pdparams) "
                             f"inside, found {[m.name for m in members]}")
        return safe_load(tar.extractfile(chosen[0]).read(), name=f"{path}:{chosen[0].name}")


def read_state(path: str, member: str | None = None) -> dict:
    """State dict of a ``.pdparams`` / ``.safetensors`` file, or of the one inside a PaddleOCR ``*_train.tar``.

    Pickles are read by :func:`zoo.weights.safe_load` (plain data only, never ``paddle.load``). A tar
    is read member by member in memory (nothing is extracted), after refusing absolute or ``..``
    member names; ``member`` picks the weights inside, else ``best_accuracy.pdparams`` or the only
    ``.pdparams``. Safetensors values are NumPy arrays.
    """
    path = os.fspath(path)
    if path.endswith(".safetensors"):
        state = load_file(path)
    elif tarfile.is_tarfile(path):
        state = _read_tar_state(path, member)
    else:
        state = safe_load(path)
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


def _rename_prefixes(state: dict, renames: dict) -> dict:
    """Replace a key's leading ``old.`` by ``new.`` (``renames`` = {old: new}, whole dotted segments only)."""
    out = {}
    for k, v in state.items():
        for old, new in renames.items():
            if k.startswith(old + "."):
                k = new + k[len(old):]
                break
        out[k] = v
    return out


def _apply_adapter(ckpt_state: dict, adapter: dict) -> tuple[dict, str | None]:
    """A registry ``key_adapter``: drop the listed keys, rename leading segments (``rename_prefix``),
    then add ``add_prefix`` to keys lacking it."""
    drop = set(adapter.get("drop") or ())
    state = {k: v for k, v in ckpt_state.items() if k not in drop}
    if adapter.get("rename_prefix"):
        state = _rename_prefixes(state, adapter["rename_prefix"])
    prefix = adapter.get("add_prefix")
    if prefix:
        state = {k if k.startswith(prefix) else prefix + k: v for k, v in state.items()}
    return state, prefix


def _cast_floats(model_state: dict, ckpt_state: dict) -> dict:
    """Cast float entries whose dtype differs from the model's (fp16 files into fp32 models), as PaddleOCR does."""
    out = dict(ckpt_state)
    for k, v in ckpt_state.items():
        target = model_state.get(k)
        if target is None or not paddle.is_floating_point(target):
            continue
        want = str(target.dtype).split(".")[-1]
        have = str(v.dtype).split(".")[-1]
        if have != want and have.startswith(("float", "bfloat")):
            out[k] = (v if isinstance(v, paddle.Tensor) else paddle.to_tensor(v)).astype(target.dtype)
    return out


# ``strict=None`` (the default) fails when fewer than this share of the keys could match: another
# model's weights or a training checkpoint passed as ``pretrained`` would otherwise "load" with
# matched=0 and train from random initialisation, with only a warning in the log.
MIN_MATCHED_SHARE = 0.5


def _check_enough_matched(path: str, model, model_state: dict, ckpt_state: dict, report: dict) -> None:
    possible = min(len(model_state), len(ckpt_state))
    if possible and len(report["matched"]) >= MIN_MATCHED_SHARE * possible:
        return
    hint = ""
    if isinstance(ckpt_state.get("model"), dict) and "step" in ckpt_state:
        hint = " It is a training checkpoint: continue it with trainer.resume=PATH instead."
    expected, found = sorted(model_state)[:3], sorted(ckpt_state)[:3]
    raise ValueError(
        f"pretrained weights '{path}' do not fit {type(model).__name__}: {len(report['matched'])} of "
        f"{len(model_state)} parameters match (model expects e.g. {expected}, the file has e.g. {found}; "
        f"{format_report(report, limit=3)}).{hint} Pass strict=false (model.net.strict=false) to load "
        "the matching keys anyway.")


def load_checkpoint(model: paddle.nn.Layer, path: str, strict: bool | None = None, key_adapter: dict | None = None,
                    member: str | None = None) -> dict:
    """Load a local weights file (``.pdparams``, ``.safetensors``, PaddleOCR ``*_train.tar``) into ``model``.

    An inference model's ``.pdiparams`` (the deploy form PaddleOCR exports) switches ``model`` to its
    deploy form and loads it by order of use (:func:`zoo.weights.deploy_form.load_deploy_form`): it
    maps completely or is refused, so ``strict``, ``key_adapter`` and ``member`` do not apply.

    Returns the report of :func:`compare_state_dict`. ``key_adapter`` (a registry entry's) renames
    keys; without it a backbone-only checkpoint gets the ``backbone.`` prefix its keys lack.
    ``strict=True`` raises ``ValueError`` listing missing, unexpected and shape-mismatched keys
    instead of loading; ``strict=None`` (default) raises when fewer than half the keys that could
    match do (:data:`MIN_MATCHED_SHARE` of the smaller of the two key sets, so a backbone-only file
    passes); ``strict=False`` loads whatever matches. Shape-mismatched entries are dropped before
    ``set_state_dict``, so those parameters keep their initial values.
    """
    if is_inference_params(path):
        report = load_deploy_form(model, path)
        # Missing keys are expected here (layers the eval-mode forward never calls): info, not a warning.
        logger.info("loaded deploy-form '%s' by order of use: %s", path, format_report(report))
        return report
    model_state = model.state_dict()
    ckpt_state = read_state(path, member)
    if key_adapter:
        ckpt_state, prefix = _apply_adapter(ckpt_state, key_adapter)
    else:
        ckpt_state, prefix = _adapt_prefix(model_state, ckpt_state)
    if prefix:
        logger.info("'%s' holds a backbone only: loading its keys under '%s'", path, prefix)
    report = compare_state_dict(model_state, ckpt_state)
    clean = not (report["missing"] or report["unexpected"] or report["shape_mismatch"])
    if strict and not clean:
        raise ValueError(f"strict loading of '{path}' into {type(model).__name__} failed: "
                         f"{format_report(report, limit=20)}")
    if strict is None:
        _check_enough_matched(path, model, model_state, ckpt_state, report)
    bad = set(report["shape_mismatch"]) | set(report["unexpected"])
    with warnings.catch_warnings():
        # Paddle warns per skipped key; the report below already says it once.
        warnings.filterwarnings("ignore", message="Skip loading for")
        model.set_state_dict(_cast_floats(model_state, {k: v for k, v in ckpt_state.items() if k not in bad}))
    level = logging.INFO if clean else logging.WARNING
    logger.log(level, "loaded '%s': %s", path, format_report(report))
    return report


def load_record(path: str, report: dict) -> dict:
    """What summary.json says about the pretrained weights a model started from."""
    return {"file": str(path), "sha256": sha256_file(path),
            **{k: len(v) for k, v in report.items()},
            "missing_keys": report["missing"][:20], "unexpected_keys": report["unexpected"][:20],
            "shape_mismatch_keys": report["shape_mismatch"][:20]}
