"""The memory planner's FP32 figure against real training steps on this CPU (``--cpu-check``).

Each batch size runs in a fresh process (``python -m zoo.diagnostics.memory_cpu config.yaml
batch``) that builds the model, the optimizer and one batch (the loader's thread stopped, see
:meth:`zoo.data.loader.GuardedLoader.close`), then runs two training steps as the trainer does
(forward, backward, ``optimizer.step()``, ``optimizer.clear_grad()``). The first step creates the
gradients and the optimizer's state; the second is a step as the planner models it, with both
alive throughout. Measured is the peak of the bytes Paddle's host allocator has handed out and
not yet taken back during the second step, less what it held before the first (parameters,
buffers, the batch): ``paddle.base.core.host_memory_stat_peak_value("Allocated", 0)``, the CPU
side of the statistics behind ``paddle.device.cuda.max_memory_allocated`` (Paddle 3.3 keeps them
for the CPU too but has no public call for it). It is compared with the same rows of the FP32
prediction: gradients, optimizer state, activations and the largest tensor.

Why not the process's peak resident set (``VmHWM``), which this check read until it was found to
put db_det's per-sample cost 27-51 % above the allocator's (MODEL_CARDS.md, "Memory"): the RSS
counts what glibc holds, not live tensors. Freed blocks stay resident in the heap and the heap
grows past holes too small for the next block (during one db_det forward at batch 4: heap 146 MiB
of which 32 MiB free, against 98 MiB of live tensors), and ``data.builder.keep_freed_memory``
tells glibc to keep up to 256 MiB of freed memory on purpose. With glibc made to map every block
of 64 KiB or more on its own (``MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0``, keep off)
the RSS growth per sample equals the allocator's. The first step's ``VmHWM`` growth is still
reported beside it (``rss_growth``), for what it is.

When the allocator's statistics read nothing (``FLAGS_use_system_allocator``, or a Paddle without
them) the check falls back to the first step's ``VmHWM`` growth and says so in ``source``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STEP_ROWS = ("gradients", "optimizer", "activations", "largest")
ALLOCATOR = "Paddle host allocator, peak of live bytes over a second step"
RSS = "VmHWM (/proc/self/status) over the first step; the allocator's statistics read nothing"


def hwm_bytes() -> int:
    """The process's peak resident set so far (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class HostAllocator:
    """Paddle's host allocator statistics: bytes allocated now, the peak since :meth:`reset_peak`.

    ``available`` is False when Paddle has no such statistics or they read 0 (the system allocator
    keeps none); Paddle's registry sums the live threads', so only the calling thread may
    allocate while they are read (a loader thread's batches vanish from them when it ends)."""

    def __init__(self):
        from paddle.base import core

        self._core = core
        self.available = all(hasattr(core, f"host_memory_stat_{k}") for k in
                             ("current_value", "peak_value", "reset_peak_value"))

    def current(self) -> int:
        return int(self._core.host_memory_stat_current_value("Allocated", 0))

    def peak(self) -> int:
        return int(self._core.host_memory_stat_peak_value("Allocated", 0))

    def reset_peak(self) -> None:
        self._core.host_memory_stat_reset_peak_value("Allocated", 0)


def train_step(model, task, optimizer, batch) -> None:
    """One FP32 step in the trainer's order (zoo.engine.trainer.Trainer.train_step)."""
    loss = task.losses(model, batch)["loss"]
    loss.backward()
    optimizer.step()
    optimizer.clear_grad()


def measure_step(step, allocator: HostAllocator | None = None) -> dict:
    """Peak growth of one training step ``step()`` as the planner models it: ``step()`` runs twice;
    measured is the allocator's peak during the second run less what was allocated before the
    first (parameters and batch are there before; gradients and optimizer state come with the
    first). ``rss_growth``: the VmHWM growth over the first run."""
    alloc = allocator or HostAllocator()
    base = alloc.current() if alloc.available else 0
    h0 = hwm_bytes()
    if alloc.available:
        alloc.reset_peak()
    step()
    h1 = hwm_bytes()
    out = {"rss_growth": h1 - h0, "hwm_before": h0, "hwm_after": h1}
    first_peak = alloc.peak() if alloc.available else 0
    if not alloc.available or first_peak <= base:   # statistics that read nothing
        return {**out, "growth": h1 - h0, "source": RSS}
    alloc.reset_peak()
    step()
    return {**out, "growth": alloc.peak() - base, "first_step_growth": first_peak - base,
            "allocated_before": base, "source": ALLOCATOR}


def one_step(cfg, batch_size: int) -> dict:
    """:func:`measure_step` of the FP32 training step at ``batch_size`` (call in a fresh process)."""
    from zoo.diagnostics.doctor import _fresh
    from zoo.diagnostics.probe import first_batch

    batch = first_batch(cfg, batch_size)
    model, task, optimizer = _fresh(cfg, 1)
    return {"batch": batch_size, **measure_step(lambda: train_step(model, task, optimizer, batch))}


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
