"""Tests for the model registry and the PaddleClas-compatible ResNets."""

import functools
import logging

import numpy as np
import paddle
import pytest

import zoo
from zoo.models import (
    UnknownModelError,
    create_model,
    list_models,
    register_model,
    registry,
)
from zoo.models.resnet import ResNet
from zoo.weights.loading import compare_state_dict

ALL_MODELS = [
    "resnet18", "resnet34", "resnet50", "resnet101",
    "resnet18_vd", "resnet34_vd", "resnet50_vd", "resnet101_vd", "resnet_tiny",
]
SLOW_MODELS = {"resnet101", "resnet101_vd"}  # ~2 s each to build and step on 2 cores
BN_ENTRIES = ("weight", "bias", "_mean", "_variance")


# --- expected PaddleClas layout, written out from the architecture table ---

def expected_layout(stem, block, stage_depths=(3, 4, 6, 3),
                    widths=(64, 128, 256, 512), num_classes=1000):
    """Names -> shapes of PaddleClas legendary ResNet, built from the naming rule.

    stem "b" is one 7x7 conv to 64; "vd" is 3x3 convs 3->32->32->64. Blocks
    are numbered continuously across stages; the first block of every stage
    has a ``short`` 1x1 projection.
    """
    layout = {}

    def conv_bn(prefix, cin, cout, k):
        layout[f"{prefix}.conv.weight"] = (cout, cin, k, k)
        for entry in BN_ENTRIES:
            layout[f"{prefix}.bn.{entry}"] = (cout,)

    if stem == "b":
        conv_bn("stem.0", 3, 64, 7)
    else:
        conv_bn("stem.0", 3, 32, 3)
        conv_bn("stem.1", 32, 32, 3)
        conv_bn("stem.2", 32, 64, 3)
    expansion = 4 if block == "bottleneck" else 1
    cin, k = 64, 0
    for depth, width in zip(stage_depths, widths):
        for i in range(depth):
            cout = width * expansion
            if block == "bottleneck":
                conv_bn(f"blocks.{k}.conv0", cin, width, 1)
                conv_bn(f"blocks.{k}.conv1", width, width, 3)
                conv_bn(f"blocks.{k}.conv2", width, cout, 1)
            else:
                conv_bn(f"blocks.{k}.conv0", cin, width, 3)
                conv_bn(f"blocks.{k}.conv1", width, width, 3)
            if i == 0:
                conv_bn(f"blocks.{k}.short", cin, cout, 1)
            cin, k = cout, k + 1
    layout["fc.weight"] = (cin, num_classes)  # Paddle Linear is [in, out]
    layout["fc.bias"] = (num_classes,)
    return layout


@functools.lru_cache(maxsize=None)
def layout_of(name):
    """Names -> shapes of the default (1000-class) registered model; built once per name."""
    return {k: tuple(v.shape) for k, v in create_model(name).state_dict().items()}


@pytest.mark.parametrize("name, stem, block, count", [
    ("resnet50", "b", "bottleneck", 267),
    ("resnet50_vd", "vd", "bottleneck", 277),
    ("resnet18", "b", "basic", 107),
    ("resnet18_vd", "vd", "basic", 117),
])
def test_state_dict_matches_paddleclas(name, stem, block, count):
    depths = (2, 2, 2, 2) if name.startswith("resnet18") else (3, 4, 6, 3)
    expected = expected_layout(stem, block, stage_depths=depths)
    got = layout_of(name)
    assert len(expected) == count
    assert len(got) == count
    assert set(got.items()) == set(expected.items())


def test_literal_paddleclas_keys():
    r50 = layout_of("resnet50")
    assert r50["stem.0.conv.weight"] == (64, 3, 7, 7)
    assert r50["blocks.15.conv2.bn._variance"] == (2048,)
    assert "blocks.16.conv0.conv.weight" not in r50
    vd = layout_of("resnet50_vd")
    assert vd["stem.0.conv.weight"] == (32, 3, 3, 3)
    assert vd["stem.2.conv.weight"] == (64, 32, 3, 3)
    assert vd["blocks.0.short.conv.weight"] == (256, 64, 1, 1)
    assert vd["blocks.3.short.conv.weight"] == (512, 256, 1, 1)
    assert vd["fc.weight"] == (2048, 1000)
    assert vd["fc.bias"] == (1000,)
    r18 = layout_of("resnet18")
    assert r18["blocks.0.short.conv.weight"] == (64, 64, 1, 1)


# --- every registered model trains a step at tiny size ---

