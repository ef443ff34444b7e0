"""What the deploy check says and writes: one console line per precision, ``deploy_report.json``, a plot
of every op's harm per precision, and the keep-list where each consumer reads it.

The keep-list goes to ``keep_fp32_<precision>.yml`` (Paddle Inference's
``exp_disable_mixed_precision_ops`` list, which replaces Paddle's default black list and so holds
it; TensorRT's ``exp_disable_tensorrt_ops``, which takes op types or output variable names; the
``black_list`` of ``convert_to_mixed_precision``) and, when the model folder has an ``inference.yml``,
into a copy of it beside the report (``inference.<precision>.yml``, a ``DeployCheck`` block added).
The user's model folder is never written to. The converted model itself is not written: Paddle's CPU
build refuses ``convert_to_mixed_precision`` (zoo/export/precision.py says why).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from zoo.export.layers import plot

__all__ = ["REPORT", "verdict_line", "write_outputs"]

REPORT = "deploy_report.json"


def _agreement(step: dict, unit: str, level: float) -> str:
    from zoo.deploy.check import lost_text

    return lost_text(step, unit, level)


def verdict_line(section: dict) -> str:
    """``fp16: equivalent: 0.00 % of 19 FP32 text boxes lost (90% CI [0.00, 0.00]; margin 5 %); ...``"""
    p, unit, level = section["precision"], section["unit"], section["level"]
    first, final = section["without_keep_list"], section["final"]
    head = f"{p}: {section['verdict']}: "
    bad = f"; {first['nonfinite_images']} image(s) met inf/NaN, first at {first['first_nonfinite']}" \
        if first["nonfinite_images"] else ""
    worst = section["worst_ops"][0] if section["worst_ops"] else None
    worst_s = ""
    if worst:
        over = f", {100 * worst['overflow']:.2g} % overflow" if worst["overflow"] else ""
        worst_s = f"; worst op {worst['key']} (rel err {_g(worst['rel_err'])}, max|x| {worst['max_abs']:.3g}{over})"
    margin = f"margin {section['margin_pct']:g} %" + (f" ({section['note']})" if section.get("note") else "")
    if section["verdict"] == "nothing to compare":
        return f"{p}: nothing to compare (the FP32 model finds no {unit} on any image)"
    if section["verdict"] == "equivalent":
        return head + _agreement(first, unit, level) + f"; {margin}; keep fp32: nothing" + worst_s
    without = f"without a keep-list {_agreement(first, unit, level)}{bad} -> {first['verdict']}"
    if section["keep_fp32"] is None:
        return head + without + f"; no keep-list of at most the searched size is equivalent ({margin})" + worst_s
    named = f" (named: {section['keep_fp32_named']})" if section.get("keep_fp32_named") else ""
    return (head + without + f"; keep fp32 {section['keep_fp32']}{named}: {_agreement(final, unit, level)}, "
            f"{100 * final['fp32_share']:.0f} % of compute fp32; {margin}"
            + (f"; warning: {section['fp32_share_warning']}" if section.get("fp32_share_warning") else ""))


def _g(x) -> str:
    return "inf" if isinstance(x, float) and math.isinf(x) else f"{x:.2g}"


def _clean(obj):
    """JSON-safe: inf / NaN as strings; numpy scalars as Python numbers."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return _clean(obj.item())
    return obj


def _consumers(section: dict) -> dict:
    from zoo.export.checked_export import consumer_notes

    black = section["consumer_black_list"] or []
    notes = consumer_notes(section["precision"], black)
    trt = section["tensorrt_disable_ops"]
    notes["tensorrt_disable_ops"] = (f"config.exp_disable_tensorrt_ops({trt!r})  # Paddle Inference with TensorRT: "
                                     "op types or output variable names kept out of the TensorRT engine")
    return notes


def write_outputs(report: dict, out_dir: Path, model_dir: Path) -> Path:
    """Write everything (module docstring) into ``out_dir``; returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for p, section in report["precisions"].items():  # the check on the user's images (zoo/deploy/check.py)
        rows = section.pop("_rows", None)
        if rows:
            name = f"deploy_{p}.png"
            plot(rows, out_dir / name, f"{report['model_dir']}: {p} without a keep-list")
            section["plot"] = name
        if section["keep_fp32"] is None:
            continue
        section["consumers"] = _consumers(section)
        keep = {"precision": p, "verdict": section["verdict"], "keep_fp32_ops": section["keep_fp32"],
                "keep_fp32_named_ops": section.get("keep_fp32_named") or [],
                "paddle_inference_black_list": section["consumer_black_list"],
                "tensorrt_disable_ops": section["tensorrt_disable_ops"], "how": section["consumers"],
                "report": REPORT}
        (out_dir / f"keep_fp32_{p}.yml").write_text(
            "# Written by ampzoo's deploy check (tools/deploy_check.py); deploy_report.json says on what.\n"
            + yaml.safe_dump(_clean(keep), sort_keys=False, allow_unicode=True), encoding="utf-8")
        yml = Path(model_dir) / "inference.yml"
        if yml.is_file():
            data = yaml.safe_load(yml.read_text(encoding="utf-8")) or {}
            data["DeployCheck"] = {k: keep[k] for k in ("precision", "verdict", "keep_fp32_ops",
                                                         "paddle_inference_black_list", "tensorrt_disable_ops")}
            (out_dir / f"inference.{p}.yml").write_text(
                yaml.safe_dump(_clean(data), sort_keys=False, allow_unicode=True), encoding="utf-8")
    for p, section in report.get("labelled", {}).items():
        rows = section.pop("_rows", None)
        if rows:
            name = f"deploy_{p}_labelled.png"
            plot(rows[0], out_dir / name, f"{report['model_dir']}: {p} on labelled data, without a keep-list")
            section.setdefault("layers", {})["plot"] = name
    path = out_dir / REPORT
    path.write_text(json.dumps(_clean(report), indent=2) + "\n", encoding="utf-8")
    return path
