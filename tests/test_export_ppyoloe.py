"""PP-YOLOE export (PaddleDetection deploy layout, NMS in the graph) against our own evaluation path.

The reference is ``PPYOLOETask.predict`` (dygraph network, boxes to source pixels, clip, our NumPy
NMS: zoo/postprocess/nms.py) on the images our eval transform makes. The export runs in Paddle
Inference (fast test) and in PaddleX 3.7's object-detection predictor in its own venv (slow test;
the venv of tests/test_export_paddleocr.py, ``AMPZOO_SKIP_CLIENT=1`` skips it), which reads the
images, resizes, normalises and rescales on its own.

Weights: a random PP-YOLOE scores every anchor ~0.01 (the prior), so its NMS output is a pile of
near ties. The head's prediction convs are redrawn (seeded) so that scores spread over (0, 1) without
saturating, and an NMS score_threshold of 0.3 keeps a few dozen boxes; the test checks that no two
kept boxes of a class tie in score (ties leave the NMS order to each implementation), so both sides
must agree on every box.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import paddle
import pytest
import yaml
from conftest import ROOT, compose, run_tool

import zoo
from zoo.data.coco.transforms import BoxEvalTransform
from zoo.data.images import read_image_rgb
from zoo.tasks import PPYOLOETask

EXPORT = str(ROOT / "tools" / "export.py")
SCORE_THRESHOLD = 0.3
# A small synthetic set: only its class names are read by the export.
DATA = ["data.builder.num_train=4", "data.builder.num_val=2", f"model.task.nms.score_threshold={SCORE_THRESHOLD}"]
SIZES = [(200, 300), (250, 180), (170, 330)]  # (h, w): every image is rescaled, non-uniformly
CLS_STD = 0.2  # std of the redrawn class-prediction weights: scores spread but do not saturate at 1.0

# PaddleDetection's own predictor (deploy/python/infer.py), driven the way its predict_image does:
# preprocess (infer_cfg.yml's ops), predictor run, postprocess. imgaug is imported by preprocess.py
# for ops a PP-YOLOE does not use; when it is missing a stub stands in for it. load_predictor calls
# Config.enable_memory_optim(), with which Paddle 3.3.1's create_predictor fails for every PIR program
# (a plain ResNet too: "Not find predictor_id 0 and pass_name memory_optimize_pass"); it is made a no-op
# (it changes memory reuse, not results). And Paddle 3.3.1's Config turns oneDNN on by default, which
# infer.py's --enable_mkldnn=False never turns off: oneDNN fails on nearest_interp (docs/export.md), so
# the predictor is created with it off, as infer.py means to.
PADDLEDET_SCRIPT = r'''
import json, sys, types
import paddle.inference
a = json.loads(sys.argv[1])
sys.path.insert(0, a["deploy_python"])
paddle.inference.Config.enable_memory_optim = lambda self, *args, **kwargs: None
try:
    import imgaug.augmenters
except ImportError:
    sys.modules["imgaug"] = types.ModuleType("imgaug")
    sys.modules["imgaug.augmenters"] = sys.modules["imgaug"].augmenters = types.ModuleType("imgaug.augmenters")
import infer
from infer import Detector
_create = infer.create_predictor
def create_without_onednn(config):
    config.disable_mkldnn()
    return _create(config)
infer.create_predictor = create_without_onednn
det = Detector(a["model_dir"], device="CPU", run_mode="paddle", threshold=0.0)
out = []
for path in a["images"]:
    inputs = det.preprocess([path])
    result = det.postprocess(inputs, det.predict())
    assert list(result["boxes_num"]) == [len(result["boxes"])]
    out.append(result["boxes"].tolist())
with open(a["output"], "w") as f:
    json.dump(out, f)
'''

CLIENT_SCRIPT = r'''
import json, sys
from paddlex import create_model
a = json.loads(sys.argv[1])
model = create_model(model_name=a["model_name"], model_dir=a["model_dir"], device="cpu", engine="paddle_static",
                     engine_config={"run_mode": "paddle"})
out = [[{"cls_id": int(b["cls_id"]), "label": b["label"], "score": float(b["score"]),
         "coordinate": [float(v) for v in b["coordinate"]]} for b in r["boxes"]]
       for r in model.predict(a["images"], batch_size=1, threshold=0.0)]
with open(a["output"], "w") as f:
    json.dump(out, f)
'''


def _spread_ppyoloe(name="ppyoloe_tiny", num_classes=8, seed=0, cls_std=None):
    """PP-YOLOE with seeded prediction convs whose scores spread over (0, 1) (see the module doc)."""
    paddle.seed(seed)
    model = zoo.create_model(name, num_classes=num_classes)
    rng = np.random.default_rng(seed)
    for conv, std in [(c, cls_std or CLS_STD) for c in model.yolo_head.pred_cls] + [(c, 0.5) for c in model.yolo_head.pred_reg]:
        conv.weight.set_value(paddle.to_tensor(rng.normal(0, std, conv.weight.shape).astype("float32")))
    model.eval()
    return model


def _write_images(tmp_path, seed=7):
    """Images of coloured rectangles on noise, at the SIZES; returns their paths."""
    rng = np.random.default_rng(seed)
    paths = []
    for i, (h, w) in enumerate(SIZES):
        img = rng.integers(0, 60, (h, w, 3)).astype(np.uint8)
        for _ in range(4):
            y, x = int(rng.integers(0, h - 40)), int(rng.integers(0, w - 40))
            img[y:y + int(rng.integers(20, 40)), x:x + int(rng.integers(20, 60))] = rng.integers(80, 256, 3)
        paths.append(tmp_path / f"img{i}.png")
        cv2.imwrite(str(paths[-1]), img)
    return paths


def _ours(model, paths, eval_size, nms):
    """Our evaluation path on each image: ``[K, 6]`` (class, score, x1, y1, x2, y2) rows."""
    task = PPYOLOETask(num_classes=8, nms=nms)
    transform = BoxEvalTransform(eval_size)
    rows = []
    for path in paths:
        img = read_image_rgb(str(path))
        image, scale = transform(img)
        batch = {"image": paddle.to_tensor(image[None]), "scale_factor": scale[None],
                 "orig_size": np.array([img.shape[:2]], np.int64)}
        with paddle.no_grad():
            (boxes, scores, labels), = task.predict(model, batch)
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])  # clients drop empty boxes
        rows.append(np.concatenate([labels[keep, None], scores[keep, None], boxes[keep]], axis=1).astype(np.float64))
    return rows


def _by_class_then_score(rows):
    rows = np.asarray(rows, np.float64).reshape(-1, 6)
    return rows[np.lexsort((-rows[:, 1], rows[:, 0]))]


def _assert_same(theirs, ours, who, min_boxes=10):
    assert sum(len(r) for r in ours) >= min_boxes, "the spread model found too few boxes; the test proves nothing"
    for i, (t, o) in enumerate(zip(theirs, ours)):
        t, o = _by_class_then_score(t), _by_class_then_score(o)
        # equal scores would leave the NMS order (and so the boxes kept) to each implementation
        same_class = o[1:, 0] == o[:-1, 0]
        assert (np.abs(np.diff(o[:, 1]))[same_class] > 1e-6).all(), f"image {i}: tied scores; pick other weights"
        assert len(t) == len(o), f"image {i}: {who} {len(t)} boxes, ours {len(o)}"
        np.testing.assert_array_equal(t[:, 0], o[:, 0], err_msg=f"image {i}: classes differ")
        np.testing.assert_allclose(t[:, 1], o[:, 1], atol=1e-4, err_msg=f"image {i}: scores differ")
        np.testing.assert_allclose(t[:, 2:], o[:, 2:], atol=1.0, err_msg=f"image {i}: boxes differ (px)")


def _export(tmp_path, model, *extra, name="ppyoloe_tiny"):
    paddle.save(model.state_dict(), str(tmp_path / "w.pdparams"))
    out = tmp_path / "deploy"
    proc = run_tool([EXPORT, f"model={name}", f"weights={tmp_path / 'w.pdparams'}", f"export.out_dir={out}",
                     "export.onnx=false", *DATA, *extra], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _paddle_inference(model_file, params_file, paths, eval_size):
    """Paddle Inference (CPU, oneDNN off: see docs/export.md) on PaddleDetection's preprocessing."""
    from paddle import inference

    config = inference.Config(str(model_file), str(params_file))
    config.disable_gpu()
    config.disable_mkldnn()
    predictor = inference.create_predictor(config)
    assert sorted(predictor.get_input_names()) == ["image", "scale_factor"]
    transform = BoxEvalTransform(eval_size)
    rows = []
    for path in paths:
        image, scale = transform(read_image_rgb(str(path)))
        feeds = {"image": image[None], "scale_factor": scale[None]}
        for name in predictor.get_input_names():
            handle = predictor.get_input_handle(name)
            handle.reshape(feeds[name].shape)
            handle.copy_from_cpu(np.ascontiguousarray(feeds[name]))
        predictor.run()
        bbox, bbox_num = (predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names())
        assert bbox.shape[1:] == (6,) and bbox_num.tolist() == [len(bbox)]
        rows.append(bbox[(bbox[:, 4] > bbox[:, 2]) & (bbox[:, 5] > bbox[:, 3])])
    return rows


