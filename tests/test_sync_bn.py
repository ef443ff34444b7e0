"""trainer.sync_bn (issue 37.3): PaddleDetection's ``norm_type: sync_bn`` for PP-YOLOE.

Measured on Paddle 3.3.1's CPU build (2026-12-04): ``paddle.nn.SyncBatchNorm`` cannot run on a CPU,
not even under a two-rank gloo launch: its forward fails with "The kernel `sync_batch_norm` is not
registered", and Paddle's kernel registry lists no backend for it. So on a CPU the zoo keeps plain
BatchNorm and says why (once on stderr, and in summary.json ``sync_bn``); what SyncBN computes is
checked on GPUs in tests/test_gpu_sync_bn.py.
"""
from __future__ import annotations

import json

import numpy as np
import paddle
import pytest
from conftest import ROOT, SPEC_DIR, TINY, compose, launch_failure, run_tool

import zoo
from zoo.amp.emulation import Emulation, is_low, round_to
from zoo.utils import distributed as dist

SPEC = SPEC_DIR / "paddledet_ppyoloe_crn_s_300e_coco.keys"


def _bn_count(model, cls):
    return sum(type(m) is cls for m in model.sublayers(include_self=True))


def test_this_paddle_cpu_build_has_no_sync_batch_norm_kernel():
    """The fact the CPU fallback rests on, read from Paddle's own kernel registry."""
    ok, backends = dist.sync_batch_norm_kernel("cpu")
    assert not ok and "CPU" not in backends
    if not paddle.is_compiled_with_cuda():
        with pytest.raises(Exception, match="sync_batch_norm"):
            paddle.nn.SyncBatchNorm(2)(paddle.ones([2, 2, 2, 2]))


def test_not_requested_and_one_process_keep_plain_batchnorm():
    model = zoo.create_model("ppyoloe_tiny", num_classes=3)
    n = _bn_count(model, paddle.nn.BatchNorm2D)
    for requested, why in ((False, "not requested"), (True, "one process")):
        same, info = dist.convert_sync_bn(model, requested, "gpu")
        assert same is model and _bn_count(model, paddle.nn.BatchNorm2D) == n > 0
        assert info["requested"] is requested and info["effective"] is False and why in info["reason"]
    with pytest.raises(ValueError, match="trainer.sync_bn"):
        dist.convert_sync_bn(model, "yes", "gpu")


