"""Peak GPU memory of a training step, predicted on a CPU, per precision (``amp_doctor.py --memory``).

What a training step keeps on the GPU at its peak (the start of the backward pass, when every
tensor the backward needs is alive and the parameter gradients of the previous step are still
allocated, as ``optimizer.clear_grad()`` zeroes them in place):

- **parameters** (and buffers, e.g. BatchNorm's running statistics), at the dtype they are stored
  in: fp32, except at O2 where ``paddle.amp.decorate`` casts all but the norms to fp16/bf16
  (:func:`zoo.amp.emulation.mark_o2_parameters`, Paddle's own ``need_keep_fp32``);
- **gradients**, one per trainable parameter: fp32 at fp32 and O1; at O2 the parameter's own
  dtype unless ``amp.master_grad`` (then fp32);
- **optimizer state**, per ``optim.optimizer._target_``: Adam/AdamW two moments plus two
  one-element beta-power accumulators, Momentum one velocity, SGD none; fp32 unless the parameter
  is low and the optimizer has no ``multi_precision`` (Paddle then keeps them in the low dtype);
- **master weights**: at O2 with ``multi_precision`` (or ``amp.master_weight``), an fp32 copy of
  every low-precision parameter;
- **batch**: the tensors of one batch as the loader hands them over;
- **activations saved for backward**: traced, see :data:`SAVES`;
- **transient**: the cuDNN convolution workspace allowance (:data:`WORKSPACE_BYTES`) plus the
  largest single tensor the step creates (a forward output; its gradient has the same size);
- **allocator rounding**: every allocation above is rounded up to :data:`ALIGN` bytes, reported
  as its own row (the rows above are the exact byte counts).

The saved activations come from one forward pass per batch size watched by
:class:`~zoo.diagnostics.probe.Probe` (the doctor's op trace) under the precision's
:class:`~zoo.amp.emulation.Emulation` with rounding off, so every op carries the emulation's
low/fp32 decision, the one ``tools/amp_conformance.py`` checks against Paddle call by call. The
rule for what is saved: for every op call whose output requires a gradient, the tensors its
backward kernel reads, per :data:`SAVES` (Paddle's ``backward.yaml``: inputs and outputs that are
not ``no_need_buffer``; where that flag is not at hand, what Paddle keeps, measured op by op with
its host allocator: ``tests/test_memory_plan.py``). An input is saved at the dtype the op computes
in (an fp32 tensor entering an fp16 op is saved as its fp16 cast), an output at its own dtype. A
tensor saved at its own dtype is its whole allocation (:func:`allocation`): a view (reshape,
transpose, slice) keeps all of its base, and one allocation saved by several ops, or through
several views, counts once. A parameter or a batch tensor entering an op in its stored dtype is
the parameter, or the batch (rows of their own, not counted again); in any other dtype it is a cast
copy (O1's fp16 weights), counted. A Tensor operator with a Python number (``x * 2.0``, ``1 - x``)
is Paddle's ``scale`` and keeps nothing. An op missing from :data:`SAVES` counts all its tensor
inputs (an over-estimate). Known under-counts: ``number / tensor`` (read as ``tensor / number``)
and layer_norm's mean and variance (x's size over the normalised size; the call returns neither).

Activations, the batch and the largest tensor are traced at two batch sizes and fitted as
``fixed + per_sample * batch``; a third trace (fp32) tests that line.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import paddle

from zoo.amp import emulation as emu
from zoo.diagnostics import memory_cpu
from zoo.diagnostics.probe import Probe, first_batch
from zoo.engine.run import ConfigError, build, build_amp, seed_everything
from zoo.utils.fileio import atomic_write

MiB = 1 << 20
# Paddle's default allocator (FLAGS_allocator_strategy=auto_growth) aligns every GPU allocation to
# GpuMinChunkSize() = 1 << 8 bytes (paddle/phi/core/platform/device/gpu/gpu_info.cc, used by
# allocator_facade.cc for the AutoGrowthBestFitAllocator).
ALIGN = 256
# FLAGS_conv_workspace_size_limit, default 512 (MB): cuDNN picks the fastest convolution algorithm
# whose workspace fits (paddle/phi/core/flags.cc). Allowed once, for the op running at the peak.
WORKSPACE_BYTES = 512 * MiB
# What the CUDA context, cuBLAS/cuDNN handles and loaded kernels take before Paddle allocates a
# tensor: about 0.5-1 GiB on A100/H100 with CUDA 11/12; reserved whole, as the upper end.
CUDA_CONTEXT_MIB = 1024
# memory.total as nvidia-smi reports it (MiB) for the SXM parts (PCIe parts report a little less).
CARDS = {"V100-16GB": 16160, "V100-32GB": 32768, "A100-40GB": 40960, "A100-80GB": 81920,
         "H100-80GB": 81559, "H200-141GB": 143771}
PRECISIONS = ("fp32", "O1", "O2", "bf16_O1", "bf16_O2")
HEADROOM = 0.10

# op -> (positions of the inputs its backward reads, positions of the outputs it reads), from
# Paddle's backward.yaml (inputs marked no_need_buffer, e.g. add's x and y, are left out).
_NOTHING = ((), ())
_INPUTS_01 = ((0, 1), ())
_OUT = ((), (0,))
_IN = ((0,), ())
SAVES = {
    **dict.fromkeys(("conv2d", "depthwise_conv2d", "conv2d_transpose", "depthwise_conv2d_transpose",
                     "matmul", "linear", "multiply", "maximum", "minimum", "elementwise_pow",
                     "sigmoid_cross_entropy_with_logits", "take_along_axis"), _INPUTS_01),
    "divide": ((0, 1), (0,)),                     # divide_grad(x, y, out, out_grad)
    **dict.fromkeys(("batch_norm", "sync_batch_norm"), ((0,), (3, 4))),     # x, saved mean / variance
    **dict.fromkeys(("layer_norm", "instance_norm"), ((0,), (1, 2))),
    "group_norm": ((0,), (0, 1, 2)),              # x, y, mean, variance
    **dict.fromkeys(("relu", "relu6", "sigmoid", "tanh", "exp", "hardsigmoid", "softmax", "log_softmax",
                     "sqrt", "rsqrt", "reciprocal", "elu"), _OUT),
    **dict.fromkeys(("hardswish", "swish", "leaky_relu", "gelu", "mish", "softplus", "log",
                     "square", "abs", "pow", "clip", "where", "cumsum"), _IN),
    **dict.fromkeys(("silu", "max", "min", "amax", "amin", "logsumexp"), ((0,), (0,))),   # x and out
    **dict.fromkeys(("gather", "gather_nd", "index_select", "index_sample", "put_along_axis",
                     "masked_select"), ((1,), ())),   # the index (or mask)
    "pool2d": ((0,), (0,)),
    "max_pool2d_with_index": ((), (1,)),          # the argmax mask
    "argsort": ((), (1,)),                        # the indices
    "topk": ((0,), (1,)),                         # x and the indices
    "cross_entropy_with_softmax": ((1,), (0,)),   # label, softmax
    **dict.fromkeys(("add", "subtract", "scale", "reshape", "transpose", "flatten", "squeeze",
                     "unsqueeze", "slice", "strided_slice", "split", "split_with_num", "concat", "stack",
                     "unbind", "expand", "expand_as", "tile", "roll", "flip", "pad", "pad3d", "mean", "sum",
                     "assign", "cast", "mean_all", "nearest_interp", "bilinear_interp", "full_like", "sign",
                     "floor", "ceil", "round", "tril", "triu"), _NOTHING),
}
# Ops whose kernels take contiguous inputs: given a non-contiguous view (a slice across the batch,
# a transpose) they keep the contiguous copy made for them, not the view's base (measured op by op
# with Paddle 3.3's host allocator; multiply, abs, conv2d, maximum, divide, matmul ... keep the view).
_CONTIGUOUS_INPUTS = frozenset(("pow", "elementwise_pow", "hardswish", "swish", "gelu", "clip", "cumsum",
                                "topk", "take_along_axis", "batch_norm", "sync_batch_norm", "logsumexp"))
# A Tensor operator with a Python number (x * 2.0, 1 - x, x / k) runs Paddle's ``scale``, whose
# backward reads no tensor. Not so a number divided by a tensor (2.0 / x: divide of a full tensor,
# x and out, all kept), which the trace cannot tell from x / 2.0: it is under-counted.
_SCALAR_ARITH = frozenset(("add", "subtract", "multiply", "divide"))
_UID = "_zoo_mem_uid"
_uids = itertools.count(1)


def aligned(nbytes: int) -> int:
    """``nbytes`` as the allocator hands it out (rounded up to :data:`ALIGN`; 0 stays 0)."""
    return -(-int(nbytes) // ALIGN) * ALIGN


def _uid(t) -> int:
    """A number for this tensor object for the trace's lifetime (``id`` is reused once it is freed)."""
    u = getattr(t, _UID, None)
    if u is None:
        u = next(_uids)
        setattr(t, _UID, u)
    return u


