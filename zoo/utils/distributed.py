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
