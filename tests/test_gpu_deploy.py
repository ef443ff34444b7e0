"""The precision check's prediction against a real GPU deployment (``pytest -m gpu``; issue 25 item 7).

For each family the fp32 program is exported and the check decides its keep-list on a small split.
Paddle Inference then builds the program on the GPU in fp16 (and in bf16 where the card has it),
with the keep-list as ``exp_disable_mixed_precision_ops``, and with TensorRT when this Paddle has
it. It runs the same images. Compared with the check's emulated prediction:

- the outputs: relative error of the GPU against FP32, of the emulation against FP32, and of the GPU
  against the emulation;
- the end metric: the GPU's metric difference against FP32, beside the predicted one.

The numbers are printed (``-s``) and stored as JUnit properties (``--junitxml``), so a GPU user can
send them back. Asserted: the GPU's outputs are finite wherever the prediction's are; for
classification and DB, the paired verdict on the GPU's predictions equals the check's.
"""
from __future__ import annotations

import numpy as np
import paddle
import pytest
from conftest import compose
from test_gpu import _cc, pytestmark  # noqa: F401  (gpu marker and the skip without a CUDA device)

from zoo.amp.capability import BF16_MIN_CC
from zoo.data import EvalBatchSampler, build_loader
from zoo.engine.run import build
from zoo.export.deployed import DeployedEmulation, fold_batch_norms
from zoo.export.inference import export_inference
from zoo.export.precision_check import CheckSettings, Deployment, check_precision_export
from zoo.export.verdict import paired_difference, verdict

CASES = {  # overrides, exported input shape (None: the classifier's fixed [-1, 3, S, S])
    "resnet_tiny": (["model=resnet_tiny", "data.builder.num_val=200"], None),
    "db_det_tiny": (["model=db_det_tiny", "data.builder.num_val=8"], [-1, 3, -1, -1]),
}


def _relerr(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _gpu_predictor(folder, precision: str, black_list, trt: bool):
    from paddle import inference

    config = inference.Config(str(folder / "inference.json"), str(folder / "inference.pdiparams"))
    kind = inference.PrecisionType.Half if precision == "fp16" else inference.PrecisionType.Bfloat16
    config.enable_use_gpu(256, 0, kind)
    config.exp_disable_mixed_precision_ops(set(black_list))
    if trt:
        config.enable_tensorrt_engine(workspace_size=1 << 28, max_batch_size=16, min_subgraph_size=3,
                                      precision_mode=kind, use_static=False, use_calib_mode=False)
    return inference.create_predictor(config)


def _run(predictor, images: np.ndarray) -> np.ndarray:
    handle = predictor.get_input_handle(predictor.get_input_names()[0])
    handle.reshape(list(images.shape))
    handle.copy_from_cpu(np.ascontiguousarray(images, np.float32))
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


class _Outputs(paddle.nn.Layer):
    """Serves recorded outputs in order, so the task can score the GPU's predictions."""

    def __init__(self, outputs):
        super().__init__()
        self.outputs = list(outputs)

    def forward(self, x):
        return paddle.to_tensor(self.outputs.pop(0))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("trt", [False, True], ids=["paddle", "tensorrt"])
@pytest.mark.parametrize("model", list(CASES))
def test_precision_check_prediction_against_the_gpu(model, precision, trt, tmp_path, record_property):
    from zoo.engine.evaluate import evaluate
    from zoo.export.precision_check import _Precision

    if precision == "bf16" and _cc() < BF16_MIN_CC:
        pytest.skip(f"bf16 needs compute capability {BF16_MIN_CC}, this GPU has {_cc()}")
    if trt and not paddle.inference.get_trt_compile_version()[0]:
        pytest.skip("this Paddle is built without TensorRT")
    overrides, shape = CASES[model]
    cfg = compose(overrides)
    paddle.seed(0)
    net = build(cfg.model.net, "model.net")
    net.eval()
    val_set = build(cfg.data.builder, "data").build("val", cfg.seed)
    task = build(cfg.model.task, "model.task")
    wrapped = task.checked_module(net)  # DB's shrink map, the classifier's softmax: what is exported
    dep = Deployment(wrapped, lambda: build(cfg.model.task, "model.task"), val_set, 8)
    dtype = "float16" if precision == "fp16" else "bfloat16"
    report = check_precision_export(dep, precision, dtype, CheckSettings(margin={"top1": 3.0, "hmean": 3.0}))
    shape = shape or [-1, 3, cfg.data.builder.image_size, cfg.data.builder.image_size]
    export_inference(net, tmp_path / "exp", shape, None, deploy=task.deploy_module)
    predictor = _gpu_predictor(tmp_path / "exp", precision, report["consumer_black_list"], trt)
    batches = list(build_loader(val_set, EvalBatchSampler(len(val_set), 8), 0))
    folded, _ = fold_batch_norms(wrapped, batches[0]["image"])
    emulation = DeployedEmulation(dtype, report["keep_fp32"])
    gpu, emu, ref = [], [], []
    with paddle.no_grad():
        for batch in batches:
            gpu.append(_run(predictor, batch["image"].numpy()))
            ref.append(wrapped(batch["image"]).numpy())
            with emulation():
                emu.append(folded(batch["image"]).numpy())
    g, e, r = (np.concatenate(v) for v in (gpu, emu, ref))
    errors = {"gpu_vs_fp32": _relerr(g, r), "emulated_vs_fp32": _relerr(e, r), "gpu_vs_emulated": _relerr(g, e)}
    scored = evaluate(_Outputs(gpu), dep.make_task(), _Precision(), val_set, 8)
    fp32_task, gpu_task = dep.make_task(), dep.make_task()
    evaluate(_Outputs(ref), fp32_task, _Precision(), val_set, 8)
    evaluate(_Outputs(gpu), gpu_task, _Precision(), val_set, 8)
    diff = paired_difference(fp32_task, gpu_task, 1000)
    margin = report["margin_pp"]
    tag = f"{model}_{precision}_{'trt' if trt else 'paddle'}"
    for k, v in {**errors, "gpu_delta_pp": diff["delta_pp"], "predicted_delta_pp": report["delta_pp"],
                 "gpu_verdict": verdict(diff["ci_pp"], margin), "predicted_verdict": report["verdict"],
                 "keep_fp32": ",".join(report["keep_fp32"])}.items():
        record_property(f"{tag}_{k}", v)
    print(f"\n{tag}: keep {report['keep_fp32']}, {errors}, {cfg.model.task._target_} metric "
          f"{scored}, GPU delta {diff['delta_pp']:+.2f} pp vs predicted {report['delta_pp']:+.2f} pp")
    assert np.isfinite(g[np.isfinite(e)]).all(), "the GPU produced inf/NaN where the prediction did not"
    assert verdict(diff["ci_pp"], margin) == report["verdict"]
