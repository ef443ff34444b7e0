"""SyncBN for real (trainer.sync_bn, issue 37.3): needs two CUDA GPUs (``pytest -m gpu``).

Paddle's CPU build has no sync_batch_norm kernel (tests/test_sync_bn.py), so what SyncBatchNorm
computes can only be checked here: under ``paddle.distributed.launch`` on two GPUs, each rank holding
half of a batch, the converted layer's batch statistics and running statistics must be those of plain
BatchNorm over the whole batch on one device; and a zoo run with ``trainer.sync_bn=true`` must report
SyncBN as effective, with every BatchNorm converted.
"""
from __future__ import annotations

import json
import textwrap

import paddle
import pytest
from conftest import ROOT, TINY, launch_failure, run_tool

HAS_CUDA_BUILD = paddle.is_compiled_with_cuda()
DEVICES = paddle.device.cuda.device_count() if HAS_CUDA_BUILD else 0
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICES < 2, reason=(
        "needs two CUDA GPUs: this Paddle is a CPU build (paddle.is_compiled_with_cuda() is False)"
        if not HAS_CUDA_BUILD else f"needs two CUDA GPUs: Paddle sees {DEVICES}")),
]

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, paddle, paddle.distributed as dist
    from zoo.utils import distributed as zdist
    dist.init_parallel_env()
    rank = dist.get_rank()
    x = np.random.default_rng(0).normal(2.0, 3.0, (8, 4, 5, 5)).astype("float32")
    x[4:] *= 4.0                      # the two halves have different statistics
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.BatchNorm2D(4))
    net, info = zdist.convert_sync_bn(net, True, "gpu")
    y = net(paddle.to_tensor(x[rank * 4:(rank + 1) * 4]))
    out = {"info": info, "y": y.numpy().tolist(), "mean": net[0]._mean.numpy().tolist(),
           "var": net[0]._variance.numpy().tolist()}
    with open(sys.argv[1] + f".{rank}.json", "w") as f:
        json.dump(out, f)
""")


def test_syncbatchnorm_normalises_over_both_ranks(tmp_path):
    import numpy as np

    script = tmp_path / "sbn.py"
    script.write_text(SCRIPT)
    out = run_tool(["-m", "paddle.distributed.launch", "--gpus", "0,1", "--log_dir", str(tmp_path / "log"),
                    str(script), str(tmp_path / "out")], tmp_path, {"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, launch_failure(out, tmp_path / "log")
    ranks = [json.loads((tmp_path / f"out.{r}.json").read_text()) for r in (0, 1)]
    assert all(r["info"]["effective"] and r["info"]["converted_layers"] == 1 for r in ranks)
    # the reference: plain BatchNorm over the whole batch of 8 on one device
    x = np.random.default_rng(0).normal(2.0, 3.0, (8, 4, 5, 5)).astype("float32")
    x[4:] *= 4.0
    paddle.seed(0)
    bn = paddle.nn.BatchNorm2D(4)
    y = bn(paddle.to_tensor(x)).numpy()
    for r, got in enumerate(ranks):
        np.testing.assert_allclose(np.array(got["y"]), y[r * 4:(r + 1) * 4], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got["mean"], bn._mean.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["var"], bn._variance.numpy(), rtol=1e-4, atol=1e-4)


def test_zoo_run_on_two_gpus_reports_syncbn_effective(tmp_path, ampzoo_home):
    args = ["-m", "paddle.distributed.launch", "--gpus", "0,1", "--log_dir", str(tmp_path / "log"),
            str(ROOT / "tools" / "train.py"), *TINY, "model.batch_size=8", "trainer.max_steps=2",
            "trainer.sync_bn=true", "trainer.bootstrap_resamples=0"]
    out = run_tool(args, tmp_path, {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 0, launch_failure(out, tmp_path / "log")
    summary = json.loads((next((tmp_path / "outputs").glob("*/*")) / "summary.json").read_text())
    info = summary["sync_bn"]
    assert info["requested"] and info["effective"] and info["converted_layers"] > 0, info
    assert summary["ranks_in_sync"]