def allocation(t) -> tuple[int, int] | None:
    """(start address, bytes) of the allocation holding ``t``'s entries, or None without one. A
    view (reshape, transpose, a slice: Paddle's stride kernels, on the GPU too) and the copy
    ``x._use_gpudnn(False)`` every pooling function makes of its input share their base tensor's;
    a kept view keeps all of it (DB's loss keeps two of the three channels of its maps by
    slices, and with them the third). The address identifies an allocation only while it is
    alive: :class:`SavedTensors` keeps every tensor it counted until it is dropped."""
    try:
        if not t._is_initialized():
            return None
        start, size = int(t.data_ptr()) - int(t._offset()), int(t._holder_size())
    except (AttributeError, RuntimeError, ValueError):
        return None
    return (start, size) if start and size else None


def _is_float(t) -> bool:
    return isinstance(t, paddle.Tensor) and t.dtype in (paddle.float32, paddle.float64, paddle.float16,
                                                        paddle.bfloat16)


class Tally:
    """Bytes of a list of tensors, exact and as allocated."""

    def __init__(self):
        self.raw = self.rounded = self.count = 0

    def add(self, nbytes: int) -> None:
        self.raw += int(nbytes)
        self.rounded += aligned(nbytes)
        self.count += 1

    def as_dict(self) -> dict:
        return {"bytes": self.raw, "allocated": self.rounded, "tensors": self.count}


