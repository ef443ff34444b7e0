"""Tests for the PaddleOCR-compatible DB text detectors (zoo.models.db).

The official layouts come from /work/shared/spec/*.keys (``name [shape]`` per
line). Where that folder is absent (e.g. a fresh clone), the same layouts are
checked through the counts and a sha256 fingerprint of the sorted lines.
"""

import hashlib

import numpy as np
import paddle
import pytest
from conftest import SPEC_DIR  # noqa: E402

from zoo.models import create_model, list_models
from zoo.weights.loading import compare_state_dict

# model -> (spec file, entries, trainable parameters, sha256 of the sorted spec lines)
SPECS = {
    "db_det": ("paddleocr_det_mv3_db.keys", 301, 1_844_136,
               "be3004947e51c4b96d958dc4d10a907068a2142c0b11506a95b565392df41a60"),
    "db_det_r50": ("paddleocr_det_r50_vd_db.keys", 309, 25_428_962,
                   "b322c6c085722e83b1d750a722edc93cabe260f61bf307bc0bf009fce71572c4"),
}


def layout_lines(model):
    """The model's state dict in the spec's ``name [d0, d1]`` format."""
    return [f"{k} {[int(d) for d in v.shape]}" for k, v in model.state_dict().items()]


def read_spec(model_name):
    """Spec lines for ``model_name``, or None when the spec folder is not available."""
    path = SPEC_DIR / SPECS[model_name][0]
    if not path.is_file():
        return None
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def spec_shapes(model_name, model):
    """name -> shape for the official layout (the spec file, else the model checked above)."""
    lines = read_spec(model_name) or layout_lines(model)
    out = {}
    for line in lines:
        name, shape = line.split(" ", 1)
        out[name] = tuple(int(d) for d in shape.strip("[]").split(",") if d.strip())
    return out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_state_dict_matches_official_layout(name):
    _, entries, params, digest = SPECS[name]
    model = create_model(name)
    lines = layout_lines(model)
    spec = read_spec(name)
    if spec is not None:
        diff = sorted(set(lines) ^ set(spec))
        assert not diff, f"differs from spec: {diff[:10]}"
    assert len(lines) == entries
    assert hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest() == digest
    trainable = sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)
    assert trainable == params


def test_registered_and_channels():
    assert {"db_det", "db_det_r50", "db_det_r18", "db_det_tiny"} <= set(list_models("db_det*"))
    assert create_model("db_det").backbone.out_channels == [16, 24, 56, 480]
    r18 = create_model("db_det_r18")
    assert r18.backbone.out_channels == [64, 128, 256, 512]
    assert r18.neck.out_channels == 256
    assert create_model("db_det_tiny", neck_channels=16).neck.out_channels == 16
    with pytest.raises(TypeError):
        create_model("db_det_tiny", no_such_option=1)


@pytest.mark.parametrize("name", ["db_det_tiny", "db_det", "db_det_r50"])
def test_forward_shapes(name):
    paddle.seed(0)
    model = create_model(name)
    x = paddle.randn([1, 3, 64, 64])
    assert model(x)["maps"].shape == [1, 3, 64, 64]
    model.eval()
    with paddle.no_grad():
        assert model(x)["maps"].shape == [1, 1, 64, 64]


def test_forward_non_square_batch():
    model = create_model("db_det_tiny")
    assert model(paddle.randn([2, 3, 32, 96]))["maps"].shape == [2, 3, 32, 96]


@pytest.mark.parametrize("name", ["db_det_tiny", "db_det"])
def test_backward_grads_finite(name):
    paddle.seed(1)
    model = create_model(name)
    model(paddle.randn([1, 3, 64, 64]))["maps"].sum().backward()
    params = [p for p in model.parameters() if not p.stop_gradient]
    assert all(p.grad is not None for p in params)
    assert all(np.isfinite(p.grad.numpy()).all() for p in params)
    # Both head branches take part in training.
    for branch in ("binarize", "thresh"):
        assert np.abs(getattr(model.head, branch).conv1.weight.grad.numpy()).sum() > 0


@pytest.mark.parametrize("k", [50, 1])
def test_binary_map_is_step_function(k):
    paddle.seed(2)
    model = create_model("db_det_tiny", k=k)
    maps = model(paddle.randn([1, 3, 64, 64]))["maps"].numpy().astype("float64")
    shrink, thresh, binary = maps[:, 0], maps[:, 1], maps[:, 2]
    expected = 1.0 / (1.0 + np.exp(-k * (shrink - thresh)))
    np.testing.assert_allclose(binary, expected, atol=1e-5)


def test_step_function_emits_exp(monkeypatch):
    """The fp16 recipes black-list ``exp``; the head must really call it."""
    calls = []
    real_exp = paddle.exp

    def counting_exp(x, *args, **kwargs):
        calls.append(x.shape)
        return real_exp(x, *args, **kwargs)

    monkeypatch.setattr(paddle, "exp", counting_exp)
    model = create_model("db_det_tiny")
    model(paddle.randn([1, 3, 32, 32]))
    assert calls == [[1, 1, 32, 32]]


