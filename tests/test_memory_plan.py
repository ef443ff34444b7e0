"""The memory planner (tools/amp_doctor.py --memory): bytes of a net small enough to count by hand,
the batch line and the largest batch, the card names, and the tool end to end on a tiny model."""
from __future__ import annotations

import json

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from conftest import ROOT, run_tool

from zoo.amp import Amp
from zoo.amp import emulation as emu
from zoo.diagnostics import memory as M


class Small(paddle.nn.Layer):
    """conv 1->2 (3x3, pad 1, no bias) -> BatchNorm(2) -> flatten -> linear 32->3, on 1x4x4 inputs."""

    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(1, 2, 3, padding=1, bias_attr=False)
        self.bn = paddle.nn.BatchNorm2D(2)
        self.fc = paddle.nn.Linear(32, 3)

    def forward(self, x):
        return self.fc(paddle.flatten(self.bn(self.conv(x)), 1))


class SumTask:
    def losses(self, model, batch):
        return {"loss": model(batch).sum()}   # sum's backward reads no tensor


def _net():
    paddle.seed(0)
    net = Small()
    net.train()
    return net


def _batch(b):
    return paddle.to_tensor(np.random.RandomState(b).randn(b, 1, 4, 4).astype("float32"))


FP32 = Amp(name="fp32", enabled=False)
O1 = Amp(name="O1", enabled=True, level="O1", dtype="float16")


# ---- parameters, gradients, optimizer state, by hand ----------------------------------------------
# entries: conv.weight 2*1*3*3 = 18; bn.weight 2, bn.bias 2; fc.weight 32*3 = 96, fc.bias 3 -> 121
# trainable; BatchNorm's buffers _mean 2, _variance 2 -> 4 more.
TRAINABLE = 18 + 2 + 2 + 96 + 3          # 121


def test_state_bytes_in_fp32_and_o1_by_hand():
    for level in ("fp32", "O1"):      # O1 leaves parameters, gradients and Adam's state in fp32
        s = M.state_bytes(_net(), level, "float16", "paddle.optimizer.Adam", multi_precision=True)
        assert s["parameters"].raw == (TRAINABLE + 4) * 4 == 500
        # fc.weight's 384 B take two 256 B units, the six other tensors one each
        assert s["parameters"].count == 7 and s["parameters"].rounded == 6 * 256 + 512
        assert s["gradients"].raw == TRAINABLE * 4 == 484
        # Adam: two fp32 moments per parameter, plus beta1_pow and beta2_pow (1 fp32 entry each) x 5
        assert s["optimizer"].raw == 2 * 484 + 5 * 2 * 4 == 1008
        assert s["master_weights"].raw == 0
    m = M.state_bytes(_net(), "fp32", "float16", "paddle.optimizer.Momentum", multi_precision=True)
    assert m["optimizer"].raw == 484          # one velocity


def test_state_bytes_at_o2_by_hand():
    net = _net()
    emu.mark_o2_parameters(net, "float16")    # all but BatchNorm cast to fp16
    s = M.state_bytes(net, "O2", "float16", "paddle.optimizer.Adam", multi_precision=True)
    low = 18 + 96 + 3                         # conv.weight, fc.weight, fc.bias: 117 fp16 entries
    assert s["parameters"].raw == low * 2 + (2 + 2) * 4 + 4 * 4 == 266
    assert s["gradients"].raw == low * 2 + 4 * 4 == 250           # master_grad false: stored fp16
    assert s["master_weights"].raw == low * 4 == 468
    assert s["optimizer"].raw == 1008                              # multi_precision: fp32 moments
    g = M.state_bytes(net, "O2", "float16", "paddle.optimizer.Adam", multi_precision=True, master_grad=True)
    assert g["gradients"].raw == 484
    n = M.state_bytes(net, "O2", "float16", "paddle.optimizer.Adam", multi_precision=False, master_weight=False)
    assert n["master_weights"].raw == 0 and n["optimizer"].raw == 2 * (low * 2 + 4 * 4) + 40


# ---- saved activations, by hand ---------------------------------------------------------------------
def fp32_saved(b):
    """conv2d keeps x, the batch itself (its b*1*4*4 fp32 = 64b B are the batch row; its weight is
    the parameter itself); batch_norm keeps x (the conv output, b*2*4*4 fp32 = 128b B) and saved
    mean and variance (2 + 2 fp32 = 16 B); flatten keeps nothing; linear keeps x (the flattened map,
    a view of the BatchNorm output: b*32 fp32 = 128b B) and its weight (the parameter); sum keeps
    nothing."""
    return 128 * b + 16 + 128 * b


def o1_saved(b):
    """conv2d is white: x is kept as its fp16 cast (16b * 2 = 32b B) and the fp32 weight as its fp16
    copy (18 * 2 = 36 B); batch_norm follows its fp16 x (32b * 2 = 64b B; saved mean and variance
    stay fp32, 16 B); flatten follows (fp16); linear's matmul is white: x fp16 (32b * 2 = 64b B) and
    the weight's fp16 copy (96 * 2 = 192 B)."""
    return 32 * b + 36 + 64 * b + 16 + 64 * b + 192


