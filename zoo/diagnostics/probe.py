"""Watch every op of a few training steps: where it ran, at what precision, with what magnitudes.

:class:`Probe` names each ``_C_ops`` call (and Tensor operator) by the innermost layer running it
(forward pre/post hooks on every sublayer keep a stack of names), reads whether the emulation made
its output low precision (its tag), summarises the output and, through a tensor hook, the gradient
that flows back into it. The same probe watches the FP32 measurement (an :class:`Emulation` with
rounding switched off: fp32 values, the emulation's own op decisions) and the emulated check, so
both runs name their ops identically. Shared with ``tools/amp_conformance.py``: :func:`train_batches`.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import paddle

from zoo.amp import emulation as emu
from zoo.data.sampler import TrainBatchSampler, build_loader
from zoo.diagnostics import conformance as conf
from zoo.diagnostics.numerics import FORMATS, Stats
from zoo.engine.run import build_data, seed_everything

SAMPLE = 8192           # entries kept per tensor for the step-1 comparison (evenly strided)
REDUCTIONS = {"sum", "mean"}
_OVER = "_zoo_doctor_over"  # set on low-precision outputs above the format's max


def train_batches(cfg, n: int) -> list:
    """The first ``n`` training batches a run with this config would see (same sampler, seed)."""

    seed_everything(cfg.seed)
    train_set, _, _ = build_data(cfg)
    sampler = TrainBatchSampler(len(train_set), cfg.model.batch_size, cfg.seed, 0, 1, drop_last=True)
    out = []
    loader = build_loader(train_set, sampler, 0)
    try:
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                break
    finally:
        loader.close()   # else its loading thread goes on filling a queue (memory the planner's CPU check would read)
    return out


def first_batch(cfg, batch_size: int):
    """The first training batch of ``batch_size`` samples this config's data gives."""
    from omegaconf import OmegaConf

    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    c.model.batch_size = batch_size
    got = train_batches(c, 1)
    if not got:
        raise ValueError(f"data={cfg.data.name} gives no batch of {batch_size}")
    return got[0]


