"""What the precision check says: ``precision_report.json``'s content, the refusal line, the summary in
``export.json`` and the console lines of ``tools/export.py``.

Every one of them names, besides the verdict, what a reader needs to trust it: the margin used and
why it was widened (zoo/export/resolution.py), the images with non-finite outputs and the layer
where the format first overflows (with the share of images it did so on), how much of the compute
the keep-list leaves fp32 (zoo/export/compute.py), and which images the per-layer scan skipped.
"""
from __future__ import annotations

from dataclasses import asdict

import paddle

from zoo.export.compute import DEFINITION, share_warning
from zoo.export.deployed import VERSION, consumer_black_list
from zoo.export.layers import first_nonfinite, first_overflow, harm

__all__ = ["build_report", "check_lines", "check_summary", "refusal"]

_STEP_KEYS = ("keep", "delta_pp", "ci_pp", "metric_verdict", "verdict", "fp32_share")


def _step(result: dict) -> dict:
    return {**{k: result[k] for k in _STEP_KEYS}, "nonfinite_images": result["nonfinite"]["nonfinite_images"]}


def _where(row: dict | None, nonfinite: dict) -> dict | None:
    """The first overflowing op call, with the share of images whose outputs it made non-finite (its
    own count when its output is per image, else the evaluation's)."""
    if row is None:
        return None
    own = row["images"] > 0
    bad, images = (row["nonfinite_images"], row["images"]) if own else \
        (nonfinite["nonfinite_images"], nonfinite["images"])
    return {"key": row["key"], "layer_type": row["layer_type"], "overflow": row["overflow"],
            "nonfinite_images": bad, "images": images, "image_share": bad / images if images else 0.0}


def _scan(rec, n_images: int, cap) -> dict:
    note = None
    if rec.skipped_forwards:
        note = (f"the per-layer scan recorded {rec.images} of {n_images} images (the first {rec.forwards} "
                f"batch{'es' if rec.forwards != 1 else ''}; export.check.layer_batches={cap}): an overflow on the other {rec.skipped_images} is "
                "counted by the verdict but not located op by op")
    return {"images": rec.images, "images_total": n_images, "batches": rec.forwards,
            "skipped_batches": rec.skipped_forwards, "skipped_images": rec.skipped_images, "note": note}


def build_report(*, precision, dtype, metric, rule, settings, ref_metrics, tried, final, keep, cands, rows,
                 final_rows, scan, n_images, n_folded, seconds) -> dict:
    """``precision_report.json`` (``_rows`` is for the plot and dropped before writing)."""
    first = tried[0]  # the deployment without a keep-list
    where = first_overflow(rows)
    worst = first_nonfinite(rows) or where or (sorted(rows, key=harm)[0] if rows else None)
    warn = share_warning(final["fp32_share"], keep or (), precision, settings.warn_fp32_share)
    report = {
        "precision": precision, "dtype": dtype, "guard": "on",
        "verdict": "equivalent" if keep is not None else "refused",
        "metric": metric, "margin_pp": rule["margin_pp"], "margin_requested_pp": rule["requested_pp"],
        "level": settings.level,
        "resolution": {k: rule[k] for k in ("unit_pp", "unit", "q", "widened", "note")},
        "fp32": ref_metrics, "deployed": final["metrics"], "delta_pp": final["delta_pp"], "ci_pp": final["ci_pp"],
        "metric_verdict": final["metric_verdict"], "n_images": final["n_images"],
        "n_resamples": final["n_resamples"], "agreement": final["agreement"], "nonfinite": final["nonfinite"],
        "without_keep_list": {**{k: first[k] for k in ("delta_pp", "ci_pp", "verdict", "metric_verdict",
                                                       "agreement", "nonfinite", "fp32_share")},
                              "first_overflow": _where(where, first["nonfinite"])},
        "keep_fp32": list(keep) if keep is not None else None,
        "consumer_black_list": consumer_black_list(keep or ()),
        "compute": {"definition": DEFINITION, "fp32_share": final["fp32_share"],
                    "fp32_share_without_keep_list": first["fp32_share"], "fp32_ops": final["compute"]["fp32_ops"],
                    "warning": warn},
        "candidates": cands[:settings.max_keep], "search": [_step(r) for r in tried],
        "layers": {**_scan(scan, n_images, settings.layer_batches), "op_calls": len(rows),
                   "batchnorms_folded": n_folded,
                   "first_nonfinite": first_nonfinite(rows)["key"] if first_nonfinite(rows) else None,
                   "worst": worst["key"] if worst else None, "worst_layer": _where(worst, first["nonfinite"]),
                   "without_keep_list": sorted(rows, key=harm)[:settings.top],
                   "with_keep_list": sorted(final_rows, key=harm)[:settings.top]},
        "emulation": {"rule": "Paddle Inference mixed precision (zoo/export/deployed.py)", "version": VERSION,
                      "paddle": paddle.__version__},
        "settings": asdict(settings), "time_s": round(seconds, 1),
        "resolution_note": rule["note"],
    }
    report["_rows"] = (rows, final_rows)
    return report


