"""Run a :class:`~zoo.deploy.program.Program` op by op with Paddle's dygraph ops, so that the zoo's
precision emulation and per-op recorder see every op of a deployed model.

Why not Paddle Inference: it runs the program in C++, where the emulation (which replaces
``paddle._C_ops`` functions while active: zoo/amp/emulation.py ``WRAPPED_OPS``) cannot reach. So each
program op becomes one small sublayer of :class:`ProgramNet` that computes it with the
``paddle._C_ops`` function of the same kernel, looked up on the module at call time. A sublayer
carries ``zoo_name`` (the op's first output variable) and ``zoo_kind`` (the op type), which
zoo/diagnostics/probe.py ``LayerNames`` reports, so the recorder's keys read
``conv2d_450.tmp_0:conv2d``.

Old-IR semantics kept: an elementwise op's ``axis`` aligns Y's dimensions with X's from ``axis`` on
(paddle/phi/kernels/funcs/common_shape.h), so Y is reshaped before the call; a conv op with a bias
input is conv then add (two calls), the pattern zoo/export/deployed.py fuses with an activation;
``dropout`` at test time is the identity (``upscale_in_train``) or a scaling by 1 - p
(``downgrade_in_infer``). The table :data:`OPS` is the set of supported op types; a program with
another op is refused when its :class:`ProgramNet` is built.
"""
from __future__ import annotations

import numpy as np
import paddle
from paddle import _C_ops as C  # attributes looked up at call time: the emulation replaces them

from zoo.deploy.program import DeployError, OpDesc, Program

__all__ = ["OPS", "SUPPORTED", "ProgramNet"]

# framework.proto VarType.Type -> paddle dtype name (old-IR dtype attributes; PIR's are names already)
_VAR_DTYPES = {0: "bool", 1: "int16", 2: "int32", 3: "int64", 4: "float16", 5: "float32", 6: "float64",
               20: "uint8", 21: "int8", 22: "bfloat16"}


def _dtype(value, default: str = "float32"):
    if value is None or value == -1:
        value = default
    return getattr(paddle, _VAR_DTYPES.get(value, value) if isinstance(value, int) else value)


def _ints(tensors) -> list[int]:
    return [int(v) for t in tensors for v in np.asarray(t.numpy()).ravel()]


def _first(ins, slot):
    got = ins.get(slot) or []
    return got[0] if got else None


def _place():
    return paddle.framework._current_expected_place()


def _layout(a, key="data_format"):
    value = a.get(key, "NCHW")
    return "NCHW" if value in ("AnyLayout", "") else value


# --------------------------------------------------------------------------- ops
# Each takes (inputs by slot, attrs) and returns {output slot: [tensors]}.

def _conv(ins, a):
    x, w = ins["Input"][0], ins["Filter"][0]
    args = (a.get("strides", [1, 1]), a.get("paddings", [0, 0]), a.get("padding_algorithm", "EXPLICIT"))
    if a["_type"] == "depthwise_conv2d":
        out = C.depthwise_conv2d(x, w, *args, a.get("groups", 1), a.get("dilations", [1, 1]), _layout(a))
    else:
        out = C.conv2d(x, w, *args, a.get("dilations", [1, 1]), a.get("groups", 1), _layout(a))
    return {"Output": [_bias(out, _first(ins, "Bias"))]}


def _bias(out, bias):
    if bias is None:
        return out
    return C.add(out, C.reshape(bias, [1, -1] + [1] * (out.ndim - 2)))


def _conv_transpose(ins, a):
    size = _ints(ins["OutputSize"]) if ins.get("OutputSize") else list(a.get("output_size") or [])
    out = C.conv2d_transpose(ins["Input"][0], ins["Filter"][0], a.get("strides", [1, 1]), a.get("paddings", [0, 0]),
                             list(a.get("output_padding") or []), size, a.get("padding_algorithm", "EXPLICIT"),
                             a.get("groups", 1), a.get("dilations", [1, 1]), _layout(a))
    return {"Output": [_bias(out, _first(ins, "Bias"))]}


def _batch_norm(ins, a):
    out = C.batch_norm(ins["X"][0], ins["Mean"][0], ins["Variance"][0], ins["Scale"][0], ins["Bias"][0], True,
                       a.get("momentum", 0.9), a.get("epsilon", 1e-5), _layout(a, "data_layout"), True, False)[0]
    return {"Y": [C.relu(out) if a.get("fuse_with_relu") else out]}


