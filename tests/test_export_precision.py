"""export.store=low with export.precision=fp16|bf16: O2-cast weights in the file, checked against our emulated O2 evaluation.

On this CPU build of Paddle 3.3.1 (docs/export.md): a bf16 ResNet builds and runs in Paddle
Inference with oneDNN, so its outputs are compared with the same weights evaluated under
``amp=bf16_O2`` (zoo/amp/emulation.py, what ``tools/eval.py ... amp=bf16_O2`` runs). fp16 programs
(any model) and bf16 DB / PP-YOLOE cannot be built by a CPU build: the export must say which op is
missing, in one line naming ``export.precision``.
"""
from __future__ import annotations

import json

import numpy as np
import paddle
import pytest
from conftest import ROOT, compose, run_tool

import zoo
from zoo.amp import current_device
from zoo.engine.run import build_amp
from zoo.export import cast_o2
from zoo.export.precision import FP32Norm

EXPORT = str(ROOT / "tools" / "export.py")
CPU_BUILD = not paddle.is_compiled_with_cuda()
# Max |bf16 export - emulated bf16 O2| of the softmax outputs of 32 random inputs: measured 7.4e-3 on
# this CPU (bf16 vs fp32 itself: 1.6e-2).
BF16_ATOL = 1e-2


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# The O2-cast file itself (export.store=low); the precision check has tests of its own (test_export_precision_check.py).
LOW = ["export.store=low", "export.guard=off"]


def test_cast_o2_casts_like_decorate_and_leaves_the_model_alone():
    paddle.seed(0)
    model = zoo.create_model("resnet_tiny", num_classes=4)
    low, cast = cast_o2(model, "bfloat16")
    assert all(p.dtype == paddle.float32 for p in model.parameters()), "the original must stay fp32"
    norms = [m for m in low.sublayers() if isinstance(m, FP32Norm)]
    assert norms and all(p.dtype == paddle.float32 for n in norms for p in n.parameters())
    norm_ids = {id(p) for n in norms for p in n.parameters()}
    others = [p for p in low.parameters() if id(p) not in norm_ids]
    assert cast == len(others) and all(p.dtype == paddle.bfloat16 for p in others)
    # the cast values are the fp32 weights rounded to bf16
    for (name, p), q in zip(model.named_parameters(), low.parameters()):
        if q.dtype == paddle.bfloat16:
            np.testing.assert_array_equal(q.astype("float32").numpy(), p.astype("bfloat16").astype("float32").numpy(),
                                          err_msg=name)


@pytest.mark.skipif(not CPU_BUILD, reason="checks the bf16 oneDNN path of a CPU build")
def test_bf16_resnet_export_matches_emulated_bf16_o2(tmp_path):
    from paddle import inference

    paddle.seed(4)
    model = zoo.create_model("resnet_tiny", num_classes=10)
    paddle.save(model.state_dict(), str(tmp_path / "w.pdparams"))
    out = tmp_path / "bf16"
    proc = run_tool([EXPORT, "model=resnet_tiny", f"weights={tmp_path / 'w.pdparams'}", f"export.out_dir={out}",
                     "export.model_name=ResNet18", "export.onnx=false", "export.precision=bf16", *LOW], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "export.json").read_text())
    assert record["precision"] == "bf16"
    n_bn = sum(isinstance(m, paddle.nn.BatchNorm2D) for m in model.sublayers())
    n_other = sum(1 for m in model.sublayers() if not isinstance(m, paddle.nn.BatchNorm2D)
                  for _ in m.parameters(include_sublayers=False))
    # BatchNorm: weight, bias, mean, variance stay fp32; every other parameter is bf16
    assert record["saved_dtypes"] == {"bfloat16": n_other, "float32": 4 * n_bn}

    config = inference.Config(str(out / "inference.json"), str(out / "inference.pdiparams"))
    config.disable_gpu()
    config.enable_mkldnn()  # the CPU's bf16 kernels are oneDNN's
    predictor = inference.create_predictor(config)
    x = np.random.default_rng(0).standard_normal((32, 3, 32, 32)).astype("float32")
    handle = predictor.get_input_handle(predictor.get_input_names()[0])
    handle.reshape(x.shape)
    handle.copy_from_cpu(x)
    predictor.run()
    got = predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()
    assert got.dtype == np.float32  # outputs are cast back (keep_io_types)

    model.eval()
    with paddle.no_grad():
        fp32 = _softmax(model(paddle.to_tensor(x)).numpy())
        amp = build_amp(compose(["model=resnet_tiny", "amp=bf16_O2"], "eval"))
        emulated_model, _ = amp.setup(model, None, current_device())
        assert amp.emulated and amp.level == "O2" and amp.dtype == "bfloat16"
        with amp.autocast():
            emulated = _softmax(emulated_model(paddle.to_tensor(x)).astype("float32").numpy())
    to_emulated, to_fp32 = np.abs(got - emulated).max(), np.abs(got - fp32).max()
    assert to_emulated < BF16_ATOL, f"bf16 export vs emulated bf16 O2: max |diff| {to_emulated}"
    # The comparison tells bf16 from fp32: on average the export is ~3x closer to the emulation
    # (measured 4.4e-4) than to fp32 (1.4e-3); what remains are 1-ulp bf16 rounding flips where
    # oneDNN's fp32 accumulation order differs from Paddle's fp32 kernels.
    mean_emulated, mean_fp32 = np.abs(got - emulated).mean(), np.abs(got - fp32).mean()
    assert mean_emulated < 0.5 * mean_fp32, (mean_emulated, mean_fp32, to_emulated, to_fp32)
    assert (got.argmax(1) == emulated.argmax(1)).mean() >= 7 / 8


