"""Emulated fp16/bf16 numerics on a CPU: the numbers of Paddle's AMP, not its speed.

Paddle's CPU build has no fp16/bf16 conv or matmul kernels, but it casts to and from both formats.
Inside :class:`Emulation` every wrapped op picks its precision by Paddle 3.3's own rule
(``paddle/fluid/imperative/amp_utils.h``, GetAmpDestDtype with ``use_promote=True``, which
auto_cast sets at O1 and at O2):

- white-list ops (conv2d, matmul, linear, ...) compute in low precision;
- black-list ops compute in fp32 (O1: Paddle's 53-op list; O2: only its 8-op ``EXTRA_BLACK_LIST``;
  both plus the recipe's ``custom_black_list``);
- every other op follows its inputs: low precision only when all its float tensor inputs are low
  precision, fp32 as soon as one is fp32 (for batch_norm and layer_norm only ``x`` is judged).

At O2 what makes most ops low precision is that ``paddle.amp.decorate`` casts the parameters:
:func:`mark_o2_parameters` tags the parameters decorate would cast (all but BatchNorm, and for fp16
LayerNorm/InstanceNorm: Paddle's own ``need_keep_fp32``), and a tagged parameter enters every op
rounded to the format, as its fp16 copy would on a GPU. The fp32 value stays the master weight.

Rounding is a cast round trip ``x.astype(fp16).astype(fp32)``: values beyond the format's range
become inf and tiny values flush to zero, exactly as in the format; its backward casts the incoming
gradient the same way, so gradients flowing back through a low-precision op are rounded (and
overflow) too. ``depthwise_conv2d`` in low precision also *accumulates* in it, as Paddle's CUDA
kernel does (zoo/amp/depthwise.py); cuDNN/cuBLAS ops accumulate in fp32, so rounding their output
is exact. Parameter gradients stored in low precision (O2 without ``master_grad``) are handled by
:func:`round_parameter_grads`, called by the Amp component around the loss-scaler's unscale.

What is wrapped: the ``paddle._C_ops`` functions in ``WRAPPED_OPS`` (what paddle.nn layers,
functionals and Tensor methods call) and the Tensor arithmetic operators. An op outside that set
computes in fp32 and its output counts as fp32; ``tools/amp_conformance.py`` compares the
decisions made here with Paddle's compiled rule call by call.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import paddle
from paddle import _C_ops
from paddle.autograd import PyLayer

from zoo.amp.depthwise import depthwise_low_accum

# Paddle's AMP lists use legacy op names; the wrapped functions use _C_ops names.
ALIASES = {"elementwise_add": "add", "elementwise_sub": "subtract", "elementwise_mul": "multiply",
           "elementwise_div": "divide", "elementwise_pow": "elementwise_pow", "reduce_mean": "mean",
           "reduce_sum": "sum", "matmul_v2": "matmul", "linear_v2": "linear", "mul": "matmul",
           "hard_swish": "hardswish", "hard_sigmoid": "hardsigmoid", "nearest_interp_v2": "nearest_interp",
           "bilinear_interp_v2": "bilinear_interp", "bicubic_interp_v2": "bicubic_interp",
           "linear_interp_v2": "linear_interp", "softmax_with_cross_entropy": "cross_entropy_with_softmax",
           "flatten_contiguous_range": "flatten", "lookup_table_v2": "embedding",
           "trilinear_interp_v2": "trilinear_interp"}
# Norms whose precision is judged on x alone, and whose other inputs are never cast (GetPromoteType).
X_ONLY_NORMS = {"batch_norm", "layer_norm", "sync_batch_norm"}
# Ops whose outputs are values of their inputs (selection, reshaping, copies): with low-precision
# inputs the output is already representable, so it is only tagged (no cast forward or backward).
VALUE_PRESERVING = {
    "relu", "relu6", "concat", "flatten", "nearest_interp", "reshape", "transpose", "squeeze",
    "unsqueeze", "slice", "strided_slice", "split", "split_with_num", "gather", "gather_nd",
    "index_select", "expand", "expand_as", "tile", "stack", "unbind", "roll", "flip", "maximum",
    "minimum", "take_along_axis", "index_sample", "max_pool2d_with_index", "assign", "where"}
WRAPPED_OPS = tuple(sorted(VALUE_PRESERVING | {
    "conv2d", "depthwise_conv2d", "conv2d_transpose", "depthwise_conv2d_transpose", "matmul", "linear",
    "batch_norm", "sync_batch_norm", "layer_norm", "group_norm", "instance_norm", "relu", "hardswish",
    "hardsigmoid", "sigmoid", "swish", "silu", "leaky_relu", "gelu", "tanh", "exp", "log",
    "reciprocal", "sqrt", "rsqrt", "pow", "square", "abs", "add", "subtract", "multiply", "divide",
    "scale", "clip", "pool2d", "bilinear_interp", "mean", "sum", "softmax", "log_softmax",
    "cross_entropy_with_softmax", "sigmoid_cross_entropy_with_logits", "softplus", "pad",
    "elementwise_pow", "mish", "elu"}))
# The _C_ops function an op of WRAPPED_OPS is called through, where the name differs:
# paddle.nn.SyncBatchNorm (trainer.sync_bn) calls the in-place ``sync_batch_norm_``; the AMP rule
# knows the op as ``sync_batch_norm`` (on neither list: gray, judged on x alone, as batch_norm).
C_OPS_FUNCTION = {"sync_batch_norm": "sync_batch_norm_"}
_DUNDERS = {"__add__": "add", "__radd__": "add", "__sub__": "subtract", "__rsub__": "subtract",
            "__mul__": "multiply", "__rmul__": "multiply", "__truediv__": "divide",
            "__rtruediv__": "divide", "__neg__": "scale", "__pow__": "elementwise_pow",
            "__matmul__": "matmul", "__getitem__": "slice"}
# Ops whose backward is computed from their own output. On a GPU that output is the fp16 one
# (exp(12) = inf), so the backward sees inf too (inf * 0 = NaN): these run through _LowUnary,
# whose backward uses the rounded output, instead of a cast after an fp32 op.
_OUTPUT_GRAD = {
    "exp": lambda y: y,
    "sigmoid": lambda y: y * (1.0 - y),
    "tanh": lambda y: 1.0 - y * y,
    "reciprocal": lambda y: -(y * y),
}
_TAG = "_zoo_lowp"
O2_PARAM = "_zoo_o2_low"
_FLOAT = (paddle.float32, paddle.float64)
_state = threading.local()


@functools.lru_cache(maxsize=1)
def amp_op_names() -> frozenset[str]:
    """The op names of Paddle's AMP lists (white and black, every dtype and level, and the static
    gray list of ops that follow their inputs) and the ops this emulation wraps, under both names."""
    from paddle.static.amp import fp16_lists

    names = set(WRAPPED_OPS) | set(ALIASES) | set(ALIASES.values()) | set(fp16_lists.gray_list)
    for lists in (paddle.amp.white_list(), paddle.amp.black_list()):
        for by_level in lists.values():
            for ops in by_level.values():
                names |= set(ops)
    return frozenset(names)


@functools.lru_cache(maxsize=1)
def known_op_names() -> frozenset[str]:
    """Every name a custom white / black list may hold: :func:`amp_op_names` plus the ops Paddle has
    registered (its op protos and ``_C_ops`` functions). ``auto_cast`` takes any op name and ignores
    one it never meets, so a misspelt entry changes nothing, silently; names outside this set are
    refused instead (:func:`unknown_op`)."""
    from paddle.base import core

    registered = set(getattr(core, "get_all_op_names", lambda: [])())
    registered |= {n for n in dir(_C_ops) if not n.startswith("_")}
    return amp_op_names() | frozenset(registered)


def unknown_op(name: str) -> str | None:
    """None for a known op name, else ``unknown op 'x'; did you mean 'y'?`` (the closest known name)."""
    import difflib

    if name in known_op_names():
        return None
    close = difflib.get_close_matches(name, sorted(amp_op_names()), 1) or difflib.get_close_matches(
        name, sorted(n for n in known_op_names() if not n.endswith(("_", "_grad"))), 1)
    hint = (f"did you mean {close[0]!r}?" if close else
            "not an op of paddle.amp.white_list() / black_list() nor a registered Paddle op")
    return f"unknown op {name!r}; {hint}"


def canonical(op: str) -> str:
    """The _C_ops name of an op named as in Paddle's AMP lists (``reduce_mean`` -> ``mean``)."""
    return ALIASES.get(op, op)