def _layer_norm(ins, a):
    out = C.layer_norm(ins["X"][0], _first(ins, "Scale"), _first(ins, "Bias"), a.get("epsilon", 1e-5),
                       a.get("begin_norm_axis", 1))
    return {"Y": [out[0] if isinstance(out, (list, tuple)) else out]}


def _elementwise(name):
    def run(ins, a):
        x, y = ins["X"][0], ins["Y"][0]
        axis = a.get("axis", -1)
        if axis is not None and axis != -1 and y.ndim < x.ndim:  # old-IR broadcast: Y aligned at axis
            y = C.reshape(y, list(y.shape) + [1] * (x.ndim - axis - y.ndim))
        return {"Out": [getattr(C, name)(x, y)]}
    return run


def _unary(name, *keys):
    def run(ins, a):
        return {"Out": [getattr(C, name)(ins["X"][0], *(a[k] if isinstance(k, str) else a.get(*k) for k in keys))]}
    return run


def _hard_swish(ins, a):
    if (a.get("threshold", 6.0), a.get("scale", 6.0), a.get("offset", 3.0)) != (6.0, 6.0, 3.0):
        raise DeployError(f"hard_swish with threshold/scale/offset {a.get('threshold')}/{a.get('scale')}/"
                          f"{a.get('offset')}: only 6/6/3 (paddle's hardswish) is supported")
    return {"Out": [C.hardswish(ins["X"][0])]}


def _scale(ins, a):
    scale = float(ins["ScaleTensor"][0].numpy().ravel()[0]) if ins.get("ScaleTensor") else a.get("scale", 1.0)
    return {"Out": [C.scale(ins["X"][0], scale, a.get("bias", 0.0), a.get("bias_after_scale", True))]}


def _reshape(ins, a):
    if ins.get("Shape"):
        shape = _ints(ins["Shape"])
    elif ins.get("ShapeTensor"):
        shape = _ints(ins["ShapeTensor"])
    else:
        shape = list(a["shape"])
    return {"Out": [C.reshape(ins["X"][0], shape)]}


def _slice(ins, a):
    def bound(key):
        for slot in (key.capitalize() + "Tensor", key.capitalize() + "TensorList"):
            if ins.get(slot):
                return _ints(ins[slot])
        return list(a[key])
    starts, ends = bound("starts"), bound("ends")
    flags = [1] * len(a["axes"])
    return {"Out": [C.slice(ins["Input"][0], list(a["axes"]), starts, ends, flags, list(a.get("decrease_axis") or []))]}


def _axes(ins, a, key="axes"):
    return _ints(ins["AxesTensor"]) if ins.get("AxesTensor") else list(a.get(key) or [])


def _axis(ins, a, default=0):
    return _ints(ins["AxisTensor"])[0] if ins.get("AxisTensor") else int(a.get("axis", default))


def _pool2d(ins, a):
    ksize = _ints(ins["KernelSize"]) if ins.get("KernelSize") else list(a["ksize"])
    return {"Out": [C.pool2d(ins["X"][0], ksize, a.get("strides", [1, 1]), a.get("paddings", [0, 0]),
                             a.get("ceil_mode", False), a.get("exclusive", True), _layout(a),
                             a.get("pooling_type", "max"), a.get("global_pooling", False), a.get("adaptive", False),
                             a.get("padding_algorithm", "EXPLICIT"))]}


def _interp(name):
    def run(ins, a):
        out = getattr(C, name)(ins["X"][0], _first(ins, "OutSize"), ins.get("SizeTensor") or None,
                               _first(ins, "Scale"), _layout(a, "data_layout"), a.get("out_d", -1),
                               a.get("out_h", -1), a.get("out_w", -1), list(a.get("scale") or []),
                               a.get("interp_method", name.split("_")[0]), a.get("align_corners", False),
                               a.get("align_mode", 1))
        return {"Out": [out]}
    return run


def _reduce(name):
    def run(ins, a):
        dims = [] if a.get("reduce_all") else _axes(ins, a, "dim")
        keep = a.get("keep_dim", False)
        if name == "sum":
            out_dtype = a.get("out_dtype")
            out = C.sum(ins["X"][0], dims, None if out_dtype in (None, -1) else _dtype(out_dtype), keep)
        else:
            out = C.mean(ins["X"][0], dims, keep)
        return {"Out": [out]}
    return run