def test_several_ranks_on_a_cpu_keep_plain_batchnorm_and_say_why(monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    model = zoo.create_model("ppyoloe_tiny", num_classes=3)
    model, info = dist.convert_sync_bn(model, True, "cpu")
    assert _bn_count(model, paddle.nn.SyncBatchNorm) == 0
    assert info["effective"] is False and info["converted_layers"] == 0
    assert "no sync_batch_norm kernel for cpu" in info["reason"] and "plain BatchNorm" in info["reason"]


def test_conversion_keeps_paddledetection_names_and_values(monkeypatch):
    """Where Paddle has the kernel (forced here: a CPU build has none), every BatchNorm of PP-YOLOE-s
    becomes a SyncBatchNorm sharing the BatchNorm's own tensors: the state dict keeps the 423 names and
    shapes of PaddleDetection's checkpoint (spec/*.keys) and every value."""
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.setattr(dist, "sync_batch_norm_kernel", lambda kind: (True, "GPU"))
    paddle.seed(0)
    model = zoo.create_model("ppyoloe_s")
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    n = _bn_count(model, paddle.nn.BatchNorm2D)
    model, info = dist.convert_sync_bn(model, True, "gpu")
    assert info["effective"] is True and info["converted_layers"] == n > 0
    assert _bn_count(model, paddle.nn.BatchNorm2D) == 0 and _bn_count(model, paddle.nn.SyncBatchNorm) == n
    after = model.state_dict()
    assert list(after) == list(before)
    for k, v in before.items():
        np.testing.assert_array_equal(after[k].numpy(), v)
    if SPEC.is_file():
        spec = {line.split(" ", 1)[0] for line in SPEC.read_text().splitlines() if line.strip()}
        assert set(after) == spec
    # and a checkpoint of the converted model loads into a plain one (tools/eval.py, export)
    plain = zoo.create_model("ppyoloe_s")
    missing, unexpected = plain.set_state_dict({k: v for k, v in after.items()})
    assert not missing and not unexpected


def test_o2_decoration_keeps_syncbatchnorm_fp32():
    """paddle.amp.decorate(level='O2') keeps SyncBatchNorm's parameters fp32, like BatchNorm's
    (auto_cast.need_keep_fp32), and so does the emulation's O2 parameter marking."""
    from paddle.amp.auto_cast import need_keep_fp32

    from zoo.amp.emulation import mark_o2_parameters

    for dtype in ("float16", "bfloat16"):
        assert need_keep_fp32(paddle.nn.SyncBatchNorm(4), dtype)
    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, bias_attr=False), paddle.nn.SyncBatchNorm(4))
    assert mark_o2_parameters(net, "float16") == 1  # the conv weight only


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_emulation_treats_sync_batch_norm_as_paddle_amp_does(level, dtype):
    """On none of Paddle's AMP lists (gray: follows x alone, amp_utils.h GetPromoteType), like
    batch_norm; and the _C_ops function SyncBatchNorm calls (sync_batch_norm_) is the one wrapped.
    Its CPU kernel does not exist, so the rule is run with batch_norm's kernel, which takes the same
    arguments: the decisions and outputs must equal batch_norm's."""
    from paddle import _C_ops

    for lists in (paddle.amp.white_list(), paddle.amp.black_list()):
        assert "sync_batch_norm" not in lists[dtype][level] and "batch_norm" not in lists[dtype][level]
    emu = Emulation(level, dtype)
    assert emu.mode("sync_batch_norm") == emu.mode("batch_norm") == "gray"
    with emu():
        pass  # installs the wrappers
    assert getattr(_C_ops.sync_batch_norm_, "_zoo_original", None) is not None
    real_bn = getattr(_C_ops.batch_norm, "_zoo_original", _C_ops.batch_norm)
    rng = np.random.default_rng(0)
    x32 = paddle.to_tensor(rng.normal(0, 3, (2, 4, 3, 3)).astype("float32"))
    for x in (x32, round_to(x32, dtype)):
        outs = []
        for op in ("batch_norm", "sync_batch_norm"):
            args = [x, paddle.zeros([4]), paddle.ones([4]), paddle.ones([4]), paddle.zeros([4]), False, 0.9, 1e-5,
                    "NCHW", False, False]
            outs.append(emu.run(op, real_bn, args, {}))
        a, b = outs
        assert is_low(a[0]) == is_low(b[0]) == is_low(x)
        np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
        assert not is_low(b[1])  # running statistics stay fp32


def test_experiment_turns_it_on_and_the_default_is_off():
    assert compose(["experiment=ppyoloe_s_coco"]).trainer.sync_bn is True
    assert compose(TINY).trainer.sync_bn is False


@pytest.mark.slow
def test_two_cpu_ranks_record_plain_batchnorm_with_the_reason(tmp_path, ampzoo_home):
    """trainer.sync_bn=true under a two-rank gloo launch on this CPU: the run trains with plain
    BatchNorm, summary.json says requested true, effective false and why, and rank 0 says it once."""
    args = ["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
            str(ROOT / "tools" / "train.py"), *TINY, "model.batch_size=8", "trainer.max_steps=2",
            "trainer.sync_bn=true", "trainer.bootstrap_resamples=0"]
    out = run_tool(args, tmp_path, {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 0, launch_failure(out, tmp_path / "log")
    run = next((tmp_path / "outputs").glob("*/*"))
    summary = json.loads((run / "summary.json").read_text())
    info = summary["sync_bn"]
    assert summary["world_size"] == 2 and summary["ranks_in_sync"]
    assert info["requested"] is True and info["effective"] is False and info["converted_layers"] == 0
    assert "no sync_batch_norm kernel for cpu" in info["reason"]
    logs = [(tmp_path / "log" / f"workerlog.{r}").read_text(errors="replace") for r in (0, 1)]
    said = "trainer.sync_bn=true not in effect"
    assert logs[0].count(said) == 1 and logs[1].count(said) == 0, logs[0][-2000:]