# --- a hand-made checkpoint in PaddleOCR's layout ---

def random_checkpoint(shapes, seed=0):
    """Random arrays under the official names, scaled so activations stay moderate."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, shape in shapes.items():
        a = rng.standard_normal(shape)
        if len(shape) == 4:
            transposed = name.startswith("head.") and (".conv2." in name or ".conv3." in name)
            fan_in = shape[0] if transposed else int(np.prod(shape[1:]))
            a *= np.sqrt(1.0 / fan_in)
        elif name.endswith("_variance"):
            a = 1.0 + 0.1 * np.abs(a)
        elif name.endswith(".weight"):  # BatchNorm scale
            a = 1.0 + 0.1 * a
        else:  # BN shift, running mean, conv biases
            a *= 0.1
        state[name] = a.astype("float32")
    return state


def _bn(x, st, prefix):
    inv = st[prefix + ".weight"] / np.sqrt(st[prefix + "._variance"] + 1e-5)
    mean, shift = st[prefix + "._mean"], st[prefix + ".bias"]
    return (x - mean[:, None, None]) * inv[:, None, None] + shift[:, None, None]


def _conv(x, w, stride=1, groups=1, bias=None):
    """Plain numpy NCHW conv, 'same' padding for odd kernels."""
    n, cin, h, wd = x.shape
    cout, _, kh, kw = w.shape
    pad = (kh - 1) // 2
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    xg = x.reshape(n, groups, cin // groups, *x.shape[2:])
    wg = w.reshape(groups, cout // groups, cin // groups, kh, kw)
    out = np.zeros((n, groups, cout // groups, ho, wo))
    for i in range(kh):
        for j in range(kw):
            rows = slice(i, i + stride * (ho - 1) + 1, stride)
            cols = slice(j, j + stride * (wo - 1) + 1, stride)
            patch = xg[:, :, :, rows, cols]
            out += np.einsum("ngchw,goc->ngohw", patch, wg[:, :, :, i, j])
    out = out.reshape(n, cout, ho, wo)
    return out if bias is None else out + bias[None, :, None, None]


def _relu(x):
    return np.maximum(x, 0)


def _hardswish(x):
    return x * np.clip(x + 3, 0, 6) / 6


def _up(x, f):
    return x.repeat(f, axis=2).repeat(f, axis=3)


def _up_conv(x, w, b):
    """2x2 stride-2 transposed conv: every input pixel paints its own 2x2 patch."""
    n, _, h, wd = x.shape
    y = np.einsum("nchw,coab->nohawb", x, w).reshape(n, w.shape[1], 2 * h, 2 * wd)
    return y + b[None, :, None, None]


# MobileNetV3 large, unit by unit: stride and activation (the upstream table's last columns).
_MV3_LARGE = [(1, _relu), (2, _relu), (1, _relu), (2, _relu), (1, _relu), (1, _relu)] + \
    [(2, _hardswish)] + [(1, _hardswish)] * 5 + [(2, _hardswish)] + [(1, _hardswish)] * 2


def numpy_db_eval(st, x):
    """Eval-mode shrink map of det_mv3_db computed from a PaddleOCR state dict."""
    y = _hardswish(_bn(_conv(x, st["backbone.conv.conv.weight"], 2), st, "backbone.conv.bn"))
    feats, unit = [], 0
    for s in range(4):
        i = 0
        while f"backbone.stage{s}.{i}.expand_conv.conv.weight" in st:
            p = f"backbone.stage{s}.{i}."
            stride, act = _MV3_LARGE[unit]
            h = act(_bn(_conv(y, st[p + "expand_conv.conv.weight"]), st, p + "expand_conv.bn"))
            dw = st[p + "bottleneck_conv.conv.weight"]
            h = act(_bn(_conv(h, dw, stride, groups=dw.shape[0]), st, p + "bottleneck_conv.bn"))
            if p + "mid_se.conv1.weight" in st:
                g = _relu(_conv(h.mean(axis=(2, 3), keepdims=True), st[p + "mid_se.conv1.weight"],
                                bias=st[p + "mid_se.conv1.bias"]))
                g = _conv(g, st[p + "mid_se.conv2.weight"], bias=st[p + "mid_se.conv2.bias"])
                h = h * np.clip(0.2 * g + 0.5, 0, 1)
            h = _bn(_conv(h, st[p + "linear_conv.conv.weight"]), st, p + "linear_conv.bn")
            y = y + h if stride == 1 and h.shape == y.shape else h
            i, unit = i + 1, unit + 1
        if s == 3:
            p = f"backbone.stage3.{i}."  # the final 1x1 conv closes the last stage
            y = _hardswish(_bn(_conv(y, st[p + "conv.weight"]), st, p + "bn"))
        feats.append(y)
    ins = [_conv(f, st[f"neck.in{j}_conv.weight"]) for f, j in zip(feats, (2, 3, 4, 5))]
    out4 = ins[2] + _up(ins[3], 2)
    out3 = ins[1] + _up(out4, 2)
    out2 = ins[0] + _up(out3, 2)
    ps = [_up(_conv(t, st[f"neck.p{j}_conv.weight"]), f)
          for t, j, f in ((ins[3], 5, 8), (out4, 4, 4), (out3, 3, 2), (out2, 2, 1))]
    h, b = np.concatenate(ps, axis=1), "head.binarize."
    h = _relu(_bn(_conv(h, st[b + "conv1.weight"]), st, b + "conv_bn1"))
    h = _relu(_bn(_up_conv(h, st[b + "conv2.weight"], st[b + "conv2.bias"]), st, b + "conv_bn2"))
    return 1.0 / (1.0 + np.exp(-_up_conv(h, st[b + "conv3.weight"], st[b + "conv3.bias"])))


def test_paddleocr_checkpoint_loads_and_drives_outputs(tmp_path):
    shapes = spec_shapes("db_det", create_model("db_det"))
    state = random_checkpoint(shapes)
    path = tmp_path / "det_mv3_db_train.pdparams"
    paddle.save(state, str(path))

    first, second = create_model("db_det", pretrained=str(path)), create_model("db_det")
    missing, unexpected = second.set_state_dict(paddle.load(str(path)))
    assert (missing, unexpected) == ([], [])
    report = compare_state_dict(first.state_dict(), state)
    assert (report["missing"], report["unexpected"], report["shape_mismatch"]) == ([], [], [])
    for k, v in first.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), state[k], err_msg=k)

    x = np.random.default_rng(3).standard_normal((1, 3, 64, 64)).astype("float32")
    first.eval(), second.eval()
    with paddle.no_grad():
        out1 = first(paddle.to_tensor(x))["maps"].numpy()
        out2 = second(paddle.to_tensor(x))["maps"].numpy()
    np.testing.assert_array_equal(out1, out2)
    # Not saturated, so the comparison below says something about every layer: the float32
    # model is ~1e-7 off the float64 reference, while moving one stage-2 BN mean by 0.1
    # moves the output by ~1e-3.
    assert 0.01 < out1.std() and 0.05 < out1.mean() < 0.95
    np.testing.assert_allclose(out1, numpy_db_eval(state, x.astype("float64")), atol=1e-5)


def test_backbone_checkpoint_without_prefix_loads():
    model = create_model("db_det")
    full = random_checkpoint(spec_shapes("db_det", model), seed=5)
    backbone_state = {k[len("backbone."):]: v for k, v in full.items() if k.startswith("backbone.")}
    missing, unexpected = model.backbone.set_state_dict(backbone_state)
    assert (missing, unexpected) == ([], [])
    for k, v in model.backbone.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), backbone_state[k], err_msg=k)


def test_paddleocr_train_tar_and_backbone_only_files_load(tmp_path):
    """PaddleOCR ships DB as det_*_train.tar holding best_accuracy.pdparams; backbones lack the prefix."""
    import tarfile

    import zoo
    from zoo.weights.loading import load_checkpoint

    paddle.seed(3)
    src = zoo.create_model("db_det_tiny")
    folder = tmp_path / "det_tiny_db_v2.0_train"
    folder.mkdir()
    paddle.save(src.state_dict(), str(folder / "best_accuracy.pdparams"))
    (folder / "train.log").write_text("not weights")
    tar_path = tmp_path / "det_tiny_db_v2.0_train.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(folder, arcname=folder.name)
    loaded = zoo.create_model("db_det_tiny", pretrained=str(tar_path))
    for k, v in src.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[k].numpy(), v.numpy())

    backbone_file = tmp_path / "backbone.pdparams"
    paddle.save(src.backbone.state_dict(), str(backbone_file))
    fresh = zoo.create_model("db_det_tiny")
    report = load_checkpoint(fresh, str(backbone_file))
    assert not report["unexpected"] and not report["shape_mismatch"]
    assert all(k.startswith(("neck.", "head.")) for k in report["missing"])
    np.testing.assert_array_equal(fresh.backbone.conv.conv.weight.numpy(), src.backbone.conv.conv.weight.numpy())


def test_tar_without_a_single_weights_file_is_refused_by_name(tmp_path):
    import io
    import tarfile

    import zoo

    tar_path = tmp_path / "det_x_train.tar"
    with tarfile.open(tar_path, "w") as tar:
        for name in ("a/model_1.pdparams", "a/model_2.pdparams"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(ValueError, match="det_x_train.tar: expected one best_accuracy.pdparams"):
        zoo.create_model("db_det_tiny", pretrained=str(tar_path))