def _fill_constant(ins, a):
    shape = _ints(ins.get("ShapeTensor") or ins["ShapeTensorList"]) if (ins.get("ShapeTensor") or ins.get("ShapeTensorList")) \
        else list(a.get("shape") or [])
    value = a.get("value", 0.0)
    if a.get("str_value") not in (None, ""):
        value = float(a["str_value"])
    if ins.get("ValueTensor"):
        value = float(ins["ValueTensor"][0].numpy().ravel()[0])
    return {"Out": [C.full(shape, value, _dtype(a.get("dtype")), _place())]}


def _assign_value(ins, a):
    dtype = _dtype(a.get("dtype"), "int64")
    values = a.get("value")
    if values is None:
        values = next((a[k] for k in ("fp32_values", "int32_values", "int64_values", "bool_values", "values",
                                      "fp64_values") if a.get(k)), [])
    shape = list(a.get("shape") or [len(values)])
    return {"Out": [paddle.to_tensor(np.asarray(values).reshape(shape), dtype=dtype)]}


def _dropout(ins, a):
    x = ins["X"][0]
    if a.get("dropout_implementation", "downgrade_in_infer") == "upscale_in_train":
        return {"Out": [x]}
    return {"Out": [C.scale(x, 1.0 - float(a.get("dropout_prob", 0.5)), 0.0, True)]}


def _split(ins, a):
    x, axis = ins["X"][0], _axis(ins, a)
    if a.get("num", 0):
        return {"Out": list(C.split_with_num(x, a["num"], axis))}
    return {"Out": list(C.split(x, list(a["sections"]), axis))}


def _nms(ins, a):
    out, index, count = C.multiclass_nms3(
        ins["BBoxes"][0], ins["Scores"][0], _first(ins, "RoisNum"), a["score_threshold"], a["nms_top_k"],
        a["keep_top_k"], a.get("nms_threshold", 0.3), a.get("normalized", True), a.get("nms_eta", 1.0),
        a.get("background_label", 0))
    return {"Out": [out], "Index": [index], "NmsRoisNum": [count]}


def _clip(ins, a):
    lo = float(ins["Min"][0].numpy().ravel()[0]) if ins.get("Min") else a.get("min")
    hi = float(ins["Max"][0].numpy().ravel()[0]) if ins.get("Max") else a.get("max")
    return {"Out": [C.clip(ins["X"][0], lo, hi)]}


OPS = {
    "conv2d": _conv, "depthwise_conv2d": _conv, "conv2d_transpose": _conv_transpose,
    "batch_norm": _batch_norm, "layer_norm": _layer_norm,
    "elementwise_add": _elementwise("add"), "elementwise_sub": _elementwise("subtract"),
    "elementwise_mul": _elementwise("multiply"), "elementwise_div": _elementwise("divide"),
    "elementwise_max": _elementwise("maximum"), "elementwise_min": _elementwise("minimum"),
    "elementwise_pow": _elementwise("elementwise_pow"),
    "relu": _unary("relu"), "sigmoid": _unary("sigmoid"), "swish": _unary("swish"), "silu": _unary("silu"),
    "tanh": _unary("tanh"), "exp": _unary("exp"), "sqrt": _unary("sqrt"), "reciprocal": _unary("reciprocal"),
    "abs": _unary("abs"), "relu6": _unary("relu6"), "gelu": _unary("gelu", ("approximate", False)),
    "leaky_relu": _unary("leaky_relu", ("alpha", 0.02)), "hard_swish": _hard_swish,
    "hard_sigmoid": _unary("hardsigmoid", ("slope", 0.2), ("offset", 0.5)),
    "softmax": _unary("softmax", ("axis", -1)), "scale": _scale,
    "matmul_v2": lambda ins, a: {"Out": [C.matmul(ins["X"][0], ins["Y"][0], a.get("trans_x", False),
                                                  a.get("trans_y", False))]},
    # The fluid-era v1 ops (matmul, mul, reshape, transpose) are left out: no program on this machine
    # uses them, so their translation could not be checked against Paddle Inference.
    "reshape2": _reshape,
    "transpose2": lambda ins, a: {"Out": [C.transpose(ins["X"][0], list(a["axis"]))]},
    "flatten_contiguous_range": lambda ins, a: {"Out": [C.flatten(ins["X"][0], a.get("start_axis", 1),
                                                                  a.get("stop_axis", -1))]},
    "squeeze2": lambda ins, a: {"Out": [C.squeeze(ins["X"][0], _axes(ins, a))]},
    "unsqueeze2": lambda ins, a: {"Out": [C.unsqueeze(ins["X"][0], _axes(ins, a))]},
    "slice": _slice,
    "shape": lambda ins, a: {"Out": [(getattr(C, "shape64", None) or C.shape)(ins["Input"][0])]},
    "concat": lambda ins, a: {"Out": [C.concat(list(ins["X"]), _axis(ins, a))]},
    "pool2d": _pool2d,
    "nearest_interp_v2": _interp("nearest_interp"), "bilinear_interp_v2": _interp("bilinear_interp"),
    "reduce_mean": _reduce("mean"), "reduce_sum": _reduce("sum"),
    "range": lambda ins, a: {"Out": [C.arange(ins["Start"][0], ins["End"][0], ins["Step"][0],
                                              _dtype(a.get("dtype")), _place())]},
    "meshgrid": lambda ins, a: {"Out": list(C.meshgrid(list(ins["X"])))},
    "stack": lambda ins, a: {"Y": [C.stack(list(ins["X"]), a.get("axis", 0))]},
    "split": _split,
    "fill_any_like": lambda ins, a: {"Out": [C.full_like(ins["X"][0], a.get("value", 0.0),
                                                         _dtype(a.get("dtype"), "float32"), _place())]},
    "fill_constant": _fill_constant, "assign_value": _assign_value,
    "assign": lambda ins, a: {"Out": [C.assign(ins["X"][0])]},
    "cast": lambda ins, a: {"Out": [C.cast(ins["X"][0], _dtype(a.get("out_dtype")))]},
    "clip": _clip, "dropout": _dropout, "multiclass_nms3": _nms,
}
SUPPORTED = frozenset(OPS)