# At or below this magnitude IEEE fp16 rounds to zero (2**-25 itself ties to even, 0). Paddle 3.3.1's CPU
# float32 -> float16 cast gets part of that range wrong: values of about 2e-27 to 5e-24 (binary
# exponents -89 to -78) come back 2**64 times larger (1e-25 -> 1.85e-6, 5e-24 -> 9.2e-5) where a
# GPU and NumPy give 0. So every emulated fp16 rounding flushes them first; bf16's cast is right.
FP16_FLUSH = 2.0 ** -25


def _flush_tiny(x: paddle.Tensor) -> paddle.Tensor:
    """``x`` with magnitudes below :data:`FP16_FLUSH` set to 0 (NaN and inf kept): hardshrink is one
    kernel (``abs``/``where`` would be three); 2**-25 itself is kept, and Paddle's cast rounds it right."""
    return _C_ops.hardshrink(x, FP16_FLUSH)


class _Round16(PyLayer):
    """fp16 rounding (and of the gradient), as ``x.astype(float16).astype(float32)`` differentiates
    but with :func:`_flush_tiny` before each cast."""

    @staticmethod
    def forward(ctx, x):
        return _flush_tiny(x).astype("float16").astype(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return _flush_tiny(grad).astype("float16").astype(grad.dtype)


def round_to(x: paddle.Tensor, dtype: str) -> paddle.Tensor:
    """``x`` rounded to ``dtype`` and back to fp32 (differentiable: the gradient is rounded the same
    way; tagged as low precision)."""
    if dtype == "float16":
        out = _Round16.apply(x) if not x.stop_gradient else _cast2(x, dtype)
    else:
        out = x.astype(dtype).astype(x.dtype)
    setattr(out, _TAG, True)
    return out


def _tag(t):
    if isinstance(t, paddle.Tensor):
        setattr(t, _TAG, True)
    return t


def _cast2(x, dtype, on=True):
    """``x`` rounded to ``dtype`` and back, not differentiated (inside a PyLayer or under no_grad)."""
    if not on:
        return x
    if dtype == "float16":
        x = _flush_tiny(x)
    return x.astype(dtype).astype(x.dtype)


class _LowUnary(PyLayer):
    """y = round(f(round(x))) whose gradient is round(round(g) * f'(from the rounded y))."""

    @staticmethod
    def forward(ctx, x, fn, op, dtype, fwd=True, bwd=True):
        y = _cast2(fn(_cast2(x, dtype, fwd)), dtype, fwd)
        ctx.save_for_backward(y)
        ctx.op, ctx.dtype, ctx.bwd = op, dtype, bwd
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensor()
        g = _cast2(grad, ctx.dtype, ctx.bwd)
        return _cast2(g * _OUTPUT_GRAD[ctx.op](y), ctx.dtype, ctx.bwd)


class _RoundForward(PyLayer):
    """Ablation: the value rounded, its gradient passed through unrounded."""

    @staticmethod
    def forward(ctx, x, dtype):
        return _cast2(x, dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _RoundBackward(PyLayer):
    """Ablation: the value kept, its gradient rounded."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return _cast2(grad, ctx.dtype)


def is_low(x) -> bool:
    return bool(getattr(x, _TAG, False))


def _is_float(t) -> bool:
    return isinstance(t, paddle.Tensor) and t.dtype in _FLOAT


def _float_tensors(args) -> list:
    found = []
    for a in args:
        if _is_float(a):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(t for t in a if _is_float(t))
    return found


def _map_args(args, fn, only_first: bool):
    out = []
    for i, a in enumerate(args):
        if only_first and i > 0:
            out.append(a)
        elif _is_float(a):
            out.append(fn(a))
        elif isinstance(a, (list, tuple)) and not only_first:
            out.append(type(a)(fn(t) if _is_float(t) else t for t in a))
        else:
            out.append(a)
    return out


def _map_kwargs(kwargs: dict, fn, only_x: bool) -> dict:
    """``_map_args`` for tensors passed by keyword (``paddle.multiply(x=a, y=b)``, as PaddleOCR's
    LCNetV3 calls it): the same rule must reach them, or the op escapes it. With ``only_x`` (the
    norms) only ``x`` is mapped."""
    out = {}
    for key, value in kwargs.items():
        if only_x and key != "x":
            out[key] = value
        elif _is_float(value):
            out[key] = fn(value)
        elif isinstance(value, (list, tuple)) and not only_x:
            out[key] = type(value)(fn(t) if _is_float(t) else t for t in value)
        else:
            out[key] = value
    return out


def mark_o2_parameters(model, dtype: str, exclude=()) -> int:
    """Tag the parameters ``paddle.amp.decorate(level='O2')`` would cast; returns how many.
    ``exclude``: layers decorate was told to leave alone (its ``excluded_layers``), with their sublayers."""
    from paddle.amp.auto_cast import need_keep_fp32

    skipped = {id(s) for layer in exclude for s in layer.sublayers(include_self=True)}
    count = 0
    for layer in model.sublayers(include_self=True):
        if need_keep_fp32(layer, dtype) or id(layer) in skipped:
            continue
        for p in layer.parameters(include_sublayers=False):
            if p.dtype in _FLOAT:
                setattr(p, O2_PARAM, True)
                count += 1
    return count


def low_precision_parameters(params) -> list:
    """The parameters tagged by :func:`mark_o2_parameters` (a GPU keeps their gradients low)."""
    return [p for p in params if getattr(p, O2_PARAM, False)]


@paddle.no_grad()
def round_parameter_grads(params, dtype: str) -> bool:
    """Round the gradients of ``params`` to ``dtype`` in place; True if one became non-finite."""
    bad = False
    for p in params:
        g = p.grad
        if g is None:
            continue
        r = _cast2(g, dtype)
        bad = bad or not bool(paddle.isfinite(r).all())
        g.set_value(r)
    return bad


class Emulation:
    """Settings of one emulated precision; ``with emulation:`` makes the wrapped ops follow them.

    ``depthwise_accumulation`` (default True) accumulates low-precision depthwise convolutions in
    the format, as Paddle's CUDA kernel does. ``forward`` / ``backward`` (default True) are for
    ablations only: with one of them off, values (forward) or gradients (backward) are not rounded,
    while the op rule, the tags and loss scaling stay; the depthwise accumulation then needs both.
    """

    def __init__(self, level: str, dtype: str, custom_white_list=(), custom_black_list=(),
                 depthwise_accumulation: bool = True, forward: bool = True, backward: bool = True):
        lists_w, lists_b = paddle.amp.white_list()[dtype], paddle.amp.black_list()[dtype]
        self.level, self.dtype = level, dtype
        self.black = {canonical(o) for o in lists_b.get(level, set())} | {canonical(o) for o in custom_black_list}
        white = {canonical(o) for o in lists_w.get(level, set())} | {canonical(o) for o in custom_white_list}
        self.white = white - {canonical(o) for o in custom_black_list}
        self.black -= {canonical(o) for o in custom_white_list}  # as paddle.amp's _update_list
        self.forward, self.backward = bool(forward), bool(backward)
        self.depthwise_accumulation = depthwise_accumulation and self.forward and self.backward

    @property
    def faithful(self) -> bool:
        """False for the ablation settings (some rounding switched off)."""
        return self.forward and self.backward

    def _round(self, t):
        if self.faithful:
            return round_to(t, self.dtype)
        if self.forward:
            out = _RoundForward.apply(t, self.dtype)
        elif self.backward:
            out = _RoundBackward.apply(t, self.dtype)
        else:
            out = _ORIGINAL_ASSIGN(t)
        return _tag(out)

    def mode(self, op: str) -> str:
        """``white``, ``black`` or ``gray`` (follows its inputs) for ``op``, at O1 and O2 alike."""
        if op in self.black:
            return "black"
        if op in self.white:
            return "white"
        return "gray"

    def _low(self, t):
        return t if is_low(t) else self._round(t)

    def run(self, op: str, fn, args, kwargs):
        """Call ``fn`` with the precision Paddle's AMP rule picks for ``op``."""
        if self.level == "O2":  # decorated parameters enter every op as their low-precision copy
            o2 = lambda t: self._low(t) if getattr(t, O2_PARAM, False) else t  # noqa: E731
            args, kwargs = _map_args(args, o2, False), _map_kwargs(kwargs, o2, False)
        x_only = op in X_ONLY_NORMS
        if x_only:  # norms: judged on x alone, given by position or as x=
            inputs = _float_tensors(args[:1] if args else [kwargs.get("x")])
        else:
            inputs = _float_tensors([*args, *kwargs.values()])
        mode = self.mode(op)
        if op == "linear" and len(args) == 3 and args[2] is not None:
            mode = self.mode("matmul")
            inputs = inputs[:2]
        low = bool(inputs) and mode != "black" and (mode == "white" or all(is_low(t) for t in inputs))
        return self._compute(op, fn, args, kwargs, x_only) if low else fn(*args, **kwargs)

    def _compute(self, op, fn, args, kwargs, x_only):
        if op == "linear" and len(args) == 3 and args[2] is not None and not kwargs:
            # _C_ops.linear is matmul then add, each under the rule (conv2d + bias is the same):
            # at O1 the fp32 bias promotes the add, so the output is fp32.
            out = self._compute("matmul", _ORIGINAL["matmul"], [args[0], args[1], False, False], {}, False)
            return self.run("add", _ORIGINAL["add"], [out, args[2]], {})
        if op in _OUTPUT_GRAD and len(args) == 1 and not kwargs:
            return _tag(_LowUnary.apply(self._low(args[0]), fn, op, self.dtype, self.forward, self.backward))
        args = _map_args(args, self._low, x_only)
        if not (x_only and args):  # a norm's x by position: its other inputs are never cast
            kwargs = _map_kwargs(kwargs, self._low, x_only)
        if op == "depthwise_conv2d" and self.depthwise_accumulation and not kwargs:
            out = depthwise_low_accum(args, self.dtype)
            if out is not None:
                return _tag(out)
        out = fn(*args, **kwargs)
        keep = op in VALUE_PRESERVING
        if isinstance(out, paddle.Tensor):
            return _tag(out) if keep else (self._round(out) if out.dtype in _FLOAT else out)
        if isinstance(out, (tuple, list)) and out:  # norms: only the data output is low precision
            items = [out[0]] if x_only else list(out)
            done = [(_tag(t) if keep else self._round(t)) if _is_float(t) else t for t in items]
            done += list(out[1:]) if x_only else []
            return type(out)(done) if isinstance(out, list) else tuple(done)
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
        _state.active = None  # calls made while computing this op are part of it
        try:
            return emu.run(op, fn, args, kwargs)
        finally:
            _state.active = emu
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


def _keep_tag(real):
    """``Tensor._use_gpudnn`` builds a new tensor object (adaptive pooling calls it): keep the tag."""
    @functools.wraps(real)
    def use_gpudnn(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if is_low(self) and isinstance(out, paddle.Tensor):
            setattr(out, _TAG, True)
        return out
    use_gpudnn._zoo_original = real
    return use_gpudnn


def _untag_on_fp32_cast(real):
    """``Tensor.astype`` returns its input when the dtype matches, and emulated tensors are always
    fp32: a cast to fp32 of a low-precision tensor must still give an fp32 (untagged) tensor."""
    @functools.wraps(real)
    def astype(self, dtype):
        out = real(self, dtype)
        if out is self and is_low(self) and getattr(_state, "active", None) is not None:
            return _ORIGINAL_ASSIGN(self)
        return out
    astype._zoo_original = real
    return astype


_ORIGINAL_ASSIGN = _C_ops.assign
_ORIGINAL = {"matmul": _C_ops.matmul, "add": _C_ops.add}
_installed = False


def install() -> None:
    """Wrap the ops now rather than at the first ``with emulation:``. Code that wraps the ops itself
    (the probes' ``every_op``) calls this first, so its own wrappers sit outside the emulation's."""
    _install()


def _install() -> None:
    """Wrap the ops once per process; wrappers cost one attribute lookup when no emulation is active."""
    global _installed
    if _installed:
        return
    for op in WRAPPED_OPS:
        name = C_OPS_FUNCTION.get(op, op)
        if hasattr(_C_ops, name):
            setattr(_C_ops, name, _wrap(op, getattr(_C_ops, name)))
    for name, op in _DUNDERS.items():
        setattr(paddle.Tensor, name, _wrap(op, getattr(paddle.Tensor, name)))
    if hasattr(paddle.Tensor, "_use_gpudnn"):
        paddle.Tensor._use_gpudnn = _keep_tag(paddle.Tensor._use_gpudnn)
    paddle.Tensor.astype = _untag_on_fp32_cast(paddle.Tensor.astype)
    paddle.amp.auto_cast = _auto_cast_wrapper(paddle.amp.auto_cast)
    _installed = True
