"""What only a CUDA GPU can check: Paddle's real AMP under the zoo's recipes (``pytest -m gpu``).

Run on a GPU machine (docs/gpu.md, "Tests on a GPU")::

    NVIDIA_TF32_OVERRIDE=0 pytest -m gpu -s -rs -q --junitxml=gpu_tests.xml 2>&1 | tee gpu_tests.log

Everything here is skipped, with the reason, where Paddle has no CUDA device. Each test asserts what
it checks; the emulation comparison and the throughput table also print their numbers (``-s``) and
store them as JUnit properties (``--junitxml``). ``NVIDIA_TF32_OVERRIDE=0`` keeps the FP32
references true FP32 on Ampere and later (cuDNN/cuBLAS would otherwise use TF32 for fp32 math).
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from conftest import compose

from zoo.amp import Amp, current_device
from zoo.amp.capability import BF16_MIN_CC, FP16_MIN_CC
from zoo.amp.emulation import Emulation
from zoo.data import TrainBatchSampler, build_loader
from zoo.utils import distributed as dist

HAS_CUDA_BUILD = paddle.is_compiled_with_cuda()
DEVICES = paddle.device.cuda.device_count() if HAS_CUDA_BUILD else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAS_CUDA_BUILD or DEVICES == 0,
                       reason=("needs a CUDA GPU: this Paddle is a CPU build "
                               "(paddle.is_compiled_with_cuda() is False)" if not HAS_CUDA_BUILD else
                               "needs a CUDA GPU: Paddle is a CUDA build but sees no device "
                               "(paddle.device.cuda.device_count() == 0)")),
]

# Small, fast runs of the real configs (recipes included); the models are the real ones.
SMALL = {
    "resnet50": ["model=resnet50", "data.builder.num_train=64", "data.builder.num_val=16",
                 "model.batch_size=8", "model.eval_batch_size=8"],
    "db_det": ["model=db_det", "data.builder.num_train=16", "data.builder.num_val=2",
               "model.batch_size=4", "model.eval_batch_size=2"],
    "ppyoloe_s": ["model=ppyoloe_s", "data.builder.num_train=16", "data.builder.num_val=2",
                  "model.batch_size=4", "model.eval_batch_size=2"],
}
LOOP = ["trainer.progress=false", "trainer.final_eval=false", "trainer.bootstrap_resamples=0",
        "trainer.log_every=1", "trainer.ckpt_every=1000", "trainer.ema_decay=null", "seed=0"]
PRECISIONS = ["fp32", "O1", "O2", "bf16_O1", "bf16_O2"]


def _cc() -> tuple[int, int]:
    return tuple(int(v) for v in paddle.device.cuda.get_device_capability(0))


def _skip_unless_supported(amp_name: str) -> None:
    need = BF16_MIN_CC if amp_name.startswith("bf16") else FP16_MIN_CC
    if amp_name != "fp32" and _cc() < need:
        pytest.skip(f"amp={amp_name} needs compute capability >= {need[0]}.{need[1]}, this GPU is {_cc()}")


def _trainer(tmp_path, model: str, amp_name: str, *extra):
    from zoo.engine.run import build_trainer

    _skip_unless_supported(amp_name)
    cfg = compose([*SMALL[model], *LOOP, f"amp={amp_name}", *extra])
    trainer, _ = build_trainer(cfg, tmp_path)
    return trainer


def _batches(trainer, n: int):
    sampler = TrainBatchSampler(len(trainer.train_set), trainer.batch_size, trainer.seed, 0, 1,
                                drop_last=True, start_step=0, stop_step=n)
    return iter(build_loader(trainer.train_set, sampler, 0))


def _params_finite(model) -> bool:
    return all(bool(paddle.isfinite(p.astype("float32")).all()) for p in dist.unwrap(model).parameters())


# ---- capability and Paddle's AMP primitives ------------------------------------------------------
def test_capability_detection_matches_paddle():
    dev = current_device()
    cc = _cc()
    assert dev.kind == "gpu" and dev.compute_capability == cc
    assert paddle.device.cuda.get_device_name(0) in dev.name and f"sm{cc[0]}{cc[1]}" in dev.name
    assert dev.supports("float16")[0] == (cc >= FP16_MIN_CC)
    assert dev.supports("bfloat16")[0] == (cc >= BF16_MIN_CC)
    amp = Amp(name="O1", enabled=True)
    amp.resolve(dev)
    assert amp.emulated is False  # a GPU never falls back to the CPU emulation when it can compute
    assert amp.effective == ("fp16-O1" if cc >= FP16_MIN_CC else "emulated-fp16-O1")


def test_auto_cast_output_dtypes_o1():
    _skip_unless_supported("O1")
    conv = paddle.nn.Conv2D(3, 8, 3, bias_attr=False)
    x = paddle.randn([2, 3, 16, 16])
    amp = Amp(name="O1", enabled=True, level="O1")
    amp.setup(conv, None, current_device())
    with amp.autocast():
        y = conv(x)          # white list: fp16
        r = F.relu(y)        # follows its fp16 input
        s = F.softmax(r.flatten(1), axis=-1)  # O1 black list: fp32
    assert y.dtype == paddle.float16 and r.dtype == paddle.float16
    assert s.dtype == paddle.float32
    assert conv.weight.dtype == paddle.float32  # O1 never casts parameters


def test_auto_cast_output_dtypes_o2():
    _skip_unless_supported("O2")
    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3), paddle.nn.BatchNorm2D(8))
    opt = paddle.optimizer.Adam(parameters=net.parameters())
    # a recipe's custom_black_list reaches Paddle: softmax forced to fp32 at O2
    amp = Amp(name="O2", enabled=True, level="O2", custom_black_list=["softmax"], init_loss_scaling=1024.0)
    net, opt = amp.setup(net, opt, current_device())
    with amp.autocast():
        y = net[0](paddle.randn([2, 3, 16, 16]))  # decorated fp16 conv: fp16
        z = net[1](y)                              # BatchNorm (kept fp32) on an fp16 input: fp16
        s = F.softmax(z.flatten(1), axis=-1)       # black-listed by the recipe: fp32
    assert net[0].weight.dtype == paddle.float16 and net[1].weight.dtype == paddle.float32
    assert y.dtype == paddle.float16 and z.dtype == paddle.float16
    assert s.dtype == paddle.float32


def test_decorate_o2_master_weights_and_fp32_save_dtype():
    _skip_unless_supported("O2")
    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3), paddle.nn.BatchNorm2D(8), paddle.nn.Flatten(),
                               paddle.nn.Linear(8 * 14 * 14, 4))
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=net.parameters(), multi_precision=True)
    amp = Amp(name="O2", enabled=True, level="O2", master_weight=True, init_loss_scaling=1024.0)
    net, opt = amp.setup(net, opt, current_device())
    conv, bn, linear = net[0], net[1], net[3]
    assert conv.weight.dtype == paddle.float16 and linear.weight.dtype == paddle.float16
    assert bn.weight.dtype == paddle.float32  # decorate keeps norms fp32
    before = conv.weight.astype("float32").numpy().copy()
    with amp.autocast():
        loss = net(paddle.randn([2, 3, 16, 16])).astype("float32").mean()
    amp.backward(loss)
    assert amp.step(opt)
    masters = opt._master_weights  # fp32 master copy of every fp16 parameter
    assert conv.weight.name in masters and masters[conv.weight.name].dtype == paddle.float32
    np.testing.assert_allclose(masters[conv.weight.name].astype("float16").astype("float32").numpy(),
                               conv.weight.astype("float32").numpy(), rtol=0, atol=0)
    assert not np.array_equal(before, conv.weight.astype("float32").numpy())
    state = net.state_dict()  # save_dtype="float32": checkpoints are fp32 whatever the compute dtype
    assert all(v.dtype == paddle.float32 for v in state.values() if v.dtype in (paddle.float16, paddle.float32))


def test_grad_scaler_state_round_trip_through_a_checkpoint(tmp_path):
    _skip_unless_supported("O1")
    amp = Amp(name="O1", enabled=True, init_loss_scaling=1024.0, incr_every_n_steps=3)
    net = paddle.nn.Linear(4, 4)
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    net, opt = amp.setup(net, opt, current_device())
    for i in range(5):
        with amp.autocast():
            loss = net(paddle.ones([2, 4])).mean()
            if i == 4:
                loss = loss * float("inf")  # one overflow: skip and halve
        amp.backward(loss)
        amp.step(opt)
        opt.clear_grad()
    assert amp.skipped_steps == 1 and amp.loss_scale == 1024.0  # x2 after 3 good steps, /2 on the inf
    path = tmp_path / "amp.pdparams"
    paddle.save(amp.state_dict(), str(path))
    other = Amp(name="O1", enabled=True)
    net2 = paddle.nn.Linear(4, 4)
    other.setup(net2, paddle.optimizer.SGD(0.1, parameters=net2.parameters()), current_device())
    other.set_state_dict(paddle.load(str(path)))
    assert other.loss_scale == amp.loss_scale and other.skipped_steps == 1
    a, b = amp.scaler.state_dict(), other.scaler.state_dict()
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]).reshape(-1), np.asarray(b[k]).reshape(-1), err_msg=k)


@pytest.mark.parametrize("master_grad", [False, True])
def test_master_grad_is_honoured(master_grad):
    _skip_unless_supported("O2")
    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3), paddle.nn.Flatten(), paddle.nn.Linear(8 * 14 * 14, 4))
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=net.parameters(), multi_precision=True)
    amp = Amp(name="O2", enabled=True, level="O2", master_grad=master_grad, init_loss_scaling=1024.0)
    net, opt = amp.setup(net, opt, current_device())
    with amp.autocast():
        loss = net(paddle.randn([2, 3, 16, 16])).astype("float32").mean()
    amp.backward(loss)
    w = net[0].weight
    assert w.dtype == paddle.float16
    assert w.grad is not None
    assert w.grad.dtype == (paddle.float32 if master_grad else paddle.float16)
    assert amp.step(opt)


# ---- one training step of each model at each precision, through the zoo's build path -------------
@pytest.mark.parametrize("amp_name", PRECISIONS)
@pytest.mark.parametrize("model", sorted(SMALL))
def test_training_steps_are_finite(model, amp_name, tmp_path):
    trainer = _trainer(tmp_path, model, amp_name)
    assert trainer.amp.effective == trainer.amp.requested  # real AMP, not the emulation
    assert not trainer.amp.emulated
    trainer.model.train()
    batches = _batches(trainer, 6)
    stepped_any = False
    for i in range(6):  # a dynamic fp16 scale may skip its first steps while it calibrates
        values, stepped, bad = trainer.train_step(next(batches))
        assert all(math.isfinite(v) for v in values.values()), (model, amp_name, i, values)
        stepped_any = stepped_any or stepped
    assert stepped_any, f"{model} {amp_name}: every one of 6 steps was skipped (loss scale {trainer.amp.loss_scale})"
    assert _params_finite(trainer.model)


@pytest.mark.parametrize("model", ["resnet50", "db_det"])
def test_compiled_real_amp_matches_eager(model, tmp_path):
    """trainer.compile=true with Paddle's AMP (allowed on a GPU): the losses of eager AMP, not FP32's."""
    runs = {}
    for name, amp_name, compiled in (("eager", "O1", False), ("compiled", "O1", True), ("fp32", "fp32", False)):
        trainer = _trainer(tmp_path / name, model, amp_name, f"trainer.compile={str(compiled).lower()}")
        assert trainer.settings.compile is compiled
        trainer.model.train()
        batches = _batches(trainer, 3)  # build_trainer seeds: same initial weights, same batches
        runs[name] = [trainer.train_step(next(batches))[0]["loss"] for _ in range(3)]
    print(f"\n{model} losses: eager O1 {runs['eager']}, compiled O1 {runs['compiled']}, fp32 {runs['fp32']}")
    assert all(math.isfinite(v) for v in runs["compiled"])
    np.testing.assert_allclose(runs["compiled"][0], runs["eager"][0], rtol=1e-3)  # same weights, same batch
    np.testing.assert_allclose(runs["compiled"], runs["eager"], rtol=2e-2)
    assert runs["compiled"][0] != runs["fp32"][0]  # fp16 really acted inside the compiled graph


# ---- the CPU emulation against the GPU's real numbers -------------------------------------------
def _loss_and_grads(model, task, batch, context, scale: float = 128.0):
    """Loss and fp32 parameter gradients of one batch; a fixed loss scale as a static GradScaler."""
    model.clear_gradients()
    with context():
        loss = task.losses(model, batch)["loss"]
    (loss.astype("float32") * scale).backward()
    grads = np.concatenate([p.grad.astype("float32").numpy().ravel() / scale
                            for p in model.parameters() if p.grad is not None])
    model.clear_gradients()
    return float(loss), grads


@pytest.mark.parametrize("model", sorted(SMALL))
def test_emulation_predicts_real_o1_numbers(model, tmp_path, record_property):
    """Loss and gradients of one batch: real fp16 O1 on this GPU vs the zoo's emulation of it
    (run on the same GPU, same weights, same batch) vs plain FP32."""
    import contextlib

    trainer = _trainer(tmp_path, model, "O1")
    amp, net, task = trainer.amp, dist.unwrap(trainer.model), trainer.task
    net.train()
    batch = next(_batches(trainer, 1))
    emulation = Emulation(amp.level, amp.dtype, amp.white, amp.black)  # the recipe's lists too
    real_loss, real_g = _loss_and_grads(net, task, batch, amp.autocast)
    emu_loss, emu_g = _loss_and_grads(net, task, batch, emulation)
    fp32_loss, fp32_g = _loss_and_grads(net, task, batch, contextlib.nullcontext)

    def rel(a, b):  # relative error of a gradient vector, in the 2-norm
        return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))

    row = {"loss_real_o1": real_loss, "loss_emulated": emu_loss, "loss_fp32": fp32_loss,
           "loss_relerr_emulated": abs(emu_loss - real_loss) / abs(real_loss),
           "loss_relerr_fp32": abs(fp32_loss - real_loss) / abs(real_loss),
           "grad_relerr_emulated": rel(emu_g, real_g), "grad_relerr_fp32": rel(fp32_g, real_g),
           "tf32_override": os.environ.get("NVIDIA_TF32_OVERRIDE")}
    print(f"\n[emulation vs real O1] {model} ({current_device().name}): "
          + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    for k, v in row.items():
        record_property(f"{model}_{k}", v)
    assert np.isfinite(real_g).all() and np.isfinite(emu_g).all() and math.isfinite(real_loss)
    assert real_g.size == emu_g.size == fp32_g.size
    # The emulation cannot reproduce the GPU's accumulation order, so its gradients differ from the
    # GPU's by rounding noise; what it must get right is everything above that noise. Bound: no
    # farther from the GPU than twice fp16's own distance from FP32 (independent noise gives about
    # sqrt(2) times), plus a small floor for gradients that are nearly exact.
    assert row["loss_relerr_emulated"] <= 2 * row["loss_relerr_fp32"] + 1e-3, row
    assert row["grad_relerr_emulated"] <= 2 * row["grad_relerr_fp32"] + 0.05, row


# ---- throughput and peak memory (a benchmark: printed, not asserted) -----------------------------
BENCH = {
    "resnet50": ["model=resnet50", "data.builder.image_size=224", "data.builder.num_train=64",
                 "data.builder.num_val=8", "model.batch_size=32", "model.eval_batch_size=8"],
    "db_det": ["model=db_det", "data.builder.image_size=[640,640]", "data.builder.crop_size=640",
               "data.builder.num_train=16", "data.builder.num_val=2", "model.batch_size=8",
               "model.eval_batch_size=2"],
}
WARMUP, TIMED, REPEATS = 5, 20, 2


def _time_steps(trainer, batch) -> tuple[float, float]:
    """Seconds per step (median over the timed steps, one batch reused: compute only) and peak MB."""
    trainer.model.train()
    for _ in range(WARMUP):
        trainer.train_step(batch)
    paddle.device.synchronize()
    paddle.device.cuda.reset_max_memory_allocated()
    times = []
    for _ in range(TIMED):
        t0 = time.perf_counter()
        values, _, _ = trainer.train_step(batch)
        paddle.device.synchronize()
        times.append(time.perf_counter() - t0)
        assert math.isfinite(values["loss"])
    return float(np.median(times)), paddle.device.cuda.max_memory_allocated() / 2**20


@pytest.mark.parametrize("model", sorted(BENCH))
def test_throughput_and_peak_memory_table(model, tmp_path, record_property):
    """fp32 vs O1 vs O2, alternated REPEATS times; img/s and the ratio to FP32 of median step times."""
    from zoo.engine.run import build_trainer

    amps = [a for a in ("fp32", "O1", "O2") if a == "fp32" or _cc() >= FP16_MIN_CC]
    results = {a: {"step_s": [], "peak_mb": []} for a in amps}
    batch = None
    for r in range(REPEATS):
        for a in amps:  # alternate, so drift in clocks or other load hits every precision alike
            cfg = compose([*BENCH[model], *LOOP, f"amp={a}"])
            trainer, _ = build_trainer(cfg, tmp_path / f"{a}_{r}")
            batch = batch if batch is not None else next(_batches(trainer, 1))
            step_s, peak = _time_steps(trainer, batch)
            results[a]["step_s"].append(step_s)
            results[a]["peak_mb"].append(peak)
            del trainer
            paddle.device.cuda.empty_cache()
    bs = int(compose(BENCH[model]).model.batch_size)
    base = float(np.median(results["fp32"]["step_s"]))
    lines = [f"\n[throughput] {model} batch {bs} on {current_device().name}, paddle {paddle.__version__}, "
             f"median of {TIMED} steps after {WARMUP} warm-up, {REPEATS} alternated repeats, one batch reused",
             f"{'amp':6} {'img/s':>9} {'step ms':>9} {'step time / fp32':>17} {'peak MB':>9}"]
    for a in amps:
        s = float(np.median(results[a]["step_s"]))
        peak = max(results[a]["peak_mb"])
        lines.append(f"{a:6} {bs / s:9.1f} {1000 * s:9.1f} {s / base:17.3f} {peak:9.0f}")
        record_property(f"{model}_{a}_images_per_s", bs / s)
        record_property(f"{model}_{a}_step_time_over_fp32", s / base)
        record_property(f"{model}_{a}_peak_mb", peak)
        assert s > 0 and peak > 0
    print("\n".join(lines))