def test_export_files_and_infer_cfg(tmp_path):
    out = _export(tmp_path, _spread_ppyoloe())
    assert {p.name for p in out.iterdir()} == {"model.json", "model.pdiparams", "infer_cfg.yml", "export.json"}
    cfg = yaml.safe_load((out / "infer_cfg.yml").read_text())
    assert cfg["arch"] == "YOLO" and cfg["min_subgraph_size"] == 3 and cfg["mode"] == "paddle"
    assert cfg["use_dynamic_shape"] is False and cfg["draw_threshold"] == 0.5
    assert cfg["Global"] == {"model_name": "PP-YOLOE_plus-S"}
    assert cfg["Preprocess"] == [
        {"type": "Resize", "interp": 2, "keep_ratio": False, "target_size": [160, 160]},
        {"type": "NormalizeImage", "is_scale": True, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
        {"type": "Permute"}]
    assert cfg["label_list"] == ["circle", "square", "triangle", "star", "ellipse", "cross", "ring", "diamond"]
    assert cfg["NMS"]["score_threshold"] == SCORE_THRESHOLD and cfg["NMS"]["keep_top_k"] == 100
    record = json.loads((out / "export.json").read_text())
    assert record["layout"] == "paddledetection" and record["input_shape"] == [-1, 3, 160, 160]
    assert record["precision"] == "fp32" and set(record["saved_dtypes"]) == {"float32"}


def test_paddle_inference_matches_our_predict(tmp_path):
    model = _spread_ppyoloe()
    out = _export(tmp_path, model)
    paths = _write_images(tmp_path)
    nms = dict(compose(["model=ppyoloe_tiny", *DATA], "export").model.task.nms)
    theirs = _paddle_inference(out / "model.json", out / "model.pdiparams", paths, 160)
    _assert_same(theirs, _ours(model, paths, 160, nms), "Paddle Inference")


def test_ppyoloe_s_exports_and_runs(tmp_path):
    """The real ppyoloe_s (random weights) exports in both layouts and runs in Paddle Inference."""
    model = _spread_ppyoloe("ppyoloe_s", cls_std=2.0)  # its head's inputs are smaller: 28 boxes at 2.0
    out = _export(tmp_path, model, "export.layout=paddlex", name="ppyoloe_s")
    assert {p.name for p in out.iterdir()} == {"inference.json", "inference.pdiparams", "inference.yml",
                                               "export.json"}
    paths = _write_images(tmp_path)
    nms = dict(compose(["model=ppyoloe_s", *DATA], "export").model.task.nms)
    theirs = _paddle_inference(out / "inference.json", out / "inference.pdiparams", paths, 160)
    _assert_same(theirs, _ours(model, paths, 160, nms), "Paddle Inference")


def test_onnx_matches_our_predict(tmp_path):
    """paddle2onnx + onnxruntime, when installed (the test extra installs them): NMS included."""
    pytest.importorskip("paddle2onnx", reason="paddle2onnx not installed (optional)")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed (optional)")
    model = _spread_ppyoloe()
    paddle.save(model.state_dict(), str(tmp_path / "w.pdparams"))
    out = tmp_path / "deploy"
    proc = run_tool([EXPORT, "model=ppyoloe_tiny", f"weights={tmp_path / 'w.pdparams'}", f"export.out_dir={out}",
                     "export.onnx=true", *DATA], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sess = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in sess.get_inputs()) == ["image", "scale_factor"]
    paths = _write_images(tmp_path)
    transform = BoxEvalTransform(160)
    theirs = []
    for path in paths:
        image, scale = transform(read_image_rgb(str(path)))
        bbox, bbox_num = sess.run(None, {"image": image[None], "scale_factor": scale[None]})[:2]
        assert bbox_num.tolist() == [len(bbox)]
        theirs.append(bbox[(bbox[:, 4] > bbox[:, 2]) & (bbox[:, 5] > bbox[:, 3])])
    nms = dict(compose(["model=ppyoloe_tiny", *DATA], "export").model.task.nms)
    _assert_same(theirs, _ours(model, paths, 160, nms), "onnxruntime")


@pytest.mark.parametrize("args, match", [
    (["export.layout=onnx"], "export.layout: expected auto or paddlex or paddledetection"),
    (["export.precision=fp8"], "export.precision: expected one of fp32, fp16, bf16"),
    (["export.model_name=PP-YOLOE-Z"], "export.model_name: 'PP-YOLOE-Z' is not a PaddleX PP-YOLOE name"),
    (["export.label_list=[a,b]"], "export.label_list: 2 names for a model of 8 classes"),
    (["export.input_shape=[1,3,320,320]"], "export.input_shape: PP-YOLOE's is [-1, 3, S, S]"),
    (["data.builder.eval_size=100"], "data.builder.eval_size: PP-YOLOE needs a positive multiple of 32"),
    (["export.draw_threshold=2"], "export.draw_threshold: expected a score in [0, 1]"),
    (["+data.builder.channel_order=BGR"], "data.builder.channel_order: 'BGR'"),
    (["+model.task.nms.eta=0.5"], "model.task.nms: unknown keys ['eta']"),
])
def test_cli_bad_settings(tmp_path, args, match):
    proc = run_tool([EXPORT, "model=ppyoloe_tiny", *DATA, *args, f"export.out_dir={tmp_path / 'x'}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert match in proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]) == 1


@pytest.mark.slow
def test_paddlex_predictor_matches_our_predict(tmp_path):
    from test_export_paddleocr import _client_python

    python = _client_python()
    model = _spread_ppyoloe()
    out = _export(tmp_path, model, "export.layout=paddlex")
    paths = _write_images(tmp_path)
    result = tmp_path / "client.json"
    (tmp_path / "client.py").write_text(CLIENT_SCRIPT)
    args = {"model_name": "PP-YOLOE_plus-S", "model_dir": str(out), "images": [str(p) for p in paths],
            "output": str(result)}
    env = dict(os.environ, PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK="1", PADDLE_PDX_CACHE_HOME=str(tmp_path / "pdx"),
               PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(python), str(tmp_path / "client.py"), json.dumps(args)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, f"PaddleX client failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    client = json.loads(result.read_text())
    assert len(client) == len(paths)
    labels = yaml.safe_load((out / "inference.yml").read_text())["label_list"]
    theirs = [[[b["cls_id"], b["score"], *b["coordinate"]] for b in boxes] for boxes in client]
    assert all(b["label"] == labels[b["cls_id"]] for boxes in client for b in boxes)
    nms = dict(compose(["model=ppyoloe_tiny", *DATA], "export").model.task.nms)
    _assert_same(theirs, _ours(model, paths, 160, nms), "PaddleX")


def _paddledet_source():
    """deploy/python of a PaddleDetection source tree: $AMPZOO_PADDLEDET_SRC, else ~/.cache/ampzoo/src/PaddleDetection."""
    root = Path(os.environ.get("AMPZOO_PADDLEDET_SRC", Path.home() / ".cache/ampzoo/src/PaddleDetection"))
    deploy = root / "deploy" / "python"
    if not (deploy / "infer.py").is_file():
        pytest.skip(f"no PaddleDetection source at {root} (needs deploy/python/infer.py; there is no PyPI "
                    "package of it): set AMPZOO_PADDLEDET_SRC to a checkout")
    return deploy


@pytest.mark.slow
def test_paddledetection_infer_py_matches_our_predict(tmp_path):
    """Upstream's deploy/python/infer.py on the default layout (model.json + infer_cfg.yml)."""
    deploy = _paddledet_source()
    model = _spread_ppyoloe()
    out = _export(tmp_path, model)
    paths = _write_images(tmp_path)
    result = tmp_path / "paddledet.json"
    (tmp_path / "paddledet.py").write_text(PADDLEDET_SCRIPT)
    args = {"deploy_python": str(deploy), "model_dir": str(out), "images": [str(p) for p in paths],
            "output": str(result)}
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)  # upstream's code and Paddle only, not ours
    proc = subprocess.run([sys.executable, str(tmp_path / "paddledet.py"), json.dumps(args)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, f"PaddleDetection infer.py failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    theirs = [np.asarray(rows, np.float64).reshape(-1, 6) for rows in json.loads(result.read_text())]
    theirs = [t[(t[:, 4] > t[:, 2]) & (t[:, 5] > t[:, 3])] for t in theirs]
    nms = dict(compose(["model=ppyoloe_tiny", *DATA], "export").model.task.nms)
    _assert_same(theirs, _ours(model, paths, 160, nms), "PaddleDetection infer.py")


def test_coco_model_without_the_data_needs_label_list(tmp_path):
    """data=coco with no annotations here: the error names export.label_list; given, the export runs."""
    base = [EXPORT, "model=ppyoloe_tiny", "data=coco", f"data.root={tmp_path / 'no_coco'}", "export.onnx=false"]
    proc = run_tool([*base, f"export.out_dir={tmp_path / 'a'}"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: export.label_list: not given, and the class names of data=coco cannot be read" in proc.stderr
    names = [f"c{i}" for i in range(80)]
    proc = run_tool([*base, f"export.out_dir={tmp_path / 'b'}", f"export.label_list=[{','.join(names)}]"],
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = yaml.safe_load((tmp_path / "b" / "infer_cfg.yml").read_text())
    assert cfg["label_list"] == names and cfg["Preprocess"][0]["target_size"] == [640, 640]