@pytest.mark.parametrize("b", [1, 2])
def test_saved_activations_by_hand(b):
    t = M.trace(_net(), SumTask(), _batch(b), FP32)
    assert t["activations"]["bytes"] == fp32_saved(b) == 256 * b + 16
    assert t["activations"]["tensors"] == 4 and t["weight_casts"] == 0
    assert t["largest"] == 128 * b                    # the conv / BatchNorm outputs, 2*4*4 fp32 each
    assert t["batch"]["bytes"] == 64 * b
    t = M.trace(_net(), SumTask(), _batch(b), O1)
    assert t["activations"]["bytes"] == o1_saved(b) == 160 * b + 244
    assert t["weight_casts"] == 36 + 192
    assert t["activations"]["allocated"] == 7 * 256   # seven tensors, each under 256 B


# ---- what an op keeps, by hand, and checked against Paddle's own host allocator ------------------
class Chain(paddle.nn.Layer):
    """``h = x + w`` (w a 4x4 parameter over b x 1 x 4 x 4 inputs; add keeps nothing), then
    ``fn(h)``, summed (sum keeps nothing): what is kept is what ``fn`` keeps."""

    def __init__(self, fn, layer=None):
        super().__init__()
        self.w = self.create_parameter([4, 4])
        self.fn, self.layer = fn, layer       # a layer's weights are parameters, not counted

    def forward(self, x):
        h = x + self.w
        return (self.fn(h) if self.layer is None else self.fn(h, self.layer)).sum()


