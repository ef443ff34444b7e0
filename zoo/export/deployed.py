"""The numerics of an fp32 inference program deployed in fp16 / bf16 by Paddle Inference, emulated
op by op on a CPU.

A GPU user loads the exported fp32 program with ``Config.enable_use_gpu(mem, dev, PrecisionType.Half)``
(or ``Bfloat16``). Paddle Inference then runs its GPU fusion passes and its mixed-precision pass. This
module predicts the result on a CPU, reading the rule from Paddle's sources
(``paddle/fluid/inference/api/paddle_pass_builder.cc`` kPirGpuPasses,
``paddle/fluid/pir/transforms/general/auto_mixed_precision_pass.cc``):

- **BatchNorm folds into the convolution before it** (``conv2d_bn_fuse``; depthwise too on a GPU):
  :func:`fold_batch_norms` rewrites a copy of the network the same way, in fp32.
- **Every op computes in the low format**, each decided on its own (no promotion as in training
  AMP). The exceptions are the pass's default black list :data:`DEFAULT_BLACK_LIST` and the user's
  list, which Paddle's ``exp_disable_mixed_precision_ops`` *replaces* the default with (so the written
  list holds both). Weights enter a low op rounded to the format, as the pass stores them. BatchNorm's
  own parameters stay fp32. Feed and fetch stay fp32.
- **Convolution (or matmul) + bias add + activation is one fused op** (``conv2d_add_act_fuse``,
  ``matmul_add_act_fuse`` -> ``fc``). When the convolution is kept fp32, the add and the activation
  directly after it run fp32 too. When it runs low, its output is rounded, then the add's, as the
  fused kernel with an identity activation does.

:class:`DeployedEmulation` applies this rule inside ``with emulation():`` with the zoo's training
emulation machinery (zoo/amp/emulation.py: cast round trips, real overflow to inf, depthwise
accumulation in the format). Not modelled: other fusions, and the fold's own arithmetic precision
(Paddle may fold in the low format; here it folds in fp32). ``pytest -m gpu`` compares the
prediction with a real GPU run.
"""
from __future__ import annotations

import copy

import paddle
from paddle import nn

from zoo.amp.emulation import Emulation, canonical, is_low

__all__ = ["DEFAULT_BLACK_LIST", "FUSED_NAMES", "VERSION", "DeployedEmulation", "consumer_black_list",
           "fold_batch_norms"]

# Written into precision_report.json: which rule predicted the deployment (bump when the rule changes).
VERSION = "deployed-1 (BatchNorm folded; conv/matmul + add + activation fused; Paddle 3.3 default black list)"

# auto_mixed_precision_pass.cc SetDefaultBlacklist (pd_op.*; array_to_tensor has no float math here)
DEFAULT_BLACK_LIST = ("exp", "square", "log", "mean", "sum", "sigmoid_cross_entropy_with_logits",
                      "cross_entropy_with_softmax")
# An op the emulation keeps, and the fused ops that replace it in Paddle Inference's GPU program:
# a black list must name the fused op, or the fused op runs low (it is matched by name).
FUSED_NAMES = {"conv2d": ("conv2d", "fused_conv2d_add_act"),
               "depthwise_conv2d": ("depthwise_conv2d", "fused_conv2d_add_act"),
               "matmul": ("matmul", "fc"), "linear": ("matmul", "fc")}
GROUP_HEADS = {"conv2d", "depthwise_conv2d", "matmul", "linear"}
GROUP_ACTS = {"relu", "relu6", "leaky_relu", "hardswish", "swish", "silu", "sigmoid", "tanh", "hardsigmoid"}
_GROUP = "_zoo_fused_stage"   # on a kept group's output: "head" after the conv, "add" after its add
_NORMS = (nn.BatchNorm, nn.BatchNorm1D, nn.BatchNorm2D, nn.BatchNorm3D)


def consumer_black_list(keep) -> list[str]:
    """The op names to hand Paddle Inference (``exp_disable_mixed_precision_ops``): its default list,
    which a user list replaces, then the kept ops under every name they have in the fused program."""
    names = list(DEFAULT_BLACK_LIST)
    for op in keep:
        for name in FUSED_NAMES.get(canonical(op), (canonical(op),)):
            if name not in names:
                names.append(name)
    return names


class DeployedEmulation(Emulation):
    """Paddle Inference's mixed-precision rule: every op low except the black list and ``keep``."""

    def __init__(self, dtype: str, keep=(), depthwise_accumulation: bool = True):
        self.keep = tuple(dict.fromkeys(canonical(o) for o in keep))
        super().__init__("inference", dtype, custom_black_list=DEFAULT_BLACK_LIST + self.keep,
                         depthwise_accumulation=depthwise_accumulation)

    def mode(self, op: str) -> str:
        return "black" if op in self.black else "white"

    def run(self, op: str, fn, args, kwargs):
        stage = _group_stage(op, args)
        if stage is not None:  # inside a kept fused op: fp32, and the group goes on
            return _tagged(fn(*args, **kwargs), stage)
        out = super().run(op, fn, args, kwargs)
        if op in GROUP_HEADS and op in self.black:
            return _tagged(out, "head")
        return out


