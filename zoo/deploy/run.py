"""``tools/deploy_check.py`` from its config: load the program, prepare the images, check each precision,
write the report (zoo/deploy/check.py says what is checked, zoo/deploy/report.py what is written)."""
from __future__ import annotations

import time
from pathlib import Path

from zoo.deploy.check import CheckSettings, Inputs, check_precision, run_pass
from zoo.deploy.errors import DeployError
from zoo.engine.runinfo import git_revision
from zoo.utils.progress import progress

__all__ = ["DeployRefused", "parse_precisions", "run_deploy_check"]


class DeployRefused(Exception):
    """At least one precision has no equivalent keep-list: the tool prints this and exits 1."""


def parse_precisions(value) -> list[str]:
    """``fp16``, ``bf16``, ``fp16,bf16`` or a list of them."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out = [str(p).strip().lower() for p in items if str(p).strip()]
    bad = [p for p in out if p not in ("fp16", "bf16")]
    if bad or not out:
        raise DeployError(f"precision: expected fp16, bf16 or fp16,bf16, got {value!r}")
    return list(dict.fromkeys(out))


def _settings(check) -> CheckSettings:
    known = CheckSettings.__dataclass_fields__
    extra = sorted(set(check) - set(known))
    if extra:
        raise DeployError(f"check.{extra[0]}: no such setting; known: {', '.join(sorted(known))}")
    return CheckSettings(**{k: check[k] for k in check})


def _with_overrides(preprocess, cfg):
    """``det_limit_side_len`` / ``det_limit_type`` on every DetResizeForTest step, ``postprocess`` over the
    config's post-processing settings (PaddleOCR's evaluation resizes with 736 / min, its predictor
    with 960 / max)."""
    from zoo.deploy.preprocess_ops import DetResizeForTest

    side, kind = cfg.get("det_limit_side_len"), cfg.get("det_limit_type")
    resizes = [s for s in preprocess.steps if isinstance(s, DetResizeForTest)]
    if (side is not None or kind is not None) and not resizes:
        raise DeployError("det_limit_side_len / det_limit_type: this model's preprocessing has no DetResizeForTest")
    for step in resizes:
        if kind is not None:
            if kind not in ("max", "min", "resize_long"):
                raise DeployError(f"det_limit_type: expected max, min or resize_long, got {kind!r}")
            step.limit_type = str(kind)
        if side is not None:
            step.limit_side_len = int(side)
    preprocess.postprocess.update(dict(cfg.get("postprocess") or {}))
    return preprocess


def prepare_inputs(paths, preprocess, feeds) -> Inputs:
    """Every image through the model's preprocessing, once."""
    from zoo.deploy.inputs import read_image

    prepared, metas = [], []
    for path in progress(paths, desc="images", leave=False, disable=len(paths) < 4):
        f, meta = preprocess(read_image(path))
        prepared.append(f)
        metas.append(meta)
    return Inputs(list(paths), prepared, metas, list(feeds))


def run_deploy_check(cfg, out_dir: Path, log=print, compose=None) -> dict:
    """The whole check (``cfg``: configs/deploy_check.yaml); returns the report. Raises
    :class:`DeployRefused` after writing it when a precision is refused. ``compose(overrides)``
    composes configs/eval.yaml for ``labels.data`` / ``labels.model`` (zoo/deploy/labelled.py)."""
    from zoo.deploy.interpreter import ProgramNet
    from zoo.deploy.labelled import wants_labels
    from zoo.deploy.program import fold_batch_norms, load_program
    from zoo.deploy.report import REPORT, write_outputs

    t0 = time.time()
    precisions = parse_precisions(cfg.precision)
    settings = _settings(dict(cfg.check))
    labels = cfg.get("labels")
    has_labels, has_images = wants_labels(labels), bool(cfg.get("images"))
    if not (has_labels or has_images):
        raise DeployError("images: required (a folder, a glob or a comma list of your images), unless labels.run= "
                          "or labels.data= + labels.model= give a labelled zoo data set")
    model_dir = Path(str(cfg.model_dir)).expanduser()
    program = load_program(model_dir)
    folded, n_folded = fold_batch_norms(program)
    net = ProgramNet(folded)
    net.eval()
    report = {"model_dir": str(model_dir), "program": {"format": program.source, "ops": len(program.ops),
                                                        "batch_norms_folded": n_folded, "feeds": folded.feeds,
                                                        "fetches": folded.fetches},
              "precisions": {}}
    lines, refused, empty = [], [], []
    if has_images:
        lines += _unlabelled(cfg, model_dir, program, folded, n_folded, net, precisions, settings, report, log)
        empty = [p for p, s in report["precisions"].items() if s["verdict"] == "nothing to compare"]
        refused = [p for p, s in report["precisions"].items() if s["verdict"] == "refused"]
    if has_labels:
        lines += _labelled(labels, folded, net, precisions, settings, report, compose, log)
        refused += [f"{p} (labels)" for p, s in report["labelled"].items() if s["verdict"] == "refused"]
    report["seconds"] = time.time() - t0
    report["git_revision"] = git_revision()
    path = write_outputs(report, out_dir, model_dir)
    for line in lines:
        log(line)
    log(f"report: {path} ({time.time() - t0:.0f} s)")
    if empty:
        raise DeployRefused(f"{', '.join(empty)}: the FP32 model predicts no {report['precisions'][empty[0]]['unit']} "
                            f"on any of the {len(report['images'])} images, so there is nothing to compare; give "
                            f"images on which it finds something; report: {out_dir / REPORT}")
    if refused:
        raise DeployRefused(f"{', '.join(refused)}: no keep-list within check.max_keep={settings.max_keep} and "
                            f"check.max_evaluations={settings.max_evaluations} keeps the predictions of FP32; "
                            f"report: {out_dir / REPORT}")
    return report


