"""tools/export.py and zoo.export: files, inference.yml content, resize rule, CLI, bad input."""
from __future__ import annotations

import json
import sys

import numpy as np
import paddle
import pytest
import yaml
from conftest import ROOT, run_tool

import zoo
from zoo.export import ExportError, db_inference_yml, det_resize_shape, export_inference, export_onnx

EXPORT = str(ROOT / "tools" / "export.py")


@pytest.mark.parametrize("h, w, side, kind, want", [
    (200, 300, 256, "max", (160, 256)),     # 256/300: 170.67 -> 170 -> 5*32; 256
    (100, 50, 960, "max", (96, 64)),        # no scaling; 100 -> 3.125*32 -> 96, 50 -> 1.5625 -> 2*32
    (100, 50, 736, "min", (1472, 736)),     # 736/50 = 14.72: 1472, 736 (both multiples of 32)
    (300, 200, 64, "resize_long", (64, 32)),  # 64/300: 64, int(42.67)=42 -> 1.31 -> 32
    (1000, 5000, 8000, "max", (800, 4000)),  # no limit scaling, then capped at 4000: x0.8
])
def test_det_resize_shape_hand_values(h, w, side, kind, want):
    assert det_resize_shape(h, w, side, kind) == want


def test_det_resize_shape_bad_limit_type():
    with pytest.raises(ExportError, match="limit_type"):
        det_resize_shape(10, 10, 32, "longest")


def test_db_inference_yml_content():
    post = {"thresh": 0.25, "box_thresh": 0.55, "max_candidates": 77, "unclip_ratio": 1.75,
            "use_dilation": True, "score_mode": "slow", "box_type": "poly"}
    yml = db_inference_yml(post, "PP-OCRv3_mobile_det", mean=(0.1, 0.2, 0.3), std=(0.4, 0.5, 0.6),
                           img_mode="RGB", limit_side_len=640, limit_type="min")
    assert yml["Global"] == {"model_name": "PP-OCRv3_mobile_det"}
    assert yml["PostProcess"] == {"name": "DBPostProcess", **post}
    ops = yml["PreProcess"]["transform_ops"]
    assert [next(iter(op)) for op in ops] == ["DecodeImage", "DetResizeForTest", "NormalizeImage", "ToCHWImage"]
    assert ops[0]["DecodeImage"] == {"img_mode": "RGB", "channel_first": False}
    assert ops[1]["DetResizeForTest"] == {"limit_side_len": 640, "limit_type": "min"}
    assert ops[2]["NormalizeImage"] == {"scale": 1 / 255, "mean": [0.1, 0.2, 0.3], "std": [0.4, 0.5, 0.6],
                                        "order": "hwc"}
    # the defaults PaddleX would otherwise substitute (unclip_ratio 2.0) never apply: every key is written
    assert db_inference_yml({})["PostProcess"]["unclip_ratio"] == 1.5


@pytest.mark.parametrize("kwargs, match", [
    ({"postprocess": {}, "model_name": "PP-OCRv9_det"}, "export.model_name"),
    ({"postprocess": {"threshold": 0.3}}, r"model.task.postprocess: unknown keys \['threshold'\]"),
    ({"postprocess": {"score_mode": "fastest"}}, "score_mode"),
    ({"postprocess": {}, "img_mode": "GRAY"}, "channel_order"),
    ({"postprocess": {}, "limit_type": "long"}, "limit_type"),
])
def test_db_inference_yml_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        db_inference_yml(**kwargs)


@pytest.mark.parametrize("shape", [[-1, 3, -1], [-1, 0, 32, 32], [-1, 3, -2, 32], ["a", 3, 32, 32]])
def test_export_inference_bad_shape(tmp_path, shape):
    with pytest.raises(ExportError, match="export.input_shape"):
        export_inference(zoo.create_model("resnet_tiny", num_classes=3), tmp_path, shape)


def test_onnx_required_without_paddle2onnx(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "paddle2onnx", None)  # import fails as if not installed
    assert export_onnx(tmp_path)[0] is None
    assert "paddle2onnx is not installed" in export_onnx(tmp_path)[1]
    with pytest.raises(ExportError, match="export.onnx=true"):
        export_onnx(tmp_path, required=True)