def sample(x: np.ndarray) -> np.ndarray:
    flat = np.asarray(x, np.float32).ravel()
    return flat[:: max(1, flat.size // SAMPLE)][:SAMPLE].copy()


@dataclass
class OpRecord:
    """One named op (``layer:op``, ``#n`` for its n-th call in that layer in a step) over all steps."""

    key: str
    op: str
    layer: str
    layer_type: str
    mode: str                                   # the emulation's white / black / gray
    low_calls: int = 0
    calls: int = 0
    out: Stats = field(default_factory=Stats)
    grad: Stats = field(default_factory=Stats)   # gradient flowing back into the output (unscaled)
    reduction_error: float = 0.0
    inputs_overflowed: int = 0                   # calls whose low input already held |x| > format max
    own_overflows: int = 0                       # calls whose low output overflowed from clean inputs (a cause)
    first_out: np.ndarray | None = None
    first_grad: np.ndarray | None = None

    @property
    def low(self) -> bool:
        return self.low_calls * 2 > self.calls


class LayerNames:
    """Which sublayer is running: forward pre/post hooks on every sublayer keep a stack of
    ``(name, type)``; :attr:`current` is the innermost. ``with LayerNames(model) as names:``.
    A layer with ``zoo_name`` / ``zoo_kind`` attributes is named by them instead."""

    def __init__(self, model):
        self.model = model
        self._stack: list[tuple[str, str]] = [("model", type(model).__name__)]
        self._hooks = []

    @property
    def current(self) -> tuple[str, str]:
        return self._stack[-1]

    def _push(self, name, kind):
        def pre(_layer, _inputs):
            self._stack.append((name, kind))
        return pre

    def _pop(self, _layer, _inputs, _output):
        if len(self._stack) > 1:
            self._stack.pop()

    def __enter__(self):
        for name, layer in self.model.named_sublayers():
            # a layer may name itself (zoo/deploy/interpreter.py: one layer per program op, named by
            # the program variable it writes, its kind the op type)
            name = getattr(layer, "zoo_name", None) or name
            kind = getattr(layer, "zoo_kind", None) or type(layer).__name__
            self._hooks.append(layer.register_forward_pre_hook(self._push(name, kind)))
            self._hooks.append(layer.register_forward_post_hook(self._pop))
        return self

    def __exit__(self, *exc):
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


class Probe:
    """Context that records :class:`OpRecord` s for forward passes run inside it.

    ``grad_scale`` divides the gradients the tensor hooks see (a scaled backward); ``keep_first``
    keeps a sample of step 1's values for comparing two runs. ``observer(rec, args, kwargs, out)``,
    when given, sees every recorded call with its record (whose ``low_calls`` already counts it);
    ``numerics=False`` skips the value statistics and gradient hooks (the memory planner needs
    only the ops, their tensors and the emulation's decision).
    """

    def __init__(self, model, emulation: emu.Emulation, fmt_dtype: str, observer=None,
                 numerics: bool = True):
        self.model, self.emulation, self.dtype = model, emulation, fmt_dtype
        self.observer, self.numerics = observer, numerics
        self.records: dict[str, OpRecord] = {}
        self.step = 0
        self.grad_scale = 1.0
        self.limit = FORMATS[fmt_dtype].max
        self._names = LayerNames(model)
        self._seen: Counter = Counter()
        self._param_names = {id(p): n for n, p in model.named_parameters()}
        self.low_inputs: set[str] = set()   # parameters entering a low-precision op: fp16 gradients

    # ---- ops ------------------------------------------------------------------------------------
    def _hook(self, name, fn, args, kwargs):
        out = fn(*args, **kwargs)
        floats = conf._float_out(out)
        if not floats:
            return out
        layer, kind = self._names.current
        base = f"{layer}:{name}"
        self._seen[base] += 1
        key = base if self._seen[base] == 1 else f"{base}#{self._seen[base] - 1}"
        rec = self.records.get(key)
        if rec is None:
            rec = self.records[key] = OpRecord(key, name, layer, kind, self.emulation.mode(name))
        t = floats[0]
        rec.calls += 1
        fed_overflow = any(getattr(a, _OVER, False) for a in emu._float_tensors(args))
        rec.inputs_overflowed += int(fed_overflow)
        rec.low_calls += int(emu.is_low(t))
        if self.observer is not None:
            self.observer(rec, args, kwargs, out)
        if not self.numerics:
            return out
        if emu.is_low(t):  # its backward casts the gradient of every input to the format, but a
            # norm's scale and bias stay fp32 beside low x (cuDNN's batch norm), and so do their gradients
            inputs = emu._float_tensors(args[:1] if name in emu.X_ONLY_NORMS else args)
            self.low_inputs.update(self._param_names[id(a)] for a in inputs if id(a) in self._param_names)
        value = t.numpy()
        this = Stats().add(value)
        rec.out.merge(this)
        if emu.is_low(t) and (this.nonfinite or this.max_abs > self.limit):
            setattr(t, _OVER, True)
            rec.own_overflows += int(not fed_overflow)
        if self.step == 0 and rec.first_out is None:
            rec.first_out = sample(value)
        if name in REDUCTIONS and emu.is_low(t) and self.dtype == "bfloat16" and args:
            rec.reduction_error = max(rec.reduction_error, _bf16_reduction_error(args[0], value))
        if not t.stop_gradient:
            t.register_hook(self._grad_hook(rec))
        return out

    def _grad_hook(self, rec: OpRecord):
        step = self.step

        def hook(g):
            if g is None or not g._is_initialized():
                return None
            value = g.numpy() / self.grad_scale
            rec.grad.add(value)
            if step == 0 and rec.first_grad is None:
                rec.first_grad = sample(value)
            return None
        return hook

    @contextlib.contextmanager
    def forward(self):
        """Record the forward run inside (one training step's ``task.losses``)."""
        self._seen.clear()
        with conf.every_op(self._hook):
            yield

    def __enter__(self):
        self._names.__enter__()
        return self

    def __exit__(self, *exc):
        self._names.__exit__(*exc)


def bf16_round(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to bfloat16 (nearest even) and back, in NumPy."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def _bf16_reduction_error(x, out: np.ndarray) -> float:
    """Relative error of the whole sum of ``x`` when its inputs and its result are bf16 (a GPU
    accumulates in fp32, so rounding happens there only); large when the sum cancels."""
    if not isinstance(x, paddle.Tensor) or x.size < 2:
        return 0.0
    a = np.asarray(x.numpy(), np.float32).ravel()
    exact = float(a.astype(np.float64).sum())
    if exact == 0.0 or not np.isfinite(exact):
        return 0.0
    got = float(bf16_round(np.asarray([bf16_round(a).astype(np.float64).sum()], np.float32))[0])
    return abs(got - exact) / abs(exact)


def param_grads(model, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Parameter gradients as NumPy arrays (divided by ``scale``), by structured name."""
    return {n: p.grad.numpy() / scale for n, p in model.named_parameters() if p.grad is not None}
