"""The memory planner's FP32 figure against one real training step on this CPU (``--cpu-check``).

Paddle's CPU build has no ``max_memory_allocated``, so each batch size runs in a fresh process
(``python -m zoo.diagnostics.memory_cpu config.yaml batch``) that builds the model, the optimizer
and one batch, reads the process's peak resident set (``VmHWM`` in ``/proc/self/status``; the same
number as ``resource.getrusage().ru_maxrss``), runs forward, backward and ``optimizer.step()``
once, and reads it again. The growth is what that first step added at its peak (compared in :func:`zoo.diagnostics.memory.plan`): the gradients, the
optimizer's state (Paddle creates Adam's moments at the first step), the tensors kept for backward
and the transients. It is compared with the same rows of the FP32 prediction.

Neither a strict upper nor lower bound: pages that the process freed earlier (building the model,
loading the batch) and glibc kept are reused without growing the RSS, which makes it read low; the
allocator's own overhead, oneDNN's scratch buffers and caches, and Python objects make it read high.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STEP_ROWS = ("gradients", "optimizer", "activations", "largest")


def hwm_bytes() -> int:
    """The process's peak resident set so far (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def one_step(cfg, batch_size: int) -> dict:
    """Peak RSS before and after one FP32 training step at ``batch_size`` (call in a fresh process)."""
    from zoo.diagnostics.doctor import _fresh
    from zoo.diagnostics.probe import first_batch

    batch = first_batch(cfg, batch_size)
    model, task, optimizer = _fresh(cfg, 1)
    before = hwm_bytes()
    loss = task.losses(model, batch)["loss"]
    loss.backward()
    optimizer.step()
    after = hwm_bytes()
    return {"batch": batch_size, "hwm_before": before, "hwm_after": after, "growth": after - before,
            "source": "VmHWM (/proc/self/status)"}


def measure(cfg, batch_sizes) -> list[dict]:
    """:func:`one_step` for each batch size, each in its own fresh process."""
    from omegaconf import OmegaConf

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                                         os.environ.get("PYTHONPATH")])))
        out = []
        for b in batch_sizes:
            r = subprocess.run([sys.executable, "-m", "zoo.diagnostics.memory_cpu", str(path), str(b)],
                               capture_output=True, text=True, env=env)
            if r.returncode != 0:
                raise RuntimeError(f"CPU step at batch {b} failed: {r.stderr.strip().splitlines()[-1:]}")
            out.append(json.loads(r.stdout.strip().splitlines()[-1]))
        return out


def main(argv=None) -> int:
    from omegaconf import OmegaConf

    path, b = (argv or sys.argv[1:])[:2]
    cfg = OmegaConf.load(path)
    print(json.dumps(one_step(cfg, int(b))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