def _unlabelled(cfg, model_dir, program, folded, n_folded, net, precisions, settings, report, log) -> list[str]:
    """The check on the user's images, without labels (zoo/deploy/check.py): fills ``report``, returns
    the verdict lines."""
    from zoo.deploy.inputs import list_images
    from zoo.deploy.preprocess import build_preprocess
    from zoo.deploy.report import verdict_line
    from zoo.deploy.tasks import build_task

    preprocess, kind, source = build_preprocess(model_dir, cfg.get("preset"), task=cfg.get("task"))
    preprocess = _with_overrides(preprocess.for_feeds(folded.feeds), cfg)
    task = build_task(kind, postprocess=preprocess.postprocess, character_dict=cfg.get("character_dict"))
    paths = list_images(str(cfg.images))
    if cfg.get("max_images") and len(paths) > int(cfg.max_images):
        log(f"note: {len(paths)} images given, checking the first {int(cfg.max_images)} (max_images=)")
        paths = paths[:int(cfg.max_images)]
    inputs = prepare_inputs(paths, preprocess, folded.feeds)
    log(f"deploy check: {model_dir} ({program.source}, {len(program.ops)} ops, {n_folded} BatchNorms folded as "
        f"Paddle Inference does), task {kind} ({source}), {len(paths)} images")
    report.update(task=kind, preprocess=source, images=[str(p) for p in paths])
    lines = []
    for precision in precisions:
        log(f"{precision}: FP32 and the emulated {precision} deployment (its numbers in FP32 arithmetic), op by op")
        ref = run_pass(net, task, inputs, {"fp16": "float16", "bf16": "bfloat16"}[precision])
        bad = [i for i, n in enumerate(ref.nonfinite) if n]
        if bad:
            raise DeployError(f"the FP32 model itself outputs inf/NaN on {len(bad)} image(s) (first: {paths[bad[0]]}, "
                              f"at {next(iter(ref.nonfinite[bad[0]]))}): nothing to compare {precision} with")
        section = check_precision(net, folded, task, inputs, precision, settings, ref=ref, log=log)
        section["fp32_seconds"] = ref.seconds
        report["precisions"][precision] = section
        lines.append(verdict_line(section))
    return lines


def _labelled(labels, folded, net, precisions, settings, report, compose, log) -> list[str]:
    """The metric verdict on a labelled zoo data set (zoo/deploy/labelled.py): fills
    ``report["labelled"]``, returns the verdict lines."""
    from zoo.deploy.labelled import check_labelled
    from zoo.export.checked_export import consumer_notes
    from zoo.export.precision_check import PrecisionRefused
    from zoo.export.precision_report import check_lines, check_summary, refusal

    report["labelled"] = {}
    lines = []
    for precision in precisions:
        try:
            section = check_labelled(net, folded, labels, precision, settings, compose=compose, log=log)
            said = [f"{precision} with labels: " + line.removeprefix("precision check: ").replace(
                "(precision_report.json)", "(deploy_report.json, labelled)") for line in check_lines(check_summary(section))]
        except PrecisionRefused as refused:
            section = refused.report
            said = [f"{precision} with labels: refused: {refusal(section)}"]
        section["consumers"] = consumer_notes(precision, section.get("consumer_black_list") or [])
        report["labelled"][precision] = section
        lines += said
    return lines
