"""PP-YOLOE network: official layout, widths, checkpoint loading, outputs, anchors, decoding, gradients."""
from __future__ import annotations

import json

import numpy as np
import paddle
import pytest
from conftest import SPEC_DIR

import zoo
from zoo.models.heads.ppyoloe_head import decode_distribution
from zoo.weights.loading import load_checkpoint

SPEC = SPEC_DIR / "paddledet_ppyoloe_crn_s_300e_coco.keys"


def read_spec(path=SPEC):
    """{name: shape} from a `name [d0, d1, ...]` keys file."""
    spec = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        name, _, shape = line.partition(" ")
        try:
            spec[name] = tuple(json.loads(shape))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: expected 'name [shape]', got {line!r}") from exc
    return spec


def numel_state(model):
    return sum(int(np.prod(v.shape)) for v in model.state_dict().values())


# ---- independent parameter count from upstream's structure (cspresnet.py, custom_pan.py, ppyoloe_head.py)
def _convbn(cin, cout, k):
    return k * k * cin * cout + 4 * cout  # conv without bias + BN weight, bias, mean, variance


def _basic(c):
    return _convbn(c, c, 3) + _convbn(c, c, 3) + _convbn(c, c, 1)  # ConvBN 3x3 + RepVgg (3x3 + 1x1)


def _csp_stage(cin, cout, n, spp):
    mid = cout // 2
    return 2 * _convbn(cin, mid, 1) + n * _basic(mid) + (_convbn(4 * mid, mid, 1) if spp else 0) \
        + _convbn(2 * mid, cout, 1)