def test_all_models_registered():
    assert set(ALL_MODELS) <= set(list_models())
    assert zoo.list_models() == list_models()
    assert list_models("resnet50*") == ["resnet50", "resnet50_vd"]


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in SLOW_MODELS else n for n in ALL_MODELS
])
def test_forward_backward(name):
    paddle.seed(0)
    model = create_model(name, num_classes=10)
    x = paddle.randn([2, 3, 32, 32])
    model.train()
    logits = model(x)
    assert logits.shape == [2, 10]
    logits.mean().backward()
    grad = model.fc.weight.grad
    assert grad is not None and bool(paddle.isfinite(grad).all())
    model.eval()
    with paddle.no_grad():
        assert model(x).shape == [2, 10]


def test_tiny_features_and_variants():
    model = create_model("resnet_tiny")
    assert model.out_channels == 64
    feats = model.forward_features(paddle.zeros([1, 3, 64, 64]))
    assert feats.shape == [1, 64, 2, 2]
    # vd: avg-pool shortcut on downsampling blocks, plain conv on the first.
    assert model.blocks[0].short.pool is None
    assert isinstance(model.blocks[1].short.pool, paddle.nn.AvgPool2D)
    plain = create_model("resnet_tiny", variant="b", depth=50)
    assert plain.out_channels == 256 and plain.blocks[1].short.pool is None


@pytest.mark.parametrize("kwargs, match", [
    (dict(depth=42), r"allowed: \[18, 34, 50, 101\]"),
    (dict(depth=18, variant="vc"), r"allowed: \['b', 'vd'\]"),
    (dict(depth=18, widths=[8, 16]), "widths"),
    (dict(depth=18, stage_depths=[1, 1, 0, 1]), "stage_depths"),
    (dict(depth=18, num_classes=0), "num_classes"),
])
def test_resnet_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResNet(**kwargs)


# --- registry behaviour ---

def test_unknown_model_lists_known():
    with pytest.raises(UnknownModelError) as info:
        create_model("resnet9000")
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert message.startswith("unknown model 'resnet9000'; known: ")
    assert "resnet50_vd" in message and "resnet_tiny" in message


def test_register_duplicate_and_new(monkeypatch):
    monkeypatch.setattr(registry, "_MODEL_REGISTRY", dict(registry._MODEL_REGISTRY))

    def my_net(**kwargs):
        return paddle.nn.Linear(2, kwargs.get("out", 3))

    register_model(my_net)
    assert "my_net" in list_models()
    assert create_model("my_net", out=5).weight.shape == [2, 5]
    with pytest.raises(ValueError, match="already registered"):
        register_model(my_net)


def test_pretrained_round_trip(tmp_path, caplog):
    paddle.seed(1)
    source = create_model("resnet_tiny", num_classes=10)
    path = tmp_path / "tiny.pdparams"
    paddle.save(source.state_dict(), str(path))
    paddle.seed(2)  # a different init, so equality below comes from loading
    with caplog.at_level(logging.INFO, logger=registry.__name__):
        loaded = create_model("resnet_tiny", pretrained=str(path), num_classes=10)
    want, got = source.state_dict(), loaded.state_dict()
    assert set(want) == set(got)
    for key in want:
        np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)
    assert "matched=" in caplog.text and "missing=0" in caplog.text


def test_pretrained_shape_mismatch_is_reported(tmp_path, caplog):
    path = tmp_path / "five.pdparams"
    paddle.save(create_model("resnet_tiny", num_classes=5).state_dict(), str(path))
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        model = create_model("resnet_tiny", pretrained=path, num_classes=10)
    assert model.fc.weight.shape == [64, 10]
    assert "shape_mismatch=2" in caplog.text and "fc.weight" in caplog.text


def test_pretrained_missing_file_and_names():
    with pytest.raises(FileNotFoundError, match="nonexistent.pdparams"):
        create_model("resnet_tiny", pretrained="nonexistent.pdparams")
    # a name that is neither a file nor a registry entry lists the known names (URLs: test_weights_download)
    with pytest.raises(ValueError, match="known: .*ResNet50_vd_ssld"):
        create_model("resnet_tiny", pretrained="NoSuchWeights")


def test_compare_state_dict_hand_made():
    model_state = {"a": np.zeros((2, 3)), "b": np.zeros(4), "c": np.zeros(1)}
    ckpt_state = {"a": np.ones((2, 3)), "b": np.zeros(5), "d": np.zeros(1)}
    report = compare_state_dict(model_state, ckpt_state)
    assert report == {
        "matched": ["a"],
        "missing": ["c"],
        "unexpected": ["d"],
        "shape_mismatch": ["b"],
    }
