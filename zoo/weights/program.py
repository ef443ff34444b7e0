"""A saved Paddle inference program read into plain Python: its ops in execution order, with old-IR
op types and slot names whichever format it was saved in, and its persistable values as NumPy.

Two formats exist. The old IR (``*.pdmodel``, a ``framework.proto`` ProgramDesc; PaddleOCR's and
PaddleClas's published models) is parsed directly: Paddle 3.3.1's ``load_inference_model`` reads it
only with ``FLAGS_enable_pir_api=0`` set before ``import paddle``. Its combined ``*.pdiparams`` is
read here too: one serialized tensor per persistable variable in sorted name order, the order Paddle
Inference's ``LoadParameters`` hands ``load_combine``
(paddle/fluid/inference/api/analysis_predictor.cc; tensor layout: paddle/phi/core/framework/
dense_tensor_serialize.cc). PIR (``*.json``, what ``paddle.jit.save`` writes in Paddle 3 and what
the zoo exports) is loaded with Paddle's own loader inside a private scope, then each ``pd_op.*``
is mapped onto the old-IR op it replaced (:data:`PIR_OPS`), so the interpreter has one table.
PIR passes some attributes as constant tensors (``full_int_array``, ``full``): those are folded
back into the old-IR attribute; a computed one stays a tensor input in the old-IR tensor slot.
PIR values have no names: a parameter keeps its name, a feed its feed name, anything else is
``<old op type>_<op index>.out<k>``.

It sits in the weights layer because loading a deploy-form inference model into a zoo model
(zoo/weights/deploy_form.py) reads the same files; the deploy check (zoo/deploy) builds on it
(BatchNorm folding and the interpreter live there).
"""
from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np


__all__ = ["CONVS", "OpDesc", "PIR_OPS", "Program", "ProgramError", "load_program", "read_combined_params"]


class ProgramError(ValueError):
    """Bad input: a model folder or file that is missing, truncated or not a Paddle program. The
    message names the path and what was expected; a ValueError, so the tools print it as one
    ``error:`` line with exit status 2 (tools/_entry.py). The deploy check raises it as
    ``zoo.deploy.errors.DeployError`` (the same class)."""

# The files a model folder may hold, in the order they are preferred (PaddleX / PaddleOCR 3 write
# inference.json, PaddleOCR 2 inference.pdmodel, PaddleDetection's deploy export model.*).
MODEL_FILES = ("inference.json", "inference.pdmodel", "model.json", "model.pdmodel")
CONVS = ("conv2d", "depthwise_conv2d")


@dataclass
class OpDesc:
    type: str
    inputs: dict[str, list[str]]
    outputs: dict[str, list[str]]
    attrs: dict[str, object] = field(default_factory=dict)


@dataclass
class Program:
    ops: list[OpDesc]
    params: dict[str, np.ndarray]
    feeds: list[str]
    fetches: list[str]
    source: str
    path: str


def load_program(model: str | Path) -> Program:
    """Read a model folder (``inference.*`` or ``model.*`` files) or a path prefix
    (``dir/inference``) into a :class:`Program`."""
    model = Path(model)
    if model.is_dir():
        found = next((model / n for n in MODEL_FILES if (model / n).is_file()), None)
        if found is None:
            raise ProgramError(f"{model}: no inference program in the folder (looked for {', '.join(MODEL_FILES)})")
        prefix = found.with_suffix("")
    else:
        prefix = model.with_suffix("") if model.suffix in (".json", ".pdmodel", ".pdiparams") else model
    json_file, pdmodel = prefix.with_name(prefix.name + ".json"), prefix.with_name(prefix.name + ".pdmodel")
    params_file = prefix.with_name(prefix.name + ".pdiparams")
    program_file = json_file if json_file.is_file() else pdmodel
    if not program_file.is_file():
        raise ProgramError(f"{prefix}: neither {json_file.name} nor {pdmodel.name} exists")
    if not params_file.is_file():
        raise ProgramError(f"{program_file}: its parameters file {params_file.name} is missing")
    if program_file.suffix == ".json":
        return _load_pir(prefix, program_file)
    return _load_old_ir(program_file, params_file)


# ---------------------------------------------------------------- old IR (ProgramDesc protobuf)