def expected_state_numel(width, depth, num_classes=80, reg_max=16):
    ch = [max(round(c * width), 1) for c in (64, 128, 256, 512, 1024)]
    layers = [max(round(n * depth), 1) for n in (3, 6, 6, 3)]
    total = _convbn(3, ch[0] // 2, 3) + _convbn(ch[0] // 2, ch[0] // 2, 3) + _convbn(ch[0] // 2, ch[0], 3)
    for i in range(4):
        mid = (ch[i] + ch[i + 1]) // 2
        total += _convbn(ch[i], mid, 3) + 2 * _convbn(mid, mid // 2, 1) + layers[i] * _basic(mid // 2)
        total += mid * mid + mid + _convbn(mid, ch[i + 1], 1)  # EffectiveSE fc (with bias) + conv3
    o = [max(round(c * width), 1) for c in (768, 384, 192)]
    n = max(round(3 * depth), 1)
    c2, c3, c4 = ch[2], ch[3], ch[4]
    total += _csp_stage(c4, o[0], n, True) + _convbn(o[0], o[0] // 2, 1)
    total += _csp_stage(c3 + o[0] // 2, o[1], n, False) + _convbn(o[1], o[1] // 2, 1)
    total += _csp_stage(c2 + o[1] // 2, o[2], n, False)
    for i in (1, 0):
        total += _convbn(o[i + 1], o[i + 1], 3) + _csp_stage(o[i] + o[i + 1], o[i], n, False)
    bins = reg_max + 1
    for c in o:
        total += 2 * (c * c + c + _convbn(c, c, 1))  # stem_cls, stem_reg: fc + ConvBN
        total += 9 * c * num_classes + num_classes + 9 * c * 4 * bins + 4 * bins
    return total + bins  # proj_conv


@pytest.fixture(scope="module")
def model_s():
    paddle.seed(0)
    return zoo.create_model("ppyoloe_s")


def test_s_state_dict_matches_official_layout(model_s):
    spec = read_spec()
    assert len(spec) == 423
    mine = {k: tuple(v.shape) for k, v in model_s.state_dict().items()}
    assert sorted(set(spec) - set(mine)) == []
    assert sorted(set(mine) - set(spec)) == []
    assert {k: s for k, s in mine.items() if spec[k] != s} == {}
    assert numel_state(model_s) == 8_105_517
    assert expected_state_numel(0.50, 0.33) == 8_105_517  # the independent counter agrees with the spec


@pytest.mark.parametrize("name,width,depth,neck_out", [
    ("ppyoloe_s", 0.50, 0.33, [384, 192, 96]),
    ("ppyoloe_m", 0.75, 0.67, [576, 288, 144]),
    ("ppyoloe_l", 1.00, 1.00, [768, 384, 192]),
    ("ppyoloe_x", 1.25, 1.33, [960, 480, 240]),
])
def test_variant_widths_and_sizes(name, width, depth, neck_out):
    model = zoo.create_model(name)
    assert model.neck.out_channels == neck_out
    assert model.yolo_head.in_channels == neck_out
    assert numel_state(model) == expected_state_numel(width, depth)
    # depth: round(n * depth) blocks per backbone stage (upstream rounding)
    blocks = [len(stage.blocks) for stage in model.backbone.stages]
    assert blocks == {0.33: [1, 2, 2, 1], 0.67: [2, 4, 4, 2], 1.0: [3, 6, 6, 3], 1.33: [4, 8, 8, 4]}[depth]


def test_official_checkpoint_layout_loads(tmp_path, model_s):
    rng = np.random.default_rng(0)
    spec = read_spec()
    ckpt = {k: rng.standard_normal(s).astype("float32") for k, s in spec.items()}
    ckpt["yolo_head.anchor_points"] = rng.random((8400, 2)).astype("float32")
    ckpt["yolo_head.stride_tensor"] = np.full((8400, 1), 8.0, dtype="float32")
    path = tmp_path / "ppyoloe_crn_s_300e_coco.pdparams"
    paddle.save(ckpt, str(path))

    model = zoo.create_model("ppyoloe_s", pretrained=str(path))
    state = model.state_dict()
    for key in ("backbone.stem.conv1.conv.weight", "neck.fpn_stages.0.0.convs.spp.conv.bn._variance",
                "yolo_head.pred_reg.2.bias", "yolo_head.proj_conv.weight"):
        np.testing.assert_array_equal(state[key].numpy(), ckpt[key])
    assert all(np.array_equal(v.numpy(), ckpt[k]) for k, v in state.items())

    report = load_checkpoint(model_s, str(path))
    assert report["missing"] == [] and report["shape_mismatch"] == []
    assert report["unexpected"] == ["yolo_head.anchor_points", "yolo_head.stride_tensor"]


@pytest.fixture(scope="module")
def tiny():
    paddle.seed(0)
    return zoo.create_model("ppyoloe_tiny", num_classes=3)


@pytest.mark.parametrize("h,w", [(128, 128), (160, 96)])
def test_tiny_output_shapes(tiny, h, w):
    x = paddle.randn([2, 3, h, w])
    a = sum((h // s) * (w // s) for s in (8, 16, 32))
    tiny.train()
    out = tiny(x)
    assert out["num_anchors_list"] == [(h // s) * (w // s) for s in (32, 16, 8)]
    assert out["cls_logits"].shape == [2, a, 3]
    assert out["reg_distri"].shape == [2, a, 68]
    assert out["anchor_points"].shape == [a, 2]
    assert out["stride_tensor"].shape == [a, 1]
    assert out["anchors"].shape == [a, 4]
    tiny.eval()
    out = tiny(x)
    assert set(out) == {"boxes", "scores"}
    assert out["boxes"].shape == [2, a, 4]
    assert out["scores"].shape == [2, 3, a]
    tiny.train()


def test_head_init_as_upstream(tiny):
    head = tiny.yolo_head
    np.testing.assert_array_equal(head.proj_conv.weight.numpy().ravel(), np.arange(17, dtype="float32"))
    assert head.proj_conv.weight.stop_gradient
    for conv in list(head.pred_cls) + list(head.pred_reg):
        assert not conv.weight.numpy().any()
    np.testing.assert_allclose(head.pred_cls[0].bias.numpy(), -4.59511985, rtol=1e-6)  # -log(0.99 / 0.01)
    np.testing.assert_array_equal(head.pred_reg[1].bias.numpy(), np.ones(68, "float32"))
    fc = head.stem_reg[2].fc.weight.numpy()
    assert 0.0005 < fc.std() < 0.002 and not head.stem_reg[2].fc.bias.numpy().any()  # N(0, 0.001), bias 0
    bn = tiny.backbone.stem.conv1.bn
    assert bn.weight.regularizer is not None and bn.weight.regularizer._coeff == 0.0
    tiny.eval()
    out = tiny(paddle.randn([1, 3, 64, 64]))
    tiny.train()
    np.testing.assert_allclose(out["scores"].numpy(), 0.01, rtol=1e-5)  # prior probability
    # uniform bins (all biases 1) -> expectation 8 strides on every side
    b = out["boxes"].numpy()[0, 0]  # stride 32, centre (16, 16)
    np.testing.assert_allclose(b, [16 - 256, 16 - 256, 16 + 256, 16 + 256], rtol=1e-5)


def test_anchors_hand_computed(tiny):
    out = tiny(paddle.zeros([1, 3, 64, 96]))
    pts, anchors, strides = (out[k].numpy() for k in ("anchor_points", "anchors", "stride_tensor"))
    assert out["num_anchors_list"] == [6, 24, 96]
    np.testing.assert_array_equal(pts[:6], [[16, 16], [48, 16], [80, 16], [16, 48], [48, 48], [80, 48]])
    np.testing.assert_array_equal(anchors[:2], [[-64, -64, 96, 96], [-32, -64, 128, 96]])  # +- 5 * 32 / 2
    np.testing.assert_array_equal(pts[6:9], [[8, 8], [24, 8], [40, 8]])
    np.testing.assert_array_equal(pts[6 + 6], [8, 24])  # second row of the stride-16 level
    np.testing.assert_array_equal(anchors[6], [-32, -32, 48, 48])
    np.testing.assert_array_equal(pts[-1], [92, 60])  # stride 8, (11.5, 7.5) * 8
    np.testing.assert_array_equal(anchors[-1], [72, 40, 112, 80])
    np.testing.assert_array_equal(strides.ravel(), [32] * 6 + [16] * 24 + [8] * 96)


def test_eval_boxes_from_hand_set_distribution(tiny):
    # Zero pred weights, so every anchor's logits are the bias: sides l, t, r, b put their mass on
    # bins (1 and 2 equally), 2, 3, 4 -> distances 1.5, 2, 3, 4 strides.
    saved = [(c.weight.numpy(), c.bias.numpy()) for c in tiny.yolo_head.pred_reg]
    bias = np.zeros(68, "float32")
    bias[0 * 17 + 1] = bias[0 * 17 + 2] = 60.0
    bias[1 * 17 + 2] = bias[2 * 17 + 3] = bias[3 * 17 + 4] = 60.0
    for conv in tiny.yolo_head.pred_reg:
        conv.weight.set_value(np.zeros(conv.weight.shape, "float32"))
        conv.bias.set_value(bias)
    tiny.eval()
    try:
        boxes = tiny(paddle.randn([1, 3, 64, 96]))["boxes"].numpy()[0]
    finally:
        tiny.train()
        for conv, (wt, bs) in zip(tiny.yolo_head.pred_reg, saved):
            conv.weight.set_value(wt)
            conv.bias.set_value(bs)
    expected = []
    for s in (32, 16, 8):
        ys, xs = np.meshgrid((np.arange(64 // s) + 0.5) * s, (np.arange(96 // s) + 0.5) * s, indexing="ij")
        cx, cy = xs.ravel(), ys.ravel()
        expected.append(np.stack([cx - 1.5 * s, cy - 2 * s, cx + 3 * s, cy + 4 * s], axis=1))
    np.testing.assert_allclose(boxes, np.concatenate(expected), atol=1e-4)


def test_decode_distribution_matches_numpy():
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3, (2, 5, 68)).astype("float32")
    points = rng.uniform(0, 100, (5, 2)).astype("float32")
    strides = np.array([[8], [8], [16], [32], [32]], "float32")
    z = logits.reshape(2, 5, 4, 17)
    p = np.exp(z - z.max(-1, keepdims=True))
    d = (p / p.sum(-1, keepdims=True) * np.arange(17)).sum(-1)  # [2, 5, 4] in strides
    c = points / strides
    ref = np.concatenate([c - d[..., :2], c + d[..., 2:]], -1) * strides
    got = decode_distribution(paddle.to_tensor(logits), paddle.to_tensor(points), paddle.to_tensor(strides))
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="4 \\* \\(reg_max \\+ 1\\)"):
        decode_distribution(paddle.to_tensor(logits[..., :64]), paddle.to_tensor(points),
                            paddle.to_tensor(strides))


def test_backward_gives_finite_grads():
    paddle.seed(1)
    tiny = zoo.create_model("ppyoloe_tiny", num_classes=3)
    for conv in list(tiny.yolo_head.pred_cls) + list(tiny.yolo_head.pred_reg):
        conv.weight.set_value(paddle.randn(conv.weight.shape) * 0.01)  # zero init blocks the gradient
    tiny.train()
    out = tiny(paddle.randn([2, 3, 128, 128]))
    loss = paddle.nn.functional.sigmoid(out["cls_logits"]).mean() + out["reg_distri"].square().mean()
    loss.backward()
    grads = {n: p.grad for n, p in tiny.named_parameters() if not p.stop_gradient}
    assert all(g is not None and np.isfinite(g.numpy()).all() for g in grads.values())
    assert np.abs(grads["backbone.stem.conv1.conv.weight"].numpy()).sum() > 0
    assert tiny.yolo_head.proj_conv.weight.grad is None


def test_input_size_must_be_multiple_of_32(tiny):
    with pytest.raises(ValueError, match="multiples of 32"):
        tiny(paddle.zeros([1, 3, 100, 128]))