def _group_stage(op: str, args) -> str | None:
    """The stage a kept group reaches with ``op`` on its output, or None if ``op`` is not part of it."""
    first = args[0] if args else None
    stage = getattr(first, _GROUP, None) if isinstance(first, paddle.Tensor) else None
    if stage is None or is_low(first):
        return None
    if op == "add" and stage == "head":
        return "add"
    if op in GROUP_ACTS and stage in ("head", "add"):
        return "act"
    return None


def _tagged(out, stage: str):
    if isinstance(out, paddle.Tensor) and stage != "act":
        setattr(out, _GROUP, stage)
    return out


def _conv_bn_pairs(net: nn.Layer, sample: paddle.Tensor, forward) -> list[tuple[nn.Conv2D, nn.Layer]]:
    """(convolution, BatchNorm) pairs where the BatchNorm's input is the convolution's output, traced
    over one forward of ``sample``."""
    produced: dict[int, tuple[nn.Conv2D, paddle.Tensor]] = {}
    pairs: list = []
    hooks = []

    def conv_done(layer, _inputs, output):
        produced[id(output)] = (layer, output)  # the tensor is kept, so its id is not reused

    def bn_starts(layer, inputs):
        hit = produced.get(id(inputs[0]))
        if hit is not None and all(layer is not b for _, b in pairs):
            pairs.append((hit[0], layer))

    for layer in net.sublayers():
        if isinstance(layer, nn.Conv2D):
            hooks.append(layer.register_forward_post_hook(conv_done))
        elif isinstance(layer, _NORMS):
            hooks.append(layer.register_forward_pre_hook(bn_starts))
    try:
        with paddle.no_grad():
            forward(net, sample)
    finally:
        for h in hooks:
            h.remove()
    return pairs


@paddle.no_grad()
def fold_batch_norms(net: nn.Layer, sample: paddle.Tensor, forward=None) -> tuple[nn.Layer, int]:
    """A copy of ``net`` (eval mode) with every BatchNorm that directly follows a convolution folded
    into it (weight * gamma / sqrt(var + eps), bias (b - mean) * that + beta) and replaced by an
    identity; returns ``(copy, number folded)``. ``forward(net, sample)`` runs the net (default
    ``net(sample)``); the pairs are found by tracing it."""
    net = copy.deepcopy(net)
    net.eval()
    forward = forward or (lambda n, x: n(x))
    pairs = _conv_bn_pairs(net, sample, forward)
    parents = {id(child): (parent, name) for parent in net.sublayers(include_self=True)
               for name, child in parent._sub_layers.items()}
    for conv, bn in pairs:
        scale = bn.weight.astype("float32") / paddle.sqrt(bn._variance.astype("float32") + bn._epsilon)
        weight = conv.weight.astype("float32") * scale.reshape([-1, 1, 1, 1])
        bias = conv.bias.astype("float32") if conv.bias is not None else paddle.zeros_like(scale)
        bias = (bias - bn._mean.astype("float32")) * scale + bn.bias.astype("float32")
        conv.weight.set_value(weight.astype(conv.weight.dtype))
        if conv.bias is None:
            conv.bias = conv.create_parameter([int(scale.shape[0])], is_bias=True, dtype=conv.weight.dtype)
        conv.bias.set_value(bias.astype(conv.bias.dtype))
        parent, name = parents[id(bn)]
        parent._sub_layers[name] = _FusedActivation(bn._act) if getattr(bn, "_act", None) else nn.Identity()
    return net, len(pairs)


class _FusedActivation(nn.Layer):
    """What is left of ``paddle.nn.BatchNorm(..., act=...)`` once its normalisation is folded into the
    conv: the activation it applied (PaddleOCR's DBHead uses ``act="relu"``; dropping it destroyed
    the probability map). Paddle's fused-activation names map onto ``paddle.nn.functional``."""

    NAMES = {"hard_swish": "hardswish", "hard_sigmoid": "hardsigmoid", "leaky_relu": "leaky_relu"}

    def __init__(self, act: str):
        super().__init__()
        name = self.NAMES.get(act, act)
        if not hasattr(nn.functional, name):
            raise ValueError(f"BatchNorm act={act!r}: no paddle.nn.functional.{name} to keep it after folding")
        self.act, self._fn = act, getattr(nn.functional, name)

    def forward(self, x):
        return self._fn(x)