# framework.proto AttrType -> the OpDesc.Attr field holding the value
_ATTR_FIELDS = {0: "i", 1: "f", 2: "s", 3: "ints", 4: "floats", 5: "strings", 6: "b", 7: "bools",
                8: "block_idx", 9: "l", 10: "blocks_idx", 11: "longs", 12: "float64s", 13: "var_name",
                14: "vars_name", 15: "float64", 16: "scalar", 17: "scalars"}
# framework.proto VarType.Type -> NumPy dtype (bf16 is read as uint16 and widened to float32)
_NP_DTYPES = {0: np.bool_, 1: np.int16, 2: np.int32, 3: np.int64, 4: np.float16, 5: np.float32, 6: np.float64,
              20: np.uint8, 21: np.int8, 22: np.uint16, 23: np.complex64, 24: np.complex128}
_LOD_TENSOR = 7


def _attr_value(attr):
    value = getattr(attr, _ATTR_FIELDS.get(attr.type, "i"))
    if attr.type in (16, 17):  # Scalar: {type, b, i, r, c}
        scalars = [value] if attr.type == 16 else list(value)
        vals = [s.b if s.type == 1 else s.i if s.type == 2 else s.r if s.type == 3 else None for s in scalars]
        return vals[0] if attr.type == 16 else vals
    return list(value) if hasattr(value, "__len__") and not isinstance(value, (str, bytes)) else value


def _load_old_ir(program_file: Path, params_file: Path) -> Program:
    from paddle.base.proto import framework_pb2

    try:
        desc = framework_pb2.ProgramDesc.FromString(program_file.read_bytes())
    except Exception as err:  # protobuf's DecodeError and friends
        raise ProgramError(f"{program_file}: not a Paddle program ({type(err).__name__}: {err})") from None
    if not desc.blocks:
        raise ProgramError(f"{program_file}: the program has no blocks")
    block = desc.blocks[0]
    ops, feeds, fetches = [], {}, {}
    for op in block.ops:
        attrs = {a.name: _attr_value(a) for a in op.attrs}
        inputs = {v.parameter: list(v.arguments) for v in op.inputs}
        outputs = {v.parameter: list(v.arguments) for v in op.outputs}
        if op.type == "feed":
            feeds[int(attrs.get("col", len(feeds)))] = outputs["Out"][0]
        elif op.type == "fetch":
            fetches[int(attrs.get("col", len(fetches)))] = inputs["X"][0]
        else:
            ops.append(OpDesc(op.type, inputs, outputs, attrs))
    names = sorted(v.name for v in block.vars
                   if v.persistable and v.type.type == _LOD_TENSOR and v.name not in ("feed", "fetch"))
    params = read_combined_params(params_file, names)
    return Program(ops, params, [feeds[k] for k in sorted(feeds)], [fetches[k] for k in sorted(fetches)],
                   "pdmodel", str(program_file))