FAKE_PADDLE2ONNX = """
import sys
__version__ = "0.0-fake"
def export(model_file, params_file, save_file, opset_version=9):
    if "fail" in model_file:
        print("\\x1b[0;31m[ERROR]\\tFailed to convert: fake reason\\x1b[0m")
        sys.exit(-1)  # as paddle2onnx 2.1.0 does
    with open(save_file, "w") as f:
        f.write(f"{model_file}|{params_file}|{opset_version}")
"""


@pytest.fixture
def fake_paddle2onnx(tmp_path, monkeypatch):
    """A stand-in paddle2onnx visible to this process and to the child process export_onnx starts."""
    pkg = tmp_path / "fake_site" / "paddle2onnx"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_PADDLE2ONNX)
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.setenv("PYTHONPATH", str(pkg.parent))
    real = sys.modules.pop("paddle2onnx", None)
    yield
    sys.modules.pop("paddle2onnx", None)  # the fake must not leak into later tests
    if real is not None:
        sys.modules["paddle2onnx"] = real


def test_onnx_runs_paddle2onnx_in_a_child(tmp_path, fake_paddle2onnx):
    for name in ("inference.json", "inference.pdiparams"):
        (tmp_path / "ok" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "ok" / name).write_text("x")
    path, msg = export_onnx(tmp_path / "ok", opset=13)
    assert path == tmp_path / "ok" / "inference.onnx" and "0.0-fake" in msg
    assert path.read_text() == f"{tmp_path / 'ok' / 'inference.json'}|{tmp_path / 'ok' / 'inference.pdiparams'}|13"
    fail = tmp_path / "fail"
    fail.mkdir()
    (fail / "inference.json").write_text("x")
    path, msg = export_onnx(fail)  # the child's sys.exit does not end this process
    assert path is None and "exit 255" in msg and "[ERROR]\tFailed to convert: fake reason" in msg
    assert "\x1b" not in msg
    with pytest.raises(ExportError, match="export.onnx=true: ONNX conversion failed"):
        export_onnx(fail, required=True)


def test_onnx_real_resnet_matches_paddle(tmp_path):
    """Real paddle2onnx + onnxruntime, when installed (the test extra installs them)."""
    pytest.importorskip("paddle2onnx", reason="paddle2onnx not installed (optional)")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed (optional)")
    paddle.seed(2)
    model = zoo.create_model("resnet_tiny", num_classes=4)
    export_inference(model, tmp_path, [-1, 3, 32, 32], output="probs")
    path, msg = export_onnx(tmp_path, required=True)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype("float32")
    sess = ort.InferenceSession(str(path))
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    model.eval()
    np.testing.assert_allclose(got, _softmax(model(paddle.to_tensor(x)).numpy()), rtol=1e-4, atol=1e-6)


