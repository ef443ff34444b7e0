"""Emulated fp16/bf16 numerics on a CPU: the numbers of Paddle's AMP, not its speed.

Paddle's CPU build has no fp16/bf16 conv or matmul kernels, but it casts to and from both formats.
Inside :class:`Emulation` every wrapped op follows Paddle's AMP rules (the op lists come from
``paddle.amp.white_list()`` / ``black_list()`` plus the recipe's custom lists):

- O1: white-list ops (conv2d, matmul, linear, ...) round their float inputs and their output to the
  low-precision format; black-list ops compute in fp32; every other op follows its inputs: it
  rounds its output only when all its float tensor inputs are low precision (Paddle's promote rule,
  so ``conv_out + fp32_bias`` is fp32).
- O2: every wrapped op except the black list rounds inputs and output; norms keep fp32 parameters
  (only their data input and output are rounded), as ``paddle.amp.decorate`` keeps them.

Rounding is a cast round trip ``x.astype(fp16).astype(fp32)``: values beyond the format's range
become inf and tiny values flush to zero, exactly as in the format; its backward casts the incoming
gradient the same way, so gradients flowing back through a low-precision op are rounded (and
overflow) too. Parameters stay fp32 (master weights) and are rounded where an op consumes them.

What is wrapped: the ``paddle._C_ops`` functions in ``WRAPPED_OPS`` (what paddle.nn layers and
functionals call) and the Tensor arithmetic operators. An op outside that set computes in fp32 and
its output counts as fp32, which can only under-state rounding, never invent it.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import paddle
from paddle import _C_ops
from paddle.autograd import PyLayer

# Paddle's AMP lists use legacy op names; the wrapped functions use _C_ops names.
ALIASES = {"elementwise_add": "add", "elementwise_sub": "subtract", "elementwise_mul": "multiply",
           "elementwise_div": "divide", "elementwise_pow": "elementwise_pow", "reduce_mean": "mean",
           "reduce_sum": "sum", "matmul_v2": "matmul", "linear_v2": "linear", "mul": "matmul",
           "hard_swish": "hardswish", "hard_sigmoid": "hardsigmoid", "nearest_interp_v2": "nearest_interp",
           "bilinear_interp_v2": "bilinear_interp", "bicubic_interp_v2": "bicubic_interp",
           "linear_interp_v2": "linear_interp", "softmax_with_cross_entropy": "cross_entropy_with_softmax",
           "flatten_contiguous_range": "flatten"}
NORMS = {"batch_norm", "layer_norm", "group_norm", "instance_norm"}
WRAPPED_OPS = (
    "conv2d", "depthwise_conv2d", "conv2d_transpose", "depthwise_conv2d_transpose", "matmul", "linear",
    "batch_norm", "layer_norm", "group_norm", "relu", "relu6", "hardswish", "hardsigmoid", "sigmoid",
    "swish", "silu", "leaky_relu", "gelu", "tanh", "exp", "log", "reciprocal", "sqrt", "rsqrt", "pow",
    "square", "abs", "add", "subtract", "multiply", "divide", "scale", "maximum", "minimum", "clip",
    "concat", "pool2d", "max_pool2d_with_index", "nearest_interp", "bilinear_interp", "mean", "sum",
    "softmax", "cross_entropy_with_softmax", "flatten", "sigmoid_cross_entropy_with_logits")
_DUNDERS = {"__add__": "add", "__radd__": "add", "__sub__": "subtract", "__rsub__": "subtract",
            "__mul__": "multiply", "__rmul__": "multiply", "__truediv__": "divide",
            "__rtruediv__": "divide", "__neg__": "scale", "__pow__": "pow"}
# Ops whose backward is computed from their own output. On a GPU that output is the fp16 one
# (exp(12) = inf), so the backward sees inf too (inf * 0 = NaN): these run through _LowUnary,
# whose backward uses the rounded output, instead of a cast after an fp32 op.
_OUTPUT_GRAD = {
    "exp": lambda y: y,
    "sigmoid": lambda y: y * (1.0 - y),
    "tanh": lambda y: 1.0 - y * y,
    "reciprocal": lambda y: -(y * y),
}
# Ops whose outputs are values of their inputs (selection, copies, clipping to representable
# bounds): with low-precision inputs the output is already representable, so it is only tagged.
# This skips two casts forward and two backward per such op; the gradient is rounded at the
# producer's output instead, which gives the same numbers.
_VALUE_PRESERVING = {"relu", "relu6", "concat", "flatten", "nearest_interp"}
_TAG = "_zoo_lowp"
_FLOAT = (paddle.float32, paddle.float64)
_state = threading.local()


def canonical(op: str) -> str:
    """The _C_ops name of an op named as in Paddle's AMP lists (``reduce_mean`` -> ``mean``)."""
    return ALIASES.get(op, op)


def round_to(x: paddle.Tensor, dtype: str) -> paddle.Tensor:
    """``x`` rounded to ``dtype`` and back to fp32 (differentiable; tagged as low precision)."""
    out = x.astype(dtype).astype(x.dtype)
    setattr(out, _TAG, True)
    return out