def read_combined_params(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    """The tensors ``save_combine`` wrote to ``path``, one per name in order."""
    from paddle.base.proto import framework_pb2

    data = Path(path).read_bytes()
    pos, out = 0, {}

    def take(n: int, name: str) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ProgramError(f"{path}: truncated or corrupt at tensor {name!r} (needs {pos + n} bytes, "
                              f"the file has {len(data)})")
        chunk = data[pos:pos + n]
        pos += n
        return chunk

    for name in names:
        (version,) = struct.unpack("<I", take(4, name))
        (levels,) = struct.unpack("<Q", take(8, name))
        if version != 0 or levels > 16:
            raise ProgramError(f"{path}: corrupt at tensor {name!r} (version {version}, {levels} LoD levels)")
        for _ in range(levels):
            (size,) = struct.unpack("<Q", take(8, name))
            take(size, name)
        struct.unpack("<I", take(4, name))
        (desc_size,) = struct.unpack("<i", take(4, name))
        try:
            desc = framework_pb2.VarType.TensorDesc.FromString(take(desc_size, name))
        except ProgramError:
            raise
        except Exception:
            raise ProgramError(f"{path}: corrupt tensor description at tensor {name!r}") from None
        dtype = _NP_DTYPES.get(desc.data_type)
        if dtype is None or any(d < 0 for d in desc.dims):
            raise ProgramError(f"{path}: corrupt at tensor {name!r} (dtype {desc.data_type}, shape {list(desc.dims)})")
        numel = int(np.prod(desc.dims, dtype=np.int64))
        value = np.frombuffer(take(numel * np.dtype(dtype).itemsize, name), dtype).reshape(list(desc.dims))
        if desc.data_type == 22:  # bfloat16: the high half of a float32
            value = (value.astype(np.uint32) << 16).view(np.float32)
        out[name] = value.copy()
    if pos != len(data):
        raise ProgramError(f"{path}: {len(data) - pos} bytes left after the program's {len(names)} "
                          f"persistable tensors (a parameters file of another model?)")
    return out


# ---------------------------------------------------------------- PIR (json)

# pd_op name -> (old-IR type, {PIR input: old slot, or (old attr, old tensor slot) for an input
# that is an attribute when constant}, {PIR output: old slot}, {PIR attr: old attr})
_X, _OUT = {"x": "X"}, {"out": "Out"}
_ELEMENTWISE = ({"x": "X", "y": "Y"}, _OUT, {})
PIR_OPS: dict[str, tuple[str, dict, dict, dict]] = {
    "conv2d": ("conv2d", {"input": "Input", "filter": "Filter"}, {"out": "Output"}, {}),
    "depthwise_conv2d": ("depthwise_conv2d", {"input": "Input", "filter": "Filter"}, {"out": "Output"}, {}),
    "conv2d_transpose": ("conv2d_transpose", {"x": "Input", "filter": "Filter",
                                              "output_size": ("output_size", "OutputSize")}, {"out": "Output"}, {}),
    "batch_norm": ("batch_norm", {"x": "X", "mean": "Mean", "variance": "Variance", "scale": "Scale", "bias": "Bias"},
                   {"out": "Y", "mean_out": "MeanOut", "variance_out": "VarianceOut", "saved_mean": "SavedMean",
                    "saved_variance": "SavedVariance", "reserve_space": "ReserveSpace"}, {"data_format": "data_layout"}),
    "layer_norm": ("layer_norm", {"x": "X", "scale": "Scale", "bias": "Bias"},
                   {"out": "Y", "mean": "Mean", "variance": "Variance"}, {}),
    "add": ("elementwise_add",) + _ELEMENTWISE, "subtract": ("elementwise_sub",) + _ELEMENTWISE,
    "multiply": ("elementwise_mul",) + _ELEMENTWISE, "divide": ("elementwise_div",) + _ELEMENTWISE,
    "maximum": ("elementwise_max",) + _ELEMENTWISE, "minimum": ("elementwise_min",) + _ELEMENTWISE,
    "elementwise_pow": ("elementwise_pow",) + _ELEMENTWISE,
    "matmul": ("matmul_v2", {"x": "X", "y": "Y"}, _OUT, {"transpose_x": "trans_x", "transpose_y": "trans_y"}),
    "relu": ("relu", _X, _OUT, {}), "sigmoid": ("sigmoid", _X, _OUT, {}), "swish": ("swish", _X, _OUT, {}),
    "silu": ("silu", _X, _OUT, {}), "tanh": ("tanh", _X, _OUT, {}), "exp": ("exp", _X, _OUT, {}),
    "sqrt": ("sqrt", _X, _OUT, {}), "reciprocal": ("reciprocal", _X, _OUT, {}), "abs": ("abs", _X, _OUT, {}),
    "relu6": ("relu6", _X, _OUT, {}), "gelu": ("gelu", _X, _OUT, {}),
    "leaky_relu": ("leaky_relu", _X, _OUT, {"negative_slope": "alpha"}),
    "hardswish": ("hard_swish", _X, _OUT, {}), "hardsigmoid": ("hard_sigmoid", _X, _OUT, {}),
    "softmax": ("softmax", _X, _OUT, {}),
    "scale": ("scale", {"x": "X", "scale": ("scale", "ScaleTensor")}, _OUT, {}),
    "reshape": ("reshape2", {"x": "X", "shape": ("shape", "ShapeTensor")}, {"out": "Out", "xshape": "XShape"}, {}),
    "transpose": ("transpose2", _X, _OUT, {"perm": "axis"}),
    "flatten": ("flatten_contiguous_range", _X, {"out": "Out", "xshape": "XShape"}, {}),
    "squeeze": ("squeeze2", {"x": "X", "axis": ("axes", "AxesTensor")}, {"out": "Out", "xshape": "XShape"}, {}),
    "unsqueeze": ("unsqueeze2", {"x": "X", "axis": ("axes", "AxesTensor")}, {"out": "Out", "xshape": "XShape"}, {}),
    "slice": ("slice", {"input": "Input", "starts": ("starts", "StartsTensorList"),
                        "ends": ("ends", "EndsTensorList")}, _OUT, {}),
    "shape": ("shape", {"input": "Input"}, _OUT, {}), "shape64": ("shape", {"input": "Input"}, _OUT, {}),
    "concat": ("concat", {"x": "X", "axis": ("axis", "AxisTensor")}, _OUT, {}),
    "pool2d": ("pool2d", {"x": "X", "kernel_size": ("ksize", "KernelSize")}, _OUT, {}),
    "nearest_interp": ("nearest_interp_v2", {"x": "X", "out_size": "OutSize", "size_tensor": "SizeTensor",
                                             "scale_tensor": "Scale"}, {"output": "Out"}, {"data_format": "data_layout"}),
    "bilinear_interp": ("bilinear_interp_v2", {"x": "X", "out_size": "OutSize", "size_tensor": "SizeTensor",
                                               "scale_tensor": "Scale"}, {"output": "Out"}, {"data_format": "data_layout"}),
    "mean": ("reduce_mean", {"x": "X", "axis": ("dim", "AxisTensor")}, _OUT, {"keepdim": "keep_dim"}),
    "sum": ("reduce_sum", {"x": "X", "axis": ("dim", "AxisTensor")}, _OUT, {"keepdim": "keep_dim", "dtype": "out_dtype"}),
    "arange": ("range", {"start": "Start", "end": "End", "step": "Step"}, _OUT, {}),
    "meshgrid": ("meshgrid", {"inputs": "X"}, _OUT, {}),
    "stack": ("stack", {"x": "X"}, {"out": "Y"}, {}),
    "split_with_num": ("split", {"x": "X", "axis": ("axis", "AxisTensor")}, _OUT, {}),
    "full_like": ("fill_any_like", {"x": "X", "value": ("value", "ValueTensor")}, _OUT, {}),
    "assign": ("assign", _X, _OUT, {}),
    "cast": ("cast", _X, _OUT, {"dtype": "out_dtype"}),
    "clip": ("clip", {"x": "X", "min": ("min", "Min"), "max": ("max", "Max")}, _OUT, {}),
    "dropout": ("dropout", {"x": "X", "seed_tensor": "Seed"}, {"out": "Out", "mask": "Mask"},
                {"p": "dropout_prob", "mode": "dropout_implementation"}),
    "multiclass_nms3": ("multiclass_nms3", {"bboxes": "BBoxes", "scores": "Scores", "rois_num": "RoisNum"},
                        {"out": "Out", "index": "Index", "nms_rois_num": "NmsRoisNum"}, {}),
    "full": ("fill_constant", {}, _OUT, {}),
    "full_int_array": ("assign_value", {}, _OUT, {}),
}
_SKIP_ATTRS = {"stop_gradient", "struct_name", "place", "persistable", "op_callstack"}


@contextlib.contextmanager
def _static_mode():
    """Static (PIR) mode for Paddle's loader, dygraph (or whatever was on) again afterwards."""
    import paddle

    was_dynamic = paddle.in_dynamic_mode()
    if was_dynamic:
        paddle.enable_static()
    try:
        yield
    finally:
        if was_dynamic:
            paddle.disable_static()


def _plain(value):
    """A PIR attribute value as plain Python (dtypes as their names)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if type(value).__name__ == "DataType":
        name = str(value).split(".")[-1].split(":")[0].lower()
        return None if name == "undefined" else {"float32": "float32"}.get(name, name)
    return value


def _load_pir(prefix: Path, program_file: Path) -> Program:
    import paddle

    scope = paddle.static.Scope()
    try:
        with _static_mode(), paddle.static.scope_guard(scope):
            exe = paddle.static.Executor(paddle.CPUPlace())
            prog, feed_names, fetch_values = paddle.static.load_inference_model(str(prefix), exe)
    except ProgramError:
        raise
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ProgramError(f"{program_file}: Paddle could not load it ({first})") from None
    names: dict[str, str] = {}       # Value.id -> name
    lists: dict[str, list[str]] = {}  # Value.id of a builtin.combine result / split input -> names
    consts: dict[str, object] = {}   # Value.id -> constant value (full / full_int_array)
    params, ops, fetches = {}, [], {}
    all_ops = list(prog.global_block().ops)
    for i, op in enumerate(all_ops):  # name every value first; builtin.split names its input's parts
        kind = op.name()
        if kind == "builtin.parameter":
            names[op.result(0).id] = name = op.attrs()["parameter_name"]
            params[name] = np.array(scope.find_var(name).get_tensor())
        elif kind == "pd_op.data":
            names[op.result(0).id] = op.attrs()["name"]
        elif kind == "builtin.split":
            parts = [f"split_{i}.out{k}" for k in range(op.num_results())]
            for k, r in enumerate(op.results()):
                names[r.id] = parts[k]
            lists[op.operand_source(0).id] = parts
        elif kind != "builtin.combine":
            old = PIR_OPS.get(kind.split(".", 1)[1].rstrip("_"), (kind.split(".", 1)[1],))[0]
            for k, r in enumerate(op.results()):
                names.setdefault(r.id, f"{old}_{i}.out{k}")
    for op in all_ops:
        kind = op.name()
        if kind == "builtin.combine":
            lists[op.result(0).id] = [names[v.id] for v in op.operands_source()]
            continue
        if kind == "pd_op.fetch":
            fetches[int(op.attrs()["col"])] = names[op.operand_source(0).id]
            continue
        if kind in ("builtin.parameter", "pd_op.data", "builtin.split"):
            continue
        short = kind.split(".", 1)[1] if "." in kind else kind
        entry = PIR_OPS.get(short) or PIR_OPS.get(short.rstrip("_"))
        attrs = {k: _plain(v) for k, v in op.attrs().items() if k not in _SKIP_ATTRS}
        if entry is None:  # kept under its PIR name: the interpreter refuses it with that name
            ops.append(OpDesc(short, {f"x{k}": [names[v.id]] for k, v in enumerate(op.operands_source()) if v.id in names},
                              {"Out": [names[r.id] for r in op.results()]}, attrs))
            continue
        old, in_map, out_map, renames = entry
        attrs = {renames.get(k, k): v for k, v in attrs.items()}
        if short in ("full", "full_int_array"):
            consts[op.result(0).id] = attrs["value"]
        inputs: dict[str, list[str]] = {}
        for slot_name, value in zip(op.get_input_names(), op.operands_source()):
            target = in_map.get(slot_name, slot_name)
            if not value.initialized():
                continue
            if isinstance(target, tuple):
                attr, slot = target
                if value.id in consts:
                    attrs[attr] = _as_attr(attr, consts[value.id])
                    continue
                target = slot
            inputs[target] = lists[value.id] if value.id in lists else [names[value.id]]
        outputs = {}
        for slot_name, value in zip(op.get_output_names(), op.results()):
            outputs[out_map.get(slot_name, slot_name)] = lists[value.id] if value.id in lists else [names[value.id]]
        ops.append(OpDesc(old, inputs, outputs, attrs))
    ops = _drop_unused_constants(ops, [fetches[k] for k in sorted(fetches)])
    return Program(ops, params, list(feed_names), [fetches[k] for k in sorted(fetches)], "json", str(program_file))


def _as_attr(attr: str, value):
    """A folded constant as the old-IR attribute: ``full`` holds floats, an axis or size is an int."""
    if attr in ("scale", "value", "min", "max"):
        return value
    if isinstance(value, list):
        return [int(v) for v in value]
    return int(value)


def _drop_unused_constants(ops: list[OpDesc], fetches: list[str]) -> list[OpDesc]:
    """Without the constants that were all folded into attributes."""
    used = set(fetches) | {n for op in ops for names in op.inputs.values() for n in names}
    return [op for op in ops if op.type not in ("fill_constant", "assign_value")
            or any(n in used for names in op.outputs.values() for n in names)]
