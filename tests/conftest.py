"""Shared fixtures: compose the real configs and clamp them to tiny, fast runs (CPU, tmp folders)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(ROOT / "configs")
# Official checkpoint layouts (*.keys): shared/spec beside the repository (CI lays a copy there).
SPEC_DIR = Path(os.environ.get("AMPZOO_SPEC_DIR") or ROOT.parent / "shared" / "spec")
sys.path.insert(0, str(ROOT / "tools"))
import _entry  # noqa: E402,F401  (registers the run_stamp resolver)

# A tiny synthetic_shapes set and tiny model: a few steps take seconds on 2 CPU cores.
TINY = ["model=resnet_tiny", "data.builder.num_train=96", "data.builder.num_val=48",
        "model.batch_size=16", "model.eval_batch_size=24", "trainer.max_steps=4",
        "trainer.log_every=1", "trainer.ckpt_every=2", "trainer.progress=false", "sched.warmup_steps=1"]


@pytest.fixture(scope="session", autouse=True)
def ampzoo_home(tmp_path_factory):
    """All generated datasets and caches of the test session go to one temporary home."""
    home = tmp_path_factory.mktemp("ampzoo_home")
    old = os.environ.get("AMPZOO_HOME")
    os.environ["AMPZOO_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("AMPZOO_HOME", None)
    else:
        os.environ["AMPZOO_HOME"] = old


def launch_failure(out, log_dir) -> str:
    """Assertion message for a failed ``paddle.distributed.launch``: the one-line cause (failing rank,
    its signal or status, its last log line; zoo/engine/launch_report.py), then each rank's log tail."""
    from zoo.engine.launch_report import describe_launch_failure

    tails = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                    for p in sorted(Path(log_dir).glob("workerlog.*")))
    return describe_launch_failure(out.returncode, out.stderr + out.stdout, log_dir) + tails


def compose(overrides=(), config_name="train"):
    """Compose configs/<config_name>.yaml with overrides, as tools/train.py would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


@pytest.fixture
def tiny_cfg():
    """Factory: the real train.yaml clamped to a tiny CPU run, plus any extra overrides."""
    return lambda *extra: compose(TINY + list(extra))


def run_tool(args, cwd, env_extra=None, timeout=600):
    """Run a tools/ script as a user would; returns the CompletedProcess (text)."""
    import subprocess

    env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env_extra or {})}  # env_extra may set PYTHONWARNINGS
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def conv_bn_net(bn_layer):
    """A bias-free 3->4 conv followed by ``bn_layer`` (a 4-channel BatchNorm) with known, uneven
    running statistics and affine parameters, in eval mode: the case BatchNorm folding must get right."""
    import paddle

    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, bias_attr=False), bn_layer)
    bn = net[1]
    bn._mean.set_value(paddle.to_tensor([0.5, -1.0, 2.0, 0.0]))
    bn._variance.set_value(paddle.to_tensor([4.0, 0.25, 1.0, 9.0]))
    bn.weight.set_value(paddle.to_tensor([1.5, -0.5, 2.0, 1.0]))
    bn.bias.set_value(paddle.to_tensor([0.1, 0.2, -0.3, 0.0]))
    net.eval()
    return net