class SavedTensors:
    """Probe observer: the tensors backward would keep, at the dtype the emulation's rule gives."""

    def __init__(self, model, low_bytes: int, rule: emu.Emulation | None = None, batch=None):
        self.low_bytes, self.rule = low_bytes, rule
        self.params = {id(p): p for p in model.parameters()}                       # by object
        self.param_allocs = {a[0]: p for p in model.parameters() if (a := allocation(p))}  # by address
        # the batch's tensors are resident (the batch row): kept by an op at their own dtype they
        # cost nothing more (the first conv keeps the image it reads)
        self.resident = {a[0] for t in _tensors(batch) if (a := allocation(t))}
        self.seen: dict[tuple, int] = {}               # (what, bytes per entry) -> bytes
        self._alive: list = []                         # what was counted, so no address is reused
        self.weight_casts = 0                          # of which: parameters cast to another dtype
        self.largest = (0, "")                         # bytes, layer:op of the largest output
        self.unknown: set[str] = set()

    def _entry_bytes(self, t, low: bool | None) -> int:
        """Bytes per entry: ``low`` True/False for an input cast to the op's dtype, None for its own."""
        if not _is_float(t):
            return t.element_size()
        if low is None:
            low = emu.is_low(t) or t.dtype in (paddle.float16, paddle.bfloat16)
        return self.low_bytes if low else 4

    def _save(self, t, per_entry: int, copied: bool = False) -> None:
        """Count ``t`` kept at ``per_entry`` bytes an entry; ``copied``: as the contiguous copy an
        op of :data:`_CONTIGUOUS_INPUTS` makes of a non-contiguous view."""
        alloc = allocation(t)
        own = per_entry == self._entry_bytes(t, None) and not (copied and not t.is_contiguous())
        if alloc is not None and own:                  # the tensor itself: its whole allocation
            key, nbytes = (("allocation", alloc[0]), per_entry), alloc[1] // t.element_size() * per_entry
        else:                                          # a cast to the op's dtype, or a copy: new
            where = (alloc[0], int(t.data_ptr()), int(t.size)) if alloc is not None else ("object", _uid(t))
            key, nbytes = (where, per_entry), int(t.size) * per_entry
        if key in self.seen:
            return
        p = self.param_allocs.get(alloc[0]) if alloc is not None else self.params.get(id(t))
        if p is not None:
            stored = self.low_bytes if getattr(p, emu.O2_PARAM, False) else 4
            if stored == per_entry:
                return                                 # the parameter itself
        elif alloc is not None and own and alloc[0] in self.resident:
            return                                     # a batch tensor itself
        self.seen[key] = nbytes
        self._alive.append(t)
        if p is not None:
            self.weight_casts += nbytes

    def __call__(self, rec, args, kwargs, out) -> None:
        outs = [t for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, paddle.Tensor)]
        floats = [t for t in outs if _is_float(t)]
        if not floats:
            return
        low = emu.is_low(floats[0])
        if rec.op == "linear" and self.rule is not None:
            # the emulation computes linear as matmul then add, each under the rule: its output is
            # fp32 at O1 (the fp32 bias promotes the add) while x and w enter the matmul low
            low = low or self.rule.mode("matmul") == "white"
        for t in floats:
            size = int(t.size) * self._entry_bytes(t, None)
            if size > self.largest[0]:
                self.largest = (size, rec.key)
        if all(t.stop_gradient for t in floats):
            return                                     # no backward node: nothing kept
        spec = SAVES.get(rec.op)
        if rec.op in _SCALAR_ARITH and any(not isinstance(a, paddle.Tensor) for a in args[:2]):
            spec = _NOTHING                            # Paddle's scale: keeps nothing
        if spec is None:
            self.unknown.add(rec.op)
            ins = [a for a in (*args, *kwargs.values()) if isinstance(a, paddle.Tensor)]
            ins += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, paddle.Tensor)]
            spec_out = ()
        else:
            positions, spec_out = spec
            ins = [args[i] for i in positions if i < len(args) and isinstance(args[i], paddle.Tensor)]
        copied = rec.op in _CONTIGUOUS_INPUTS
        for t in ins:
            self._save(t, self._entry_bytes(t, low if _is_float(t) else None), copied)
        for i in spec_out:
            if i < len(outs):
                self._save(outs[i], self._entry_bytes(outs[i], None))

    def tally(self) -> Tally:
        t = Tally()
        for nbytes in self.seen.values():
            t.add(nbytes)
        return t


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif x is not None:
        yield x


