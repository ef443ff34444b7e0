"""Distributed helpers: the same code runs alone or under ``python -m paddle.distributed.launch``.

Rank 0 writes logs, checkpoints and the summary; every rank trains its shard and joins the
reductions. On CPU the launcher uses gloo, on GPU NCCL; nothing here depends on which.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist


def world_size() -> int:
    """Number of ranks launched (1 when run directly)."""
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def rank() -> int:
    """This process's rank (0 when run directly)."""
    return int(os.environ.get("PADDLE_TRAINER_ID", "0"))


def is_main() -> bool:
    return rank() == 0


def init() -> None:
    """Join the process group when launched with more than one rank."""
    if world_size() > 1 and not dist.is_initialized():
        dist.init_parallel_env()


def wrap(model):
    """DataParallel when distributed, the model itself otherwise."""
    return paddle.DataParallel(model) if world_size() > 1 else model


# Backend names of Paddle's kernel registry, by DeviceInfo.kind (zoo.amp.capability).
_KERNEL_BACKENDS = {"cpu": "CPU", "gpu": "GPU", "xpu": "XPU"}


def sync_batch_norm_kernel(device_kind: str) -> tuple[bool, str]:
    """Whether this Paddle build registers a ``sync_batch_norm`` kernel for ``device_kind``, and the
    backends it does register (read from Paddle's kernel registry, not assumed).

    Paddle 3.3.1's CPU build registers none: a SyncBatchNorm forward fails there with "The kernel
    `sync_batch_norm` is not registered" (measured under a two-rank gloo launch, issue 37)."""
    backend = _KERNEL_BACKENDS.get(device_kind, device_kind.upper())
    try:
        from paddle.base import core

        kernels = core._get_registered_phi_kernels("function").get("sync_batch_norm", [])
    except Exception:  # noqa: BLE001  (a Paddle without the registry call: CUDA is where it exists)
        return device_kind == "gpu", "GPU (assumed: this Paddle does not list its kernels)"
    backends = sorted({k.strip("()").split(",")[0].strip() for k in kernels})
    return backend in backends, ", ".join(backends) or "none"


def convert_sync_bn(model, requested: bool, device_kind: str) -> tuple:
    """Upstream's ``norm_type: sync_bn``: BatchNorm layers become ``paddle.nn.SyncBatchNorm`` when
    ``requested`` and this process is one of several ranks on a device with Paddle's kernel
    (PaddleDetection ``ppdet/engine/trainer.py``: ``sync_bn and use_gpu and nranks > 1``).

    Returns ``(model, info)``, info being summary.json's ``sync_bn``: ``requested``, ``effective`` (True only when the layers were
    converted), ``converted_layers`` and ``reason``. One process keeps plain BatchNorm (SyncBatchNorm
    over one device computes the same statistics); a device without the kernel (Paddle's CPU build)
    keeps plain BatchNorm too, per-rank statistics, and ``reason`` says so. Parameter and buffer names
    do not change (SyncBatchNorm takes over the BatchNorm's own weight, bias, _mean and _variance),
    so checkpoints stay PaddleDetection-compatible and load into a model with plain BatchNorm.
    """
    if not isinstance(requested, bool):
        raise ValueError(f"trainer.sync_bn: expected true or false, got {requested!r}")
    bns = [m for m in model.sublayers(include_self=True) if isinstance(m, paddle.nn.layer.norm._BatchNormBase)]
    out = {"requested": requested, "effective": False, "converted_layers": 0, "world_size": world_size()}
    if not requested:
        return model, {**out, "reason": "not requested (trainer.sync_bn=false)"}
    if world_size() <= 1:
        return model, {**out, "reason": "one process: plain BatchNorm (SyncBatchNorm over one device is BatchNorm)"}
    if not bns:
        return model, {**out, "reason": "the model has no BatchNorm layer to convert"}
    ok, backends = sync_batch_norm_kernel(device_kind)
    if not ok:
        return model, {**out, "reason": (f"plain BatchNorm, statistics per rank: Paddle {paddle.__version__} has no "
                                  f"sync_batch_norm kernel for {device_kind} (registered for: {backends})")}
    model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    converted = sum(isinstance(m, paddle.nn.SyncBatchNorm) for m in model.sublayers(include_self=True))
    return model, {**out, "effective": converted > 0, "converted_layers": converted,
            "reason": f"SyncBatchNorm: statistics over all {world_size()} ranks' images"}