@pytest.mark.skipif(not CPU_BUILD, reason="a GPU build has the fp16 / bf16 kernels these programs need")
@pytest.mark.parametrize("model, precision, match", [
    ("resnet_tiny", "fp16", "op conv2d has no float16 kernel"),
    ("db_det_tiny", "fp16", "op conv2d has no float16 kernel"),
    ("ppyoloe_tiny", "fp16", "op conv2d has no float16 kernel"),
    ("db_det_tiny", "bf16", "op hardsigmoid has no bfloat16 kernel"),
    ("ppyoloe_tiny", "bf16", "op hardsigmoid has no bfloat16 kernel"),
])
def test_unbuildable_precision_names_the_op(tmp_path, model, precision, match):
    extra = ["export.model_name=ResNet18"] if model == "resnet_tiny" else \
        ["data.builder.num_train=4", "data.builder.num_val=2"] if model == "ppyoloe_tiny" else []
    earlier = tmp_path / "x"  # an earlier export in out_dir must survive the failed one
    earlier.mkdir()
    for name in ("export.json", "inference.json", "model.json"):
        (earlier / name).write_text("earlier")
    proc = run_tool([EXPORT, f"model={model}", f"export.out_dir={earlier}", "export.onnx=false",
                     f"export.precision={precision}", *LOW, *extra], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"export.precision={precision}: Paddle cannot build the program" in errors[0]
    assert match in errors[0]
    assert sorted(p.name for p in earlier.iterdir()) == ["export.json", "inference.json", "model.json"]
    assert all((earlier / name).read_text() == "earlier" for name in ("export.json", "inference.json"))


@pytest.mark.parametrize("value", ["fp8", "O2", "half"])
def test_bad_precision_value(tmp_path, value):
    proc = run_tool([EXPORT, "model=db_det_tiny", f"export.precision={value}", f"export.out_dir={tmp_path / 'x'}"],
                    cwd=tmp_path)
    assert proc.returncode == 2 and f"export.precision: expected one of fp32, fp16, bf16, got '{value}'" in proc.stderr


def test_bf16_export_writes_no_onnx(tmp_path):
    """ONNX's Conv has no bfloat16 type: auto skips with the reason, true refuses in one line."""
    common = [EXPORT, "model=resnet_tiny", "export.model_name=ResNet18", "export.precision=bf16", *LOW]
    proc = run_tool([*common, f"export.out_dir={tmp_path / 'a'}", "export.onnx=auto"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "a" / "export.json").read_text())
    assert "ONNX's Conv takes no bfloat16" in record["onnx"] and not (tmp_path / "a" / "inference.onnx").exists()
    proc = run_tool([*common, f"export.out_dir={tmp_path / 'b'}", "export.onnx=true"], cwd=tmp_path)
    assert proc.returncode == 2 and "error: export.onnx=true: no ONNX for export.precision=bf16" in proc.stderr