def _tensors(batch) -> list:
    return [x for x in _leaves(batch) if isinstance(x, paddle.Tensor)]


def _batch_tally(batch) -> Tally:
    t = Tally()
    for x in _leaves(batch):
        if isinstance(x, paddle.Tensor):
            t.add(int(x.size) * x.element_size())
        elif isinstance(x, np.ndarray):
            t.add(x.nbytes)
    return t


def _low_bytes(dtype: str) -> int:
    return 2 if dtype in ("float16", "bfloat16") else 4


def optimizer_kind(target: str) -> tuple[str, int]:
    """(name, fp32-sized state tensors per parameter) of an ``optim.optimizer._target_``."""
    name = str(target).rsplit(".", 1)[-1].lower()
    if name in ("adam", "adamw", "lamb"):
        return name, 2
    if name == "momentum":
        return name, 1
    if name == "sgd":
        return name, 0
    raise ConfigError(f"optim.optimizer._target_: {target}: the memory planner knows Adam, AdamW, Lamb, "
                      "Momentum and SGD")


def state_bytes(model, level: str, dtype: str, optimizer: str, multi_precision: bool,
                master_grad: bool = False, master_weight: bool = False) -> dict[str, Tally]:
    """Parameters, gradients, optimizer state and master weights of ``model`` (O2: call after
    :func:`~zoo.amp.emulation.mark_o2_parameters`)."""
    low = _low_bytes(dtype)
    kind, moments = optimizer_kind(optimizer)
    master_on = level == "O2" and (multi_precision or master_weight)
    out = {k: Tally() for k in ("parameters", "gradients", "optimizer", "master_weights")}
    for p in model.parameters():
        is_low = level == "O2" and getattr(p, emu.O2_PARAM, False)
        per = low if is_low else 4
        n = int(p.size)
        out["parameters"].add(n * per)
        if p.stop_gradient:
            continue
        out["gradients"].add(n * (4 if master_grad or not is_low else low))
        state_per = 4 if (not is_low or multi_precision) else low
        for _ in range(moments):
            out["optimizer"].add(n * state_per)
        if kind in ("adam", "adamw", "lamb"):   # beta1_pow, beta2_pow: one fp32 entry each
            out["optimizer"].add(4)
            out["optimizer"].add(4)
        if is_low and master_on:
            out["master_weights"].add(n * 4)
    for b in model.buffers():
        if isinstance(b, paddle.Tensor) and b.size:
            out["parameters"].add(int(b.size) * b.element_size())
    return out