class _OpLayer(paddle.nn.Layer):
    """One program op; named for LayerNames by the variable it writes and its op type."""

    def __init__(self, op: OpDesc):
        super().__init__()
        self.op = op
        self.zoo_name = next((n for names in op.outputs.values() for n in names), op.type)
        self.zoo_kind = op.type
        self._attrs = {**op.attrs, "_type": op.type}
        self._fn = OPS[op.type]

    def forward(self, inputs: dict):
        return self._fn(inputs, self._attrs)


class ProgramNet(paddle.nn.Layer):
    """A :class:`Program` as a dygraph layer: ``forward(*feeds)`` (in ``program.feeds`` order) returns
    the fetch variables in order. Floating parameters become fp32 buffers."""

    def __init__(self, program: Program):
        super().__init__()
        for op in program.ops:
            if op.type not in OPS:
                writes = next((n for names in op.outputs.values() for n in names), "?")
                raise DeployError(f"op {op.type!r} (writes program variable {writes!r}) is not supported by the "
                                  f"deploy check's interpreter (zoo/deploy/interpreter.py); supported: "
                                  f"{', '.join(sorted(OPS))}")
        self.program = program
        self._param_slots: dict[str, str] = {}
        for i, (name, value) in enumerate(program.params.items()):
            value = np.asarray(value)
            if np.issubdtype(value.dtype, np.floating):
                value = value.astype(np.float32)
            self.register_buffer(f"p{i}", paddle.to_tensor(value), persistable=True)
            self._param_slots[name] = f"p{i}"
        self.ops = paddle.nn.LayerList([_OpLayer(op) for op in program.ops])
        self.eval()

    def forward(self, *feeds):
        if len(feeds) != len(self.program.feeds):
            raise DeployError(f"{self.program.path}: expects {len(self.program.feeds)} inputs "
                              f"({', '.join(self.program.feeds)}), got {len(feeds)}")
        env = {name: self._buffers[slot] for name, slot in self._param_slots.items()}
        env.update(zip(self.program.feeds, (f if isinstance(f, paddle.Tensor) else paddle.to_tensor(f)
                                            for f in feeds)))
        for layer in self.ops:
            op = layer.op
            try:
                inputs = {slot: [env[n] for n in names] for slot, names in op.inputs.items() if names}
            except KeyError as err:
                raise DeployError(f"op {op.type!r} (writes {layer.zoo_name!r}) reads variable {err.args[0]!r}, "
                                  f"which no earlier op writes") from None
            for slot, values in layer(inputs).items():
                env.update(zip(op.outputs.get(slot, []), values))
        return [env[n] for n in self.program.fetches]