class _LowUnary(PyLayer):
    """y = round(f(round(x))) whose gradient is round(round(g) * f'(from the rounded y))."""

    @staticmethod
    def forward(ctx, x, fn, op, dtype):
        y = fn(x.astype(dtype).astype(x.dtype)).astype(dtype).astype(x.dtype)
        ctx.save_for_backward(y)
        ctx.op, ctx.dtype = op, dtype
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensor()
        g = grad.astype(ctx.dtype).astype(grad.dtype)
        return (g * _OUTPUT_GRAD[ctx.op](y)).astype(ctx.dtype).astype(grad.dtype)


def is_low(x) -> bool:
    return bool(getattr(x, _TAG, False))


def _float_tensors(args) -> list:
    found = []
    for a in args:
        if isinstance(a, paddle.Tensor) and a.dtype in _FLOAT:
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(t for t in a if isinstance(t, paddle.Tensor) and t.dtype in _FLOAT)
    return found


def _map_args(args, fn, only_first: bool):
    out = []
    for i, a in enumerate(args):
        if only_first and i > 0:
            out.append(a)
        elif isinstance(a, paddle.Tensor) and a.dtype in _FLOAT:
            out.append(fn(a))
        elif isinstance(a, list) and not only_first:
            out.append([fn(t) if isinstance(t, paddle.Tensor) and t.dtype in _FLOAT else t for t in a])
        else:
            out.append(a)
    return out


class Emulation:
    """Settings of one emulated precision; ``with emulation:`` makes the wrapped ops follow them."""

    def __init__(self, level: str, dtype: str, custom_white_list=(), custom_black_list=()):
        lists_w, lists_b = paddle.amp.white_list()[dtype], paddle.amp.black_list()[dtype]
        self.level, self.dtype = level, dtype
        self.black = {canonical(o) for o in lists_b.get(level, set())} | {canonical(o) for o in custom_black_list}
        white = {canonical(o) for o in lists_w.get(level, set())} | {canonical(o) for o in custom_white_list}
        self.white = white - {canonical(o) for o in custom_black_list}

    def mode(self, op: str) -> str:
        """``white``, ``black`` or ``gray`` (follows inputs) for ``op`` at this level."""
        if op in self.black:
            return "black"
        if op in self.white or self.level == "O2":
            return "white"
        return "gray"

    def run(self, op: str, fn, args, kwargs):
        """Call ``fn`` with the rounding Paddle's AMP would apply around ``op``."""
        mode = self.mode(op)
        inputs = _float_tensors(args)
        if mode == "black" or not inputs:
            return fn(*args, **kwargs)
        norm = op in NORMS
        if mode == "gray" and not all(is_low(t) for t in (inputs[:1] if norm else inputs)):
            return fn(*args, **kwargs)  # promoted to fp32 by an fp32 input
        if op in _OUTPUT_GRAD and len(args) == 1 and not kwargs:
            out = _LowUnary.apply(args[0], fn, op, self.dtype)
            setattr(out, _TAG, True)
            return out
        if mode == "white":
            args = _map_args(args, lambda t: t if is_low(t) else round_to(t, self.dtype), norm)
        out = fn(*args, **kwargs)
        if op in _VALUE_PRESERVING and isinstance(out, paddle.Tensor):
            setattr(out, _TAG, True)
            return out
        if isinstance(out, paddle.Tensor):
            return round_to(out, self.dtype) if out.dtype in _FLOAT else out
        if isinstance(out, (tuple, list)) and out:  # norms: only the data output is low precision
            first = round_to(out[0], self.dtype) if out[0].dtype in _FLOAT else out[0]
            rest = list(out[1:]) if norm else [round_to(t, self.dtype) if isinstance(t, paddle.Tensor)
                                                and t.dtype in _FLOAT else t for t in out[1:]]
            return type(out)([first, *rest]) if isinstance(out, list) else (first, *rest)
        return out

    @contextlib.contextmanager
    def __call__(self):
        """Context in which the wrapped ops emulate this precision (re-entrant, thread-local)."""
        _install()
        prev = getattr(_state, "active", None)
        _state.active = self
        try:
            yield self
        finally:
            _state.active = prev


@contextlib.contextmanager
def suspended():
    """fp32 region inside an emulated one (what ``paddle.amp.auto_cast(enable=False)`` means)."""
    prev = getattr(_state, "active", None)
    _state.active = None
    try:
        yield
    finally:
        _state.active = prev


def _wrap(op: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        emu = getattr(_state, "active", None)
        if emu is None:
            return fn(*args, **kwargs)
        return emu.run(op, fn, args, kwargs)
    wrapper._zoo_original = fn
    return wrapper


def _auto_cast_wrapper(real):
    """``paddle.amp.auto_cast`` that also suspends emulation inside ``auto_cast(enable=False)``."""
    @contextlib.contextmanager
    def auto_cast(enable=True, *args, **kwargs):
        with real(enable, *args, **kwargs):
            if enable or getattr(_state, "active", None) is None:
                yield
            else:
                with suspended():
                    yield
    auto_cast._zoo_original = real
    return auto_cast


_installed = False


def _install() -> None:
    """Wrap the ops once per process; wrappers cost one attribute lookup when no emulation is active."""
    global _installed
    if _installed:
        return
    for op in WRAPPED_OPS:
        if hasattr(_C_ops, op):
            setattr(_C_ops, op, _wrap(op, getattr(_C_ops, op)))
    for name, op in _DUNDERS.items():
        setattr(paddle.Tensor, name, _wrap(op, getattr(paddle.Tensor, name)))
    paddle.amp.auto_cast = _auto_cast_wrapper(paddle.amp.auto_cast)
    _installed = True