def _fresh_model(cfg):
    seed_everything(cfg.seed)
    model = build(cfg.model.net, "model.net")
    model.train()
    return model, build(cfg.model.task, "model.task")


def trace(model, task, batch, amp) -> dict:
    """One forward pass of ``task.losses(model, batch)`` under ``amp``'s op rule, watched by the
    doctor's probe: saved activations, the batch, the largest output (bytes)."""
    if amp.enabled:
        rule = emu.Emulation(amp.level, amp.dtype, amp.white, amp.black, forward=False, backward=False)
        autocast, low = rule, _low_bytes(amp.dtype)
    else:  # fp32: nothing is low; the probe still asks a rule for each op's mode
        rule, autocast, low = emu.Emulation("O1", "float16"), contextlib.nullcontext, 4
    saved = SavedTensors(model, low, rule if amp.enabled else None, batch)
    with Probe(model, rule, amp.dtype if amp.enabled else "float16", observer=saved, numerics=False) as probe:
        with autocast(), probe.forward():
            losses = task.losses(model, batch)
    del losses
    acts = saved.tally()
    return {"activations": acts.as_dict(), "weight_casts": saved.weight_casts,
            "batch": _batch_tally(batch).as_dict(), "largest": saved.largest[0],
            "largest_op": saved.largest[1], "unknown_ops": sorted(saved.unknown)}


def _line(b1, y1, b2, y2) -> tuple[float, float]:
    slope = (y2 - y1) / (b2 - b1)
    return y1 - slope * b1, slope


def plan_precision(cfg, batch_sizes=(1, 2), check_at: int | None = None, batches=None) -> dict:
    """Everything for one precision's config: state tensors, traces at ``batch_sizes``, the line."""
    amp = build_amp(cfg)
    level = amp.level if amp.enabled else "fp32"
    model, task = _fresh_model(cfg)
    if level == "O2":
        emu.mark_o2_parameters(model, amp.dtype)
    opt = cfg.optim.optimizer
    states = state_bytes(model, level, amp.dtype, opt._target_, bool(opt.get("multi_precision", False)),
                         bool(amp.master_grad), bool(amp.master_weight))
    batches = batches or {}
    traces = {}
    for b in (*batch_sizes, *([check_at] if check_at else [])):
        if b not in batches:
            batches[b] = first_batch(cfg, b)
        traces[b] = trace(model, task, batches[b], amp)
    b1, b2 = batch_sizes
    fits = {}
    for name, get in (("activations", lambda t: t["activations"]["bytes"]),
                      ("activations_allocated", lambda t: t["activations"]["allocated"]),
                      ("batch", lambda t: t["batch"]["bytes"]),
                      ("batch_allocated", lambda t: t["batch"]["allocated"]),
                      ("largest", lambda t: t["largest"])):
        fits[name] = _line(b1, get(traces[b1]), b2, get(traces[b2]))
    check = None
    if check_at:
        got = traces[check_at]["activations"]["bytes"]
        want = fits["activations"][0] + fits["activations"][1] * check_at
        check = {"batch": check_at, "traced": got, "line": want, "rel_err": abs(want - got) / max(1, got)}
    return {"precision": cfg.amp.name, "level": level, "dtype": amp.dtype if amp.enabled else "float32",
            "master_grad": bool(amp.master_grad) if level == "O2" else None,
            "multi_precision": bool(opt.get("multi_precision", False)),
            "optimizer": optimizer_kind(opt._target_)[0],
            "states": {k: v.as_dict() for k, v in states.items()},
            "traces": {str(b): t for b, t in traces.items()}, "fits": fits, "linearity": check}


ROWS = ("parameters", "gradients", "optimizer", "master_weights", "batch", "activations",
        "workspace", "largest", "rounding")