def _margin(report: dict) -> str:
    text = f"margin ±{report['margin_pp']:.3g}"
    if report.get("margin_requested_pp") is not None and report["margin_pp"] > report["margin_requested_pp"]:
        text += f" (widened from ±{report['margin_requested_pp']:g}: {report['resolution']['unit']} = " \
                f"{report['resolution']['unit_pp']:.2g} pp)"
    return text


def _images(where: dict) -> str:
    return f"non-finite on {where['nonfinite_images']} of {where['images']} images ({100 * where['image_share']:.0f} %)"


def refusal(report: dict) -> str:
    """The one-line reason of a refusal (``error: ...`` on the console)."""
    first, s = report["without_keep_list"], report["settings"]
    bad = first["nonfinite"]
    worst = report["layers"]["worst_layer"]
    where = ""
    if worst:
        kind = ", first non-finite output" if worst["nonfinite_images"] and worst["key"] == \
            report["layers"]["first_nonfinite"] else ""
        where = f"; worst layer {worst['key']} ({worst['layer_type']}{kind}"
        where += f", {_images(worst)})" if worst["nonfinite_images"] else ")"
    nonfinite = f"; non-finite outputs on {bad['nonfinite_images']} of {bad['images']} images" \
        if bad["nonfinite_images"] else ""
    return (f"export.precision={report['precision']}: {first['verdict']} against FP32 ({report['metric']} "
            f"{first['delta_pp']:+.2f} pp, {100 * report['level']:.0f}% CI [{first['ci_pp'][0]:+.2f}, "
            f"{first['ci_pp'][1]:+.2f}], {_margin(report)}{nonfinite}) and no keep-list of up to "
            f"{s['max_keep']} ops within {s['max_evaluations']} evaluations makes it equivalent{where}")


def check_summary(report: dict | None) -> dict | None:
    """``precision_check`` in export.json: the verdict and what the console line needs."""
    if report is None:
        return None
    keys = ("guard", "verdict", "metric", "delta_pp", "ci_pp", "level", "margin_pp", "margin_requested_pp",
            "resolution", "keep_fp32", "consumer_black_list")
    out = {k: report.get(k) for k in keys}
    if report.get("guard") == "on":
        out.update(fp32_share=report["compute"]["fp32_share"], compute_warning=report["compute"]["warning"],
                   first_overflow=report["without_keep_list"]["first_overflow"],
                   nonfinite_without_keep_list=report["without_keep_list"]["nonfinite"]["nonfinite_images"],
                   scan_note=report["layers"]["note"])
    return out


def check_lines(check: dict | None) -> list[str]:
    """The console lines of an export's ``precision_check`` (tools/export.py)."""
    if not check:
        return []
    if check["guard"] != "on":
        return [f"precision check: {check['verdict']}"]
    keep = check["keep_fp32"]
    kept = f"{keep or 'nothing'} ({100 * check['fp32_share']:.0f} % of compute fp32)"
    line = (f"precision check: {check['verdict']}: {check['metric']} {check['delta_pp']:+.2f} pp, "
            f"{100 * check['level']:.0f}% CI [{check['ci_pp'][0]:+.2f}, {check['ci_pp'][1]:+.2f}], "
            f"{_margin(check)}; keep fp32: {kept}")
    where = check.get("first_overflow")
    if where:
        line += f"; without it the format first overflows at {where['key']} ({where['layer_type']}, {_images(where)})"
    lines = [line + " (precision_report.json)"]
    lines += [f"warning: {text}" for text in (check.get("compute_warning"), check.get("scan_note")) if text]
    return lines