B = 2
MAP = B * 16 * 4        # one b x 1 x 4 x 4 fp32 map: 128 B
KEPT = {                # op(s) applied to h -> bytes its backward keeps, by hand
    # a Tensor operator with a number is Paddle's scale: nothing kept
    "scalar": (lambda h: (1 - h * 2.0) / 4.0, 0),
    # multiply keeps h; divide_grad reads x, y and out: h (once), h * h and the quotient
    "divide": (lambda h: h / (h * h), 3 * MAP),
    "silu": (lambda h: F.silu(h), 2 * MAP),                                   # x and out
    "max": (lambda h: h.max(1), MAP + MAP),                                   # x and out (b x 4 x 4)
    "cumsum": (lambda h: paddle.cumsum(h, 2), MAP),                           # x
    # the array and the int64 index (b x 1 x 1 x 4: 8 B each)
    "take_along_axis": (lambda h: paddle.take_along_axis(h, paddle.zeros([B, 1, 1, 4], "int64"), 2),
                        MAP + B * 4 * 8),
    # x (a view of h: all of h) and the int64 indices (b x 3)
    "topk": (lambda h: paddle.topk(h.reshape([B, 16]), 3)[0], MAP + B * 3 * 8),
    "masked_select": (lambda h: paddle.masked_select(h, h > 0), B * 16),      # the bool mask only
    # squeeze-and-excitation: pool2d keeps h (through the copy x._use_gpudnn(False)) and the
    # pooled b x 1 x 1 x 1, multiply the same two; relu its output, which the reshape views and
    # ** 2 keeps through that view: h + pooled + relu's output
    "pool_and_views": (lambda h: F.relu(h * F.adaptive_avg_pool2d(h, 1)).reshape([B, -1]) ** 2,
                       2 * MAP + B * 4),
    # a slice keeps its base: the second channel of a 2-channel concat (concat and scale keep
    # nothing), squared by multiply, keeps both channels ...
    "slice_keeps_base": (lambda h: (lambda s: s * s)(paddle.concat([h, h + 1.0], 1)[:, 1]), 2 * MAP),
    # ... unless the op takes contiguous inputs (pow): it keeps the copy made for it, one channel
    "slice_copied": (lambda h: paddle.concat([h, h + 1.0], 1)[:, 1] ** 2, MAP),
    "tril": (lambda h: paddle.tril(h), 0),                                    # nothing
    # DB's ops: DBFPN's nearest upsampling and concat keep nothing; the binarisation step
    # 1 / (1 + exp(-k (P - T))) keeps exp's and reciprocal's outputs (k * and 1 + are scale),
    # here with P - T = h - h * h (multiply keeps h); hardswish keeps x, sigmoid its output
    "nearest_concat": (lambda h: paddle.concat([F.interpolate(h, scale_factor=2, mode="nearest")] * 2, 1), 0),
    "binarisation": (lambda h: paddle.reciprocal(1 + paddle.exp(-50 * (h - h * h))), 3 * MAP),
    "hardswish_sigmoid": (lambda h: F.sigmoid(F.hardswish(h)), 2 * MAP),
    # DB head's 2x2 stride-2 transposed conv and a depthwise conv keep their input (h)
    "conv2d_transpose": (lambda h, conv: conv(h), MAP, lambda: paddle.nn.Conv2DTranspose(1, 1, 2, stride=2)),
    "depthwise_conv2d": (lambda h, conv: conv(paddle.concat([h, h * 3.0], 1)), 2 * MAP,
                         lambda: paddle.nn.Conv2D(2, 2, 3, padding=1, groups=2)),
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_what_an_op_keeps_by_hand_and_by_paddles_allocator(case):
    import gc

    from paddle.base import core

    fn, want, *layer = KEPT[case]

    def chain():
        paddle.seed(0)
        return Chain(fn, layer[0]() if layer else None)

    x = _batch(B)
    t = M.trace(chain(), SumTask(), x, FP32)
    assert t["activations"]["bytes"] == want and t["unknown_ops"] == []
    if not hasattr(core, "host_memory_stat_current_value"):
        return
    net = chain()
    gc.collect()
    before = core.host_memory_stat_current_value("Allocated", 0)
    loss = net(x)             # every Python reference but the loss is gone: what is left, the graph keeps
    gc.collect()
    if before:                # 0: statistics off (FLAGS_use_system_allocator)
        assert core.host_memory_stat_current_value("Allocated", 0) - before - 4 == want
    loss.backward()


def test_the_line_through_two_batches_and_the_largest_batch():
    p = {"states": {k: {"bytes": 100, "allocated": 256} for k in ("parameters", "gradients", "optimizer",
                                                                   "master_weights")},
         "fits": {"activations": (16.0, 320.0), "activations_allocated": (256.0, 512.0),
                  "batch": (0.0, 64.0), "batch_allocated": (0.0, 256.0), "largest": (0.0, 128.0)}}
    row = M.breakdown(p, 2)
    assert row["activations"] == 656 and row["batch"] == 128 and row["largest"] == 256
    assert row["workspace"] == M.WORKSPACE_BYTES
    exact = 400 + 656 + 128 + 256 + M.WORKSPACE_BYTES
    allocated = 4 * 256 + (256 + 1024) + 512 + 256 + M.WORKSPACE_BYTES
    assert row["rounding"] == allocated - exact and row["peak"] == allocated
    limit = M.breakdown(p, 1000)["peak"] + 1
    assert M.largest_batch(p, limit) == 1000
    assert M.largest_batch(p, M.WORKSPACE_BYTES) == 0


def test_cards_and_amounts():
    assert M.parse_card("A100-80GB") == ("A100-80GB", 81920.0)
    assert M.parse_card("h100-80gb")[1] == 81559
    assert M.parse_card("80GB")[1] == 80 * 1024
    assert M.parse_card("16000MiB")[1] == 16000
    with pytest.raises(M.ConfigError, match="--gpu-memory"):
        M.parse_card("lots")


def test_the_tool_end_to_end_on_resnet_tiny(tmp_path):
    out = tmp_path / "doc"
    r = run_tool(["tools/amp_doctor.py", "model=resnet_tiny", "amp=O1", "--memory", "--gpu-memory",
                  "V100-16GB", f"doctor.out={out}"], cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    for word in ("parameters", "activations saved for backward", "largest batch that fits",
                 "amp=O1: model.batch_size=", "amp=bf16_O2: model.batch_size="):
        assert word in r.stdout
    data = json.loads((out / "memory.json").read_text())
    assert set(data["precisions"]) == set(M.PRECISIONS) and data["card"] == "V100-16GB"
    fp32, o1, o2 = (data["precisions"][k] for k in ("fp32", "O1", "O2"))
    assert o1["states"]["gradients"]["bytes"] == fp32["states"]["gradients"]["bytes"]
    assert o2["states"]["parameters"]["bytes"] < fp32["states"]["parameters"]["bytes"]
    assert o1["at_batch"]["activations"] < fp32["at_batch"]["activations"]
    assert o1["largest_batch"] >= fp32["largest_batch"] > 0
    assert data["precisions"]["fp32"]["linearity"]["rel_err"] < 0.05
    assert (out / "memory.png").stat().st_size > 1000
    bad = run_tool(["tools/amp_doctor.py", "model=resnet_tiny", "--memory", "--gpu-memory", "lots"], cwd=ROOT)
    assert bad.returncode == 2 and "error: --gpu-memory" in bad.stderr


def test_the_gpu_memory_tests_logic_on_a_cpu():
    """tests/test_gpu_memory.py's config, prediction and judgement (its GPU steps are skipped here)."""
    import test_gpu_memory as G

    for name in G.CASES:                           # every GPU case composes, at its own batch
        for amp in G.AMPS:
            cfg = G.case_config(name, amp)
            assert cfg.model.name == name and cfg.amp.name == amp
    cfg = G.case_config("resnet_tiny", "O1")
    pred = G.predicted(cfg, "emulated-fp16-O1")
    want = M.breakdown(M.plan_precision(cfg), 8)["peak"] / M.MiB
    assert pred["precision"] == "O1" and pred["batch"] == 8 and pred["peak_mb"] == round(want, 1)
    workspace = M.WORKSPACE_BYTES / M.MiB
    ok = G.judge(workspace + 100, 80)
    assert ok["within"] and ok["rel_err"] == pytest.approx((workspace + 20) / 80)
    assert not G.judge(workspace + 100, 40)["within"]          # under half the non-workspace rows
    assert not G.judge(workspace + 100, 2 * (workspace + 100) + 1)["within"]