def breakdown(p: dict, batch: int) -> dict:
    """Bytes per row at ``batch`` from a :func:`plan_precision` result, and their sum ``peak``."""
    f, s = p["fits"], p["states"]

    def at(name):
        a, k = f[name]
        return max(0.0, a + k * batch)
    rows = {k: float(s[k]["bytes"]) for k in ("parameters", "gradients", "optimizer", "master_weights")}
    rows["batch"], rows["activations"] = at("batch"), at("activations")
    rows["workspace"], rows["largest"] = float(WORKSPACE_BYTES), at("largest")
    rounded = sum(s[k]["allocated"] for k in s) + at("batch_allocated") + at("activations_allocated") \
        + aligned(rows["largest"]) + WORKSPACE_BYTES
    rows["rounding"] = max(0.0, rounded - sum(rows.values()))
    rows["peak"] = sum(rows[k] for k in ROWS)
    return rows


def largest_batch(p: dict, limit_bytes: float) -> int:
    """The largest batch whose predicted peak stays within ``limit_bytes`` (0: not even batch 1).
    The peak grows with the batch (the rows are lines, rounded up per tensor): bisect."""
    if breakdown(p, 1)["peak"] > limit_bytes:
        return 0
    lo, hi = 1, 2
    while breakdown(p, hi)["peak"] <= limit_bytes:
        lo, hi = hi, hi * 2
        if hi > 1 << 24:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if breakdown(p, mid)["peak"] <= limit_bytes else (lo, mid)
    return lo


PREDICTION_WHAT = "planner prediction for a GPU (tools/amp_doctor.py --memory)"


def predict_peak(cfg, batch: int | None = None) -> dict:
    """The planner's peak of one training step for ``cfg``'s precision at ``batch`` (default
    ``model.batch_size``): the figure ``--memory`` prints in its peak row, with the rows behind it."""
    p = plan_precision(cfg)
    b = int(batch or cfg.model.batch_size)
    rows = breakdown(p, b)
    return {"precision": p["precision"], "level": p["level"], "batch": b, "peak_bytes": rows["peak"],
            "peak_mb": rows["peak"] / MiB, "rows": rows}


def _as_fp32(cfg):
    """``cfg`` with AMP off (a run whose AMP request fell back to FP32, ``amp.on_unsupported=fp32``)."""
    from omegaconf import OmegaConf

    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    c.amp.enabled, c.amp.name = False, "fp32"
    return c


@contextlib.contextmanager
def _on_cpu():
    """Trace on the CPU: the planner needs shapes and dtypes only, and a GPU run's memory stays untouched."""
    before = paddle.device.get_device()
    if before != "cpu":
        paddle.set_device("cpu")
    try:
        yield
    finally:
        if before != "cpu":
            paddle.set_device(before)


def summary_prediction(cfg, effective: str, batch: int) -> dict:
    """summary.json's ``predicted_peak_memory_mb`` and ``predicted_memory`` for a finished run of
    ``cfg`` (``effective``: the run's effective precision; ``batch``: per rank). Called by
    :func:`zoo.engine.run.train` through tools/train.py when ``trainer.predict_memory`` asks for it."""
    if effective == "fp32" and cfg.amp.enabled:
        cfg = _as_fp32(cfg)
    with _on_cpu():
        pred = predict_peak(cfg, batch)
    peak = round(pred["peak_mb"], 1)
    return {"predicted_peak_memory_mb": peak,
            "predicted_memory": {"precision": pred["precision"], "batch": pred["batch"], "peak_mb": peak,
                                 "what": PREDICTION_WHAT}}


def parse_card(text: str | None) -> tuple[str, float]:
    """(name, MiB) of ``--gpu-memory``: a card of :data:`CARDS` or an amount such as ``80GB``,
    ``40GiB``, ``16000MiB``. GB is read as GiB (nvidia-smi's 81920 MiB is the "80 GB" A100)."""
    if text is None:
        text = "A100-80GB"
    for name, mib in CARDS.items():
        if text.lower() == name.lower():
            return name, float(mib)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(gib|gb|g|mib|mb|m)?\s*", text.lower())
    if not m:
        raise ConfigError(f"--gpu-memory: {text!r}: give an amount (80GB, 40GiB, 16000MiB) or a card: "
                          + ", ".join(CARDS))
    value, unit = float(m.group(1)), (m.group(2) or "gb")
    mib = value * 1024 if unit.startswith("g") else value
    if mib <= CUDA_CONTEXT_MIB:
        raise ConfigError(f"--gpu-memory: {text}: not more than the {CUDA_CONTEXT_MIB} MiB CUDA context")
    return text, mib


