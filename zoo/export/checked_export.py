"""The precision check inside ``tools/export.py``: settings from the config, the deployment to check,
and the files it leaves: ``precision_report.json``, ``precision_layers.png`` and a block in the
client yml that says how to load the export in fp16 / bf16 with its keep-list."""
from __future__ import annotations

import json
import math
from pathlib import Path

import paddle
from omegaconf import OmegaConf

from zoo.engine.run import build
from zoo.engine.runinfo import git_revision
from zoo.export.common import PRECISION_PLOT, PRECISION_REPORT, ExportError
from zoo.export.layers import plot
from zoo.export.precision import PRECISIONS
from zoo.export.precision_check import CheckSettings, Deployment, PrecisionRefused, check_precision_export

__all__ = ["CHECK_FILES", "PLOT", "REPORT", "YML_KEY", "check_mode", "consumer_notes", "more_images_key",
           "run_precision_check", "skipped_report", "write_report", "yml_block"]

REPORT, PLOT = PRECISION_REPORT, PRECISION_PLOT
CHECK_FILES = (REPORT, PLOT)
YML_KEY = "ampzoo_precision"  # clients ignore it; it says what to pass them


def check_mode(value) -> bool:
    """``export.guard``: on (true) or off (false)."""
    text = str(value).lower()
    if text not in ("on", "off", "true", "false"):
        raise ExportError(f"export.guard: expected on or off, got {value!r}")
    return text in ("on", "true")


def _settings(cfg) -> CheckSettings:
    node = cfg.export.get("check") or {}
    raw = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    known = set(CheckSettings.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ExportError(f"export.check: unknown keys {unknown}; known: {sorted(known)}")
    return CheckSettings(**raw)


def _deployment(cfg, model, task) -> Deployment:
    """The network the task says the check evaluates, fresh tasks, and the validation split of ``data=``."""
    data = build(cfg.data.builder, "data.builder")
    val_set = data.build("val", cfg.seed)
    net = task.checked_module(model)
    net.eval()
    return Deployment(net, lambda: build(cfg.model.task, "model.task"), val_set,
                      int(cfg.model.eval_batch_size), float(cfg.export.get("draw_threshold", 0.5)),
                      more_images_key(cfg))


# The key that sizes the validation split (the embedded generated sets), else the one naming its file.
_VAL_KEYS = ("num_val", "val_list", "val_label", "val_ann")


def more_images_key(cfg) -> str | None:
    """The ``data.builder`` key a resolution note names for checking on more images, or None."""
    builder = cfg.data.get("builder") or {}
    return next((f"data.builder.{k}" for k in _VAL_KEYS if k in builder), None)


def consumer_notes(precision: str, black_list: list[str]) -> dict:
    """How each client loads this export in ``precision`` with the keep-list (its op names)."""
    half = "Half" if precision == "fp16" else "Bfloat16"
    ops = "{" + ", ".join(repr(o) for o in black_list) + "}"
    return {
        "paddle_inference": (f"config.enable_use_gpu(256, 0, paddle.inference.PrecisionType.{half}); "
                             f"config.exp_disable_mixed_precision_ops({ops})  # replaces Paddle's default list, "
                             "which is included"),
        "tensorrt": (f"paddle.tensorrt.convert(model_path, TensorRTConfig(inputs=..., precision_mode="
                     f"PrecisionMode.{'FP16' if precision == 'fp16' else 'BF16'}, "
                     f"ops_run_float={{{', '.join(repr('pd_op.' + o) for o in black_list)}}}))"),
        "convert_to_mixed_precision": (f"paddle.inference.convert_to_mixed_precision(..., black_list={ops}) "
                                       "(old .pdmodel programs only; Paddle 3 writes .json)"),
        "paddlex": ("run_mode='paddle_fp16' black-lists only feed and fetch: it does not apply this keep-list "
                    "or Paddle's default list, so its numerics are not the ones checked here"),
    }


def yml_block(report: dict) -> dict:
    """What the client yml records of the precision check (no client reads it; it says what to pass)."""
    return {"precision": report["precision"], "verdict": report["verdict"],
            "keep_fp32_ops": report.get("keep_fp32") or [],
            "paddle_inference_black_list": report.get("consumer_black_list") or [],
            "stored_weights": report.get("stored_weights", "float32"), "report": REPORT}


def skipped_report(precision: str) -> dict:
    """``export.guard=off``: the report says no check was made."""
    return {"precision": precision, "dtype": PRECISIONS[precision], "guard": "off",
            "verdict": "not checked (export.guard=off)", "keep_fp32": None, "consumer_black_list": None,
            "paddle": paddle.__version__, "git_revision": git_revision()}


def _clean(obj):
    """JSON-safe: inf and NaN as strings (json.dumps would write invalid JSON)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_report(report: dict, folder: Path) -> Path:
    """``precision_report.json`` and, when layers were recorded, ``precision_layers.png`` in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = report.pop("_rows", None)
    if rows:
        before, after = rows
        plot(before, folder / PLOT, f"{report['precision']} without a keep-list")
        report.setdefault("layers", {})["plot"] = PLOT
    path = folder / REPORT
    path.write_text(json.dumps(_clean(report), indent=2) + "\n", encoding="utf-8")
    return path


def run_precision_check(cfg, model, task, precision: str, refused_dir: Path, log=print) -> dict:
    """The check for ``export.precision=precision`` of ``model`` as ``task`` (built from
    ``cfg.model.task``) deploys it; on refusal the report goes to ``refused_dir`` and
    :class:`PrecisionRefused` names it."""
    settings = _settings(cfg)
    dep = _deployment(cfg, model, task)
    try:
        report = check_precision_export(dep, precision, PRECISIONS[precision], settings, log)
    except PrecisionRefused as refused:
        refused.report.update(git_revision=git_revision(),
                              consumers=consumer_notes(precision, refused.report["consumer_black_list"]))
        path = write_report(refused.report, refused_dir)
        raise PrecisionRefused(f"{refused}; report: {path}", refused.report) from None
    report.update(git_revision=git_revision(), consumers=consumer_notes(precision, report["consumer_black_list"]))
    return report
