"""Low-precision inference exports: a network with its weights stored in fp16 / bf16, the O2 way.

What is written is what ``paddle.amp.decorate(level='O2')`` would run: every parameter and buffer
cast to the format except those Paddle keeps fp32 (BatchNorm always; for fp16 also LayerNorm and
InstanceNorm: ``paddle.amp.auto_cast.need_keep_fp32``). The input is cast to the format at the start
and float outputs back to fp32 at the end (the ``keep_io_types=True`` of Paddle Inference's
``convert_to_mixed_precision``), so clients feed and read float32 as before.

A BatchNorm kept fp32 gets its low-precision input cast to fp32 and its output cast back. That is
the arithmetic of Paddle's low-precision BatchNorm kernel (statistics and arithmetic in fp32,
output rounded to the format), written with casts because a CPU build of Paddle refuses to put a
bf16 tensor into ``batch_norm`` when it builds the program.

Why not ``paddle.inference.convert_to_mixed_precision``: Paddle 3.3.1's CPU build refuses
``backend=PlaceType.CPU`` ("mixed_precision currently not supported place GPU or XPU or CUSTOM, not
support CPU") and ``PlaceType.GPU`` needs a GPU build; it also parses only the old ``.pdmodel``
format, not the PIR ``.json`` that ``paddle.jit.save`` writes in Paddle 3.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping

from paddle import nn

from zoo.export.common import ExportError

__all__ = ["PRECISIONS", "FP32Norm", "LowPrecisionNet", "check_precision", "cast_o2", "in_precision", "precision_dtype"]

PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
NORMS_KEPT_FP32 = (nn.BatchNorm, nn.BatchNorm1D, nn.BatchNorm2D, nn.BatchNorm3D, nn.SyncBatchNorm)


def check_precision(value) -> str:
    """``export.precision`` validated: fp32, fp16 or bf16."""
    precision = str(value).lower()
    if precision not in PRECISIONS:
        raise ExportError(f"export.precision: expected one of {', '.join(PRECISIONS)}, got {value!r}")
    return precision


def precision_dtype(precision: str) -> str:
    """Paddle dtype name of an export precision (``fp16`` -> ``float16``)."""
    return PRECISIONS[check_precision(precision)]


class FP32Norm(nn.Layer):
    """A norm kept fp32 inside a low-precision net: input cast to fp32, output cast back to ``dtype``."""

    def __init__(self, norm: nn.Layer, dtype: str):
        super().__init__()
        self.norm, self.dtype = norm, dtype

    def forward(self, x):
        return self.norm(x.astype("float32")).astype(self.dtype)


def cast_o2(net: nn.Layer, dtype: str) -> tuple[nn.Layer, int]:
    """A copy of ``net`` (eval mode) with O2's parameter casts; returns ``(copy, tensors cast)``."""
    from paddle.amp.auto_cast import need_keep_fp32

    net = copy.deepcopy(net)
    net.eval()
    cast = 0
    for layer in net.sublayers(include_self=True):
        if need_keep_fp32(layer, dtype):
            continue
        own = [t for t in list(layer.parameters(include_sublayers=False)) + list(layer.buffers(include_sublayers=False))
               if t.is_floating_point()]
        if own:
            layer._to_impl(dtype=dtype, include_sublayers=False, floating_only=True)
            cast += len(own)
    # Wrapped after the casts (a wrapper is a plain Layer and would count as castable). Forward
    # hooks would be simpler, but paddle.jit's program conversion does not run them.
    for parent in net.sublayers(include_self=True):
        for name, child in list(parent._sub_layers.items()):
            if isinstance(child, NORMS_KEPT_FP32):
                parent._sub_layers[name] = FP32Norm(child, dtype)
    return net, cast


class LowPrecisionNet(nn.Layer):
    """``net`` after :func:`cast_o2`, taking and returning float32 (input cast in, float outputs out)."""

    def __init__(self, net: nn.Layer, dtype: str):
        super().__init__()
        self.net, self.dtype = net, dtype

    def forward(self, x):
        out = self.net(x.astype(self.dtype))
        if isinstance(out, Mapping):
            return {k: v.astype("float32") if v.is_floating_point() else v for k, v in out.items()}
        return out.astype("float32")


def in_precision(model: nn.Layer, precision: str) -> nn.Layer:
    """``model`` itself (fp32) or an O2-cast copy taking and returning float32."""
    dtype = precision_dtype(precision)
    if dtype == "float32":
        return model
    low, _ = cast_o2(model, dtype)
    return LowPrecisionNet(low, dtype)
