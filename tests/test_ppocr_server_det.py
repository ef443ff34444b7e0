"""PP-OCRv5 server det (PPHGNetV2_B4 det + LKPAN 256 with IntraCL + PFHeadLocal k 50, large): PaddleOCR's
state-dict layout, the head's train/eval outputs and its extra loss term, a tiny run of tools/train.py and
the export, and PaddleOCR-layout checkpoints loaded by registry name (issue 36).

tests/data/paddleocr_ppocrv5_server_det.keys lists the ``name [shape]`` entries, in order, of PaddleOCR
main's ``build_model`` of ``configs/det/PP-OCRv5/PP-OCRv5_server_det.yml`` (``rec_pphgnetv2.py``
``PPHGNetV2_B4(det=True)``, ``db_fpn.py`` ``LKPAN`` + ``intracl.py`` ``IntraCLBlock``,
``det_db_head.py`` ``PFHeadLocal``), built with Paddle 3.3.1 on CPU. With the same random weights (every
entry perturbed, BatchNorm statistics far from their initial values) that build and the zoo's gave
identical maps (max |difference| 0.0) on a [2, 3, 160, 224] input in eval mode and in train mode
(``maps`` and ``cbn_maps``); upstream's DBLoss and the zoo's on those outputs agreed to 4e-6
(loss 8.436455 / 8.436459, ``loss_cbn`` included). This test cannot import upstream.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import paddle
import pytest
import yaml
from conftest import ROOT, compose, run_tool
from test_weights_download import home, server  # noqa: F401  (fixtures: a cache root, a 127.0.0.1 server)

import zoo
from zoo.losses import DBLoss
from zoo.weights import hub

KEYS = ROOT / "tests" / "data" / "paddleocr_ppocrv5_server_det.keys"
TRAINABLE = 26_291_811  # upstream's count too; 4,194,304 of it is the det forward's unused last_conv
TINY_RUN = ["trainer.max_steps=2", "model.batch_size=2", "model.eval_batch_size=2", "data.builder.num_train=4",
            "data.builder.num_val=2", "data.builder.image_size=[64,64]", "data.builder.crop_size=64",
            "trainer.bootstrap_resamples=0", "trainer.draw_samples=0", "trainer.progress=false",
            "trainer.log_every=1", "trainer.ckpt_every=2", "sched.warmup_steps=1"]


def layout(model) -> list[str]:
    return [f"{k} {[int(d) for d in v.shape]}" for k, v in model.state_dict().items()]


@pytest.fixture(scope="module")
def model():
    paddle.seed(0)
    return zoo.create_model("ppocrv5_server_det")


def test_state_dict_is_paddleocrs_layout(model):
    lines = [ln for ln in KEYS.read_text().splitlines() if ln.strip()]
    assert layout(model) == lines
    assert len(lines) == 553
    assert hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest() == \
        "2d89f9d6c65333b4657a44e90a914c2ceb4a43ba3471be78e564d3d7108233d0"
    assert sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient) == TRAINABLE


def test_names_spot_checked_against_upstream_code(model):
    """Each entry as PaddleOCR main's code builds it (file named per line)."""
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    expected = {
        # rec_pphgnetv2.py StemBlock: 2x2 "SAME" convs, stem3 reads the pool and stem2b concatenated
        "backbone.stem.stem2a.conv.weight": [16, 32, 2, 2],
        "backbone.stem.stem3.conv.weight": [32, 64, 3, 3],
        # HGV2_Stage: depthwise downsample from stage 2 on; light blocks (conv1 1x1, conv2 dw 5x5) in 3, 4
        "backbone.stages.1.downsample.conv.weight": [128, 1, 3, 3],
        "backbone.stages.2.blocks.2.layers.5.conv2.conv.weight": [192, 1, 5, 5],
        "backbone.stages.1.blocks.0.layers.0.conv.weight": [96, 128, 3, 3],
        # HGV2_Block aggregation: in + 6 * mid -> out / 2 -> out
        "backbone.stages.3.blocks.0.aggregation_squeeze_conv.conv.weight": [1024, 1024 + 6 * 384, 1, 1],
        # PPHGNetV2: use_last_conv defaults to True, also with det=True
        "backbone.last_conv.weight": [2048, 2048, 1, 1],
        # db_fpn.py LKPAN (large): 9x9 convs, 3 stride-2 pan_head convs; intracl.py IntraCLBlock(64, 2)
        "neck.inp_conv.3.weight": [64, 256, 9, 9],
        "neck.pan_head_conv.2.weight": [64, 64, 3, 3],
        "neck.incl4.q_layer_1x7.weight": [32, 32, 1, 7],
        "neck.incl1.bn._variance": [64],
        # det_db_head.py PFHeadLocal: LocalModule(64, 64) reads the shrink map + 64 features
        "head.cbn_layer.last_3.conv.weight": [64, 65, 3, 3],
        "head.cbn_layer.last_1.bias": [1],
    }
    assert {k: shapes.get(k) for k in expected} == expected
    absent = ("backbone.stages.0.downsample.conv.weight", "backbone.fc.weight", "neck.pan_head_conv.3.weight",
              "backbone.stem.stem1.lab.scale")
    assert not [k for k in absent if k in shapes]