def plan(configure, precisions=PRECISIONS, card: str | None = None, headroom: float = HEADROOM,
         batch_sizes=(1, 2), check_at: int | None = 4, cpu_check: bool = False) -> dict:
    """The memory plan: ``configure(precision)`` gives the composed config for each precision.
    ``cpu_check``: also real FP32 steps at the configured batch and half of it, each batch in a fresh
    process, their peak of live tensors against the prediction (:mod:`zoo.diagnostics.memory_cpu`)."""
    t0 = time.time()
    name, mib = parse_card(card)
    if not 0 <= headroom < 1:
        raise ConfigError(f"--headroom: {headroom}: expected a share in [0, 1)")
    limit = (mib - CUDA_CONTEXT_MIB) * MiB * (1 - headroom)
    out = {"card": name, "card_mib": mib, "cuda_context_mib": CUDA_CONTEXT_MIB, "headroom": headroom,
           "limit_bytes": limit, "align": ALIGN, "workspace_bytes": WORKSPACE_BYTES,
           "batch_sizes": list(batch_sizes), "precisions": {}}
    batches = {}
    for i, prec in enumerate(precisions):
        cfg = configure(prec)
        if i == 0:
            out.update(model=cfg.model.name, data=cfg.data.name, batch_size=int(cfg.model.batch_size),
                       base_batch_size=cfg.optim.get("base_batch_size"), lr=float(cfg.optim.lr))
        p = plan_precision(cfg, batch_sizes, check_at if i == 0 else None, batches)
        p["at_batch"] = breakdown(p, out["batch_size"])
        p["largest_batch"] = largest_batch(p, limit)
        out["precisions"][prec] = p
    if cpu_check:
        b = out["batch_size"]
        sizes = sorted({max(1, b // 2), b})
        fp32 = out["precisions"].get("fp32") or plan_precision(configure("fp32"), batch_sizes)
        rows = []
        for m in memory_cpu.measure(configure("fp32"), sizes):
            pred = breakdown(fp32, m["batch"])
            predicted = sum(pred[k] for k in memory_cpu.STEP_ROWS)
            rows.append({**m, "predicted": predicted, "ratio": m["growth"] / predicted if predicted else None})
        out["cpu_check"] = rows
    out["seconds"] = time.time() - t0
    return out


def _mib(x: float) -> str:
    return f"{x / MiB:.1f}"


LABELS = {"parameters": "parameters (+buffers)", "gradients": "gradients", "optimizer": "optimizer state",
          "master_weights": "master weights (fp32)", "batch": "batch (inputs, targets)",
          "activations": "activations saved for backward", "workspace": "cuDNN workspace allowance",
          "largest": "largest single tensor", "rounding": "allocator rounding (256 B)", "peak": "peak"}


def table(result: dict) -> str:
    precs = list(result["precisions"])
    b = result["batch_size"]
    lines = [f"model={result['model']} data={result['data']}: predicted peak GPU memory of one training step "
             f"(MiB) at model.batch_size={b}; card {result['card']} ({result['card_mib']:.0f} MiB - "
             f"{result['cuda_context_mib']} MiB CUDA context, {result['headroom']:.0%} headroom = "
             f"{_mib(result['limit_bytes'])} MiB usable)"]
    head = f"{'row':34s}" + "".join(f"{p:>10s}" for p in precs)
    lines += [head, "-" * len(head)]
    for row in (*ROWS, "peak"):
        if row == "peak":
            lines.append("-" * len(head))
        lines.append(f"{LABELS[row]:34s}" + "".join(f"{_mib(result['precisions'][p]['at_batch'][row]):>10s}"
                                                    for p in precs))
    lines.append("-" * len(head))
    per = "".join(f"{_mib(breakdown(result['precisions'][p], 1)['peak'] - breakdown(result['precisions'][p], 0)['peak']):>10s}"
                  for p in precs)
    lines.append(f"{'per sample':34s}" + per)
    lines.append(f"{'largest batch that fits':34s}" + "".join(f"{result['precisions'][p]['largest_batch']:>10d}"
                                                             for p in precs))
    for p in precs:
        n = result["precisions"][p]["largest_batch"]
        line = f"  amp={p}: model.batch_size={n}" if n else f"  amp={p}: does not fit at batch 1"
        if n and result.get("base_batch_size"):
            line += (f"  (optim.base_batch_size={result['base_batch_size']}: the LR scales with it, "
                     f"{result['lr']:g} x {n}/{result['base_batch_size']} = {result['lr'] * n / result['base_batch_size']:g})")
        lines.append(line)
    chk = result["precisions"][precs[0]].get("linearity")
    b1, b2 = result["batch_sizes"]
    if chk:
        lines.append(f"activations traced at batch {b1} and {b2}, fitted as fixed + per-sample; at batch "
                     f"{chk['batch']} the line gives {chk['line'] / MiB:.1f} MiB, the trace {chk['traced'] / MiB:.1f} "
                     f"MiB ({chk['rel_err']:.1%} apart)")
    for r in result.get("cpu_check", []):
        pred = (f"predicted (gradients + optimizer state + activations + largest tensor) {r['predicted'] / MiB:.1f} "
                f"MiB, ratio {r['ratio']:.2f}")
        if r["source"] == memory_cpu.ALLOCATOR:
            lines.append(f"CPU check, fp32 batch {r['batch']}: a second real step's peak of live tensors (Paddle's "
                         f"host allocator) reached {r['growth'] / MiB:.1f} MiB above what the model and batch held; "
                         f"{pred}; the process's peak RSS grew {r['rss_growth'] / MiB:.1f} MiB over the first step")
        else:
            lines.append(f"CPU check, fp32 batch {r['batch']}: one real step grew the peak RSS by {r['growth'] / MiB:.1f} "
                         f"MiB ({r['source']}); {pred}")
    cpu = result.get("cpu_check") or []
    if len(cpu) == 2:   # the difference cancels what does not scale with the batch
        (a, b) = cpu
        lines.append(f"CPU check, batch {a['batch']} -> {b['batch']}: measured +{(b['growth'] - a['growth']) / MiB:.1f} "
                     f"MiB, predicted +{(b['predicted'] - a['predicted']) / MiB:.1f} MiB")
    if cpu and all(r["source"] == memory_cpu.ALLOCATOR for r in cpu):
        lines.append("  (live bytes, as a GPU's max_memory_allocated counts them; the CPU kernels' transients "
                     "differ from CUDA's: im2col buffers, no cuDNN workspace. The RSS is glibc's heap, no measure "
                     "of live tensors: freed blocks it keeps resident read high, pages it reuses low)")
    elif cpu:
        lines.append("  (RSS growth is no strict bound: freed pages glibc kept are reused without growth, "
                     "reading low; freed blocks it keeps resident and holes in its heap read high)")
    unknown = sorted({o for p in precs for t in result["precisions"][p]["traces"].values() for o in t["unknown_ops"]})
    if unknown:
        lines.append("ops without a saving rule (all their inputs counted): " + ", ".join(unknown))
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max(1, max(p["largest_batch"] for p in result["precisions"].values()), result["batch_size"])
    xs = np.unique(np.linspace(1, top * 1.15, 60).astype(int))
    for name, p in result["precisions"].items():
        ax.plot(xs, [breakdown(p, int(x))["peak"] / (1 << 30) for x in xs], label=name,
                ls=":" if name.startswith("bf16") else "-", lw=2.2 if name.startswith("bf16") else 1.4)
        ax.plot([result["batch_size"]], [p["at_batch"]["peak"] / (1 << 30)], "o", color=ax.lines[-1].get_color())
    ax.axhline(result["limit_bytes"] / (1 << 30), color="red", ls="--",
               label=f"{result['card']} usable ({result['headroom']:.0%} headroom)")
    ax.axhline((result["card_mib"] - result["cuda_context_mib"]) / 1024, color="red", lw=0.8,
               label=f"{result['card']} less the CUDA context")
    ax.set_xlabel("batch size")
    ax.set_ylabel("predicted peak (GiB)")
    ax.set_title(f"{result['model']}: peak training memory by batch (dot: configured batch)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def write(result: dict, out: Path) -> str:
    """memory.json and memory.png into ``out``; returns the table (and the files' line)."""
    out.mkdir(parents=True, exist_ok=True)
    text = table(result)
    data = json.dumps(result, indent=1, default=float)
    atomic_write(out / "memory.json", lambda tmp: tmp.write_text(data))
    atomic_write(out / "memory.png", lambda tmp: plot(result, tmp))
    return text + f"\nwrote {out / 'memory.json'}, memory.png"