def test_onnx_real_db_matches_paddle_at_two_input_sizes(tmp_path):
    """DB's FPN upsampling converts (size form of nearest_interp) and keeps dynamic H, W."""
    pytest.importorskip("paddle2onnx", reason="paddle2onnx not installed (optional)")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed (optional)")
    paddle.seed(3)
    model = zoo.create_model("db_det_tiny")
    export_inference(model, tmp_path, [-1, 3, -1, -1], output="maps")
    path, _ = export_onnx(tmp_path, required=True)
    sess = ort.InferenceSession(str(path))
    model.eval()
    for shape in ((1, 3, 64, 96), (2, 3, 128, 64)):
        x = np.random.default_rng(1).standard_normal(shape).astype("float32")
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        np.testing.assert_allclose(got, model(paddle.to_tensor(x))["maps"].numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["ppocrv5_mobile_det", "ppocrv5_server_det"])
def test_onnx_real_ppocrv5_det_matches_paddle(tmp_path, name):
    """tools/export.py's body with export.onnx=true on PP-OCRv5's detectors (the mobile det fused to its
    deploy form first, LKPAN's IntraCL and PFHeadLocal's upsampling in the server det): onnxruntime gives
    the dygraph model's eval maps at two input sizes. BatchNorm statistics come from one batch
    (tests/test_export_paddleocr.py's _calibrated): the initial ones saturate the random server det."""
    pytest.importorskip("paddle2onnx", reason="paddle2onnx not installed (optional)")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed (optional)")
    from conftest import compose
    from test_export_paddleocr import _calibrated, _normalize, _rect_image

    from zoo.export import export_from_config

    model = _calibrated(name)
    paddle.save(model.state_dict(), str(tmp_path / "w.pdparams"))
    cfg = compose([f"model={name}", f"model.net.pretrained={tmp_path / 'w.pdparams'}", "model.net.strict=true",
                   "export.onnx=true"], "export")
    record = export_from_config(cfg, tmp_path / "out", log=lambda *_: None)
    assert "inference.onnx" in record["files"], record["onnx"]
    sess = ort.InferenceSession(str(tmp_path / "out" / "inference.onnx"), providers=["CPUExecutionProvider"])
    model.eval()
    rng = np.random.default_rng(1)
    for shape in ((1, 3, 96, 128), (2, 3, 64, 160)):  # images as the calibration's (noise saturates the maps)
        x = np.stack([_normalize(_rect_image(rng, shape[2], shape[3])[0]) for _ in range(shape[0])])
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        with paddle.no_grad():
            want = model(paddle.to_tensor(x))["maps"].numpy()
        assert got.shape == want.shape == (shape[0], 1, shape[2], shape[3])
        np.testing.assert_allclose(got, want, atol=1e-4)


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_cli_classification_export(tmp_path):
    """resnet_tiny with given weights: softmax probabilities out, PaddleClas-style inference.yml."""
    paddle.seed(5)
    model = zoo.create_model("resnet_tiny", num_classes=10)
    paddle.save(model.state_dict(), str(tmp_path / "w.pdparams"))
    out = tmp_path / "cls"
    proc = run_tool([EXPORT, "model=resnet_tiny", f"weights={tmp_path / 'w.pdparams'}", f"export.out_dir={out}",
                     "export.model_name=ResNet18", "export.onnx=false"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "export.json").read_text())
    assert record["input_shape"] == [-1, 3, 32, 32] and record["precision"] == "fp32"
    assert str(tmp_path / "w.pdparams") in record["weights"]
    yml = yaml.safe_load((out / "inference.yml").read_text())
    assert yml["Global"]["model_name"] == "ResNet18"
    assert yml["PreProcess"]["transform_ops"][:2] == [{"ResizeImage": {"resize_short": 32}},
                                                      {"CropImage": {"size": 32}}]
    assert yml["PostProcess"] == {"Topk": {"topk": 5}}
    model.eval()
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype("float32")
    got = paddle.jit.load(str(out / "inference"))(paddle.to_tensor(x))
    got = (got[0] if isinstance(got, (list, tuple)) else got).numpy()
    np.testing.assert_allclose(got, _softmax(model(paddle.to_tensor(x)).numpy()), rtol=1e-4, atol=1e-6)


def test_cli_db_export_loads_weights(tmp_path):
    """db_det_tiny from a .pdparams: the exported map equals the dygraph map of those weights."""
    paddle.seed(11)
    model = zoo.create_model("db_det_tiny")
    paddle.save(model.state_dict(), str(tmp_path / "w.pdparams"))
    out = tmp_path / "db"
    proc = run_tool([EXPORT, "model=db_det_tiny", f"weights={tmp_path / 'w.pdparams'}", f"export.out_dir={out}",
                     "export.onnx=false", "model.task.postprocess.box_thresh=0.45"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == {"inference.json", "inference.pdiparams", "inference.yml",
                                               "export.json"}
    yml = yaml.safe_load((out / "inference.yml").read_text())
    assert yml["Global"]["model_name"] == "PP-OCRv4_mobile_det"
    assert yml["PostProcess"]["box_thresh"] == 0.45
    model.eval()
    x = paddle.to_tensor(np.random.default_rng(1).standard_normal((1, 3, 64, 128)).astype("float32"))
    got = paddle.jit.load(str(out / "inference"))(x)
    got = (got[0] if isinstance(got, (list, tuple)) else got).numpy()
    np.testing.assert_allclose(got, model(x)["maps"].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("args, match", [
    (["model=db_det_tiny", "weights=/nonexistent/run"], "weights: /nonexistent/run does not exist"),
    (["model=db_det_tiny", "export.onnx=maybe"], "export.onnx: expected auto, true or false"),
    (["model=db_det_tiny", "export.model_name=MyDet"], "export.model_name: 'MyDet'"),
    (["model=db_det_tiny", "export.layout=paddledetection"], "export.layout: expected auto or paddlex for this model"),
])
def test_cli_bad_input(tmp_path, args, match):
    proc = run_tool([EXPORT, *args, f"export.out_dir={tmp_path / 'x'}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert match in proc.stderr