def test_backbone_batchnorms_are_not_decayed(model):
    """rec_pphgnetv2.py ConvBNAct: the BN affine terms carry L2Decay(0); convs take the optimizer's."""
    params = dict(model.named_parameters())
    assert params["backbone.stages.2.blocks.1.layers.3.conv1.bn.weight"].regularizer._coeff == 0.0
    assert params["backbone.stem.stem1.bn.bias"].regularizer._coeff == 0.0
    assert params["backbone.stem.stem1.conv.weight"].regularizer is None


def test_forward_shapes_in_train_and_eval(model):
    x = paddle.randn([2, 3, 64, 64])
    model.train()
    out = model(x)
    assert set(out) == {"maps", "cbn_maps"}
    assert list(out["maps"].shape) == [2, 3, 64, 64] and list(out["cbn_maps"].shape) == [2, 1, 64, 64]
    # cbn_maps is the binary map (channel 2), as upstream's PFHeadLocal returns it
    np.testing.assert_array_equal(out["cbn_maps"].numpy(), out["maps"][:, 2:3].numpy())
    model.eval()
    with paddle.no_grad():
        out = model(x)
        base = model.head.binarize(model.neck(model.backbone(x))).numpy()
    assert set(out) == {"maps"} and list(out["maps"].shape) == [2, 1, 64, 64]
    maps = out["maps"].numpy()
    assert ((maps >= 0) & (maps <= 1)).all()
    assert np.abs(maps - base).max() > 0, "eval averages the refined map in, not the bare shrink map"


def test_loss_adds_upstreams_cbn_term(model):
    model.train()
    x = paddle.randn([2, 3, 64, 64])
    rng = np.random.default_rng(0)
    batch = {k: paddle.to_tensor((rng.uniform(size=[2, 64, 64]) > 0.6).astype("float32"))
             for k in ("shrink_map", "shrink_mask", "threshold_map", "threshold_mask")}
    out = model(x)
    loss = DBLoss()(dict(out), batch)
    parts = ("loss_shrink_maps", "loss_threshold_maps", "loss_binary_maps", "loss_cbn")
    assert float(loss["loss"]) == pytest.approx(sum(float(loss[k]) for k in parts), rel=1e-6)
    assert "loss_cbn" not in DBLoss()(out["maps"], batch)  # a plain DB output: the three terms only
    loss["loss"].backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    assert grads["head.cbn_layer.last_1.weight"] is not None and grads["head.thresh.conv3.weight"] is not None
    model.clear_gradients()