def unwrap(model):
    """The plain Layer inside a DataParallel wrapper (state-dict names stay upstream-compatible)."""
    return getattr(model, "_layers", model)


def all_reduce_sums(sums: dict[str, float]) -> dict[str, float]:
    """Sum each value over ranks (float64 on the wire); identity when not distributed."""
    if world_size() == 1 or not sums:
        return dict(sums)
    keys = sorted(sums)
    t = paddle.to_tensor(np.array([sums[k] for k in keys], dtype=np.float64))
    dist.all_reduce(t)
    return dict(zip(keys, t.numpy().tolist()))


def all_gather_objects(obj) -> list:
    """Every rank's picklable ``obj``, in rank order; ``[obj]`` when not distributed.

    For metrics that are not sums over batches (COCO mAP needs every rank's detections).
    """
    if world_size() == 1:
        return [obj]
    out: list = []
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def sync_buffers(model, ema=None) -> None:
    """Average BatchNorm running statistics (and the EMA copy) over ranks.

    DataParallel all-reduces the gradients of trainable parameters only; the BN statistics
    (non-trainable parameters and buffers in Paddle) drift apart on each rank's shard. Averaging
    them before evaluation and checkpoints makes every rank hold, evaluate and save one model.
    Averaging values that are already equal (the EMA of trainable weights) leaves them bit-exact.
    """
    if world_size() == 1:
        return
    layer = unwrap(model)
    stats = [p for p in layer.parameters() if not p.trainable] + list(layer.buffers())
    if ema is not None:
        stats += list(ema.shadow.values())
    for t in stats:
        if t.dtype in (paddle.float32, paddle.float64, paddle.float16, paddle.bfloat16):
            dist.all_reduce(t)
            t.set_value(t / world_size())


def parameter_digest(model) -> str:
    """sha256 over all parameters and buffers in name order: equal digests mean identical weights."""
    h = hashlib.sha256()
    for name, value in sorted(unwrap(model).state_dict().items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(value.numpy()).tobytes())
    return h.hexdigest()


def gather_digests(digest: str) -> list[str]:
    """Each rank's parameter digest, in rank order (for the end-of-run consistency check)."""
    if world_size() == 1:
        return [digest]
    mine = paddle.to_tensor(np.frombuffer(bytes.fromhex(digest), dtype=np.uint8).astype(np.int32))
    out: list = []
    dist.all_gather(out, mine)
    return [bytes(t.numpy().astype(np.uint8).tolist()).hex() for t in out]


def exit_after_run() -> None:
    """End this launched rank now, after a run that completed on it: no C++ static teardown.

    Why: a compiled run (``trainer.compile=true``) keeps the gloo process group alive past
    interpreter finalization, and with it rank 0's TCP store server thread (the libuv
    ``LibUVMasterDaemon``). ``exit()`` then destroys C++ statics (glog's VLOG state, the phi flag
    registry) while that thread still runs; a peer closing its connection in that window makes
    the thread's ``readCallback`` log through the destroyed glog state: SIGABRT (launcher exit 250)
    or SIGSEGV (245) of rank 0 after the run's last line (issue 27, item 5).

    The barrier keeps rank 0's store up until every rank is past its last collective. Python's
    own clean-up (``atexit``: log handlers, loader workers) still runs; only the module and C++
    teardown is skipped. A failure before this point exits the ordinary way with its own status,
    and so does a run not under the launcher (nothing to do then).
    """
    if world_size() <= 1 or not dist.is_initialized():
        return
    barrier()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)