def test_tools_train_runs_two_tiny_steps(tmp_path, ampzoo_home):
    run = tmp_path / "run"
    out = run_tool(["tools/train.py", "model=ppocrv5_server_det", *TINY_RUN, f"hydra.run.dir={run}"], ROOT,
                   {"AMPZOO_HOME": str(ampzoo_home), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 2
    assert summary["model"] == "ppocrv5_server_det"
    metrics = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    train_rows = [m for m in metrics if "loss_cbn" in m]
    assert train_rows and all(np.isfinite(m["loss"]) for m in train_rows)


def test_export_gives_the_eval_maps(tmp_path, model):
    """tools/export.py's body on a checkpoint: PaddleX's name in inference.yml, and the saved program giving
    the eval-mode maps of the network it was exported from."""
    from zoo.export import export_from_config

    weights = tmp_path / "weights.pdparams"
    paddle.save(model.state_dict(), str(weights))
    out = tmp_path / "export"
    cfg = compose(["model=ppocrv5_server_det", f"model.net.pretrained={weights}", "model.net.strict=true",
                   "export.onnx=false"], "export")
    record = export_from_config(cfg, out, log=lambda *_: None)
    assert record["paddlex_model_name"] == "PP-OCRv5_server_det"
    assert yaml.safe_load((out / "inference.yml").read_text())["Global"]["model_name"] == "PP-OCRv5_server_det"
    loaded = paddle.jit.load(str(out / "inference"))
    x = paddle.randn([1, 3, 96, 128])
    model.eval()
    with paddle.no_grad():
        want = model(x)["maps"].numpy()
    got = loaded(x)
    got = (got[0] if isinstance(got, (list, tuple)) else got).numpy()
    assert got.shape == want.shape == (1, 1, 96, 128)
    np.testing.assert_allclose(got, want, atol=1e-4)


def _key_file_shapes() -> dict[str, tuple]:
    out = {}
    for line in KEYS.read_text().splitlines():
        if line.strip():
            name, shape = line.split(" ", 1)
            out[name] = tuple(int(d) for d in shape.strip("[]").split(",") if d.strip())
    return out


def test_paddleocr_checkpoints_load_by_name(server, home, monkeypatch, tmp_path):
    """PP-OCRv5_server_det_pretrained and the yml's backbone PPHGNetV2_B4_ocr_det, made here in PaddleOCR's
    layout from the key file (formula weights: the official files cannot be downloaded offline), served on
    127.0.0.1 under their published paths and loaded by registry name."""
    shapes = _key_file_shapes()
    rng = np.random.default_rng(0)
    state = {k: (rng.standard_normal(s, dtype=np.float32) * 0.1) for k, s in shapes.items()}
    folder = "/paddlex/official_pretrained_model/"
    for name, content in (("PP-OCRv5_server_det_pretrained", state),
                          ("PPHGNetV2_B4_ocr_det", {k[len("backbone."):]: v for k, v in state.items()
                                                    if k.startswith("backbone.")})):
        file = tmp_path / f"{name}.pdparams"
        paddle.save(content, str(file))
        server.files[f"{folder}{name}.pdparams"] = file.read_bytes()
    monkeypatch.setenv(hub.MIRROR_ENV, server.base)
    whole = zoo.create_model("ppocrv5_server_det", pretrained="PP-OCRv5_server_det_pretrained", strict=True)
    got = whole.state_dict()
    assert all(np.array_equal(got[k].numpy(), v) for k, v in state.items())
    backbone = zoo.create_model("ppocrv5_server_det", pretrained="PPHGNetV2_B4_ocr_det")
    report = backbone.pretrained_report
    assert report["matched"] == sum(k.startswith("backbone.") for k in shapes) and report["unexpected"] == 0
    got = backbone.state_dict()
    assert all(np.array_equal(got[k].numpy(), v) for k, v in state.items() if k.startswith("backbone."))
