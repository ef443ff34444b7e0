"""How much of a deployment's compute stays fp32: the cost of each op call, and the fp32 share.

A keep-list can make a low-precision deployment equivalent to FP32 by keeping nearly everything
fp32 (DB keeping ``conv2d``, ``depthwise_conv2d`` and ``add`` leaves little in bf16). The verdict
alone does not say so, so the check measures it, on the same forwards as its per-layer scan:

- the **cost** of an op call is its arithmetic: ``2 x output elements x reduction length`` for a
  convolution or matrix product (its multiply-adds, counted as two operations, as FLOPs are), and for
  every other op the elements of its largest float tensor, input or output (an add, an activation, a
  pooling reads or writes each element once);
- the **fp32 share** is the cost of the calls whose output is fp32 (kept ops, the ops fused with a
  kept convolution, Paddle's default black list) over the cost of all calls.

Convolutions dominate a CNN's cost, so keeping ``conv2d`` alone moves most of it to fp32: that is
the case :data:`WARN_SHARE` (``export.check.warn_fp32_share``) warns about.
"""
from __future__ import annotations

import math

import paddle

__all__ = ["DEFINITION", "WARN_SHARE", "compute_share", "op_cost", "share_warning"]

WARN_SHARE = 0.5
DEFINITION = ("share of the deployment's arithmetic computed in fp32: convolutions and matrix products count "
              "2 x output elements x reduction length, other ops the elements of their largest float tensor "
              "(zoo/export/compute.py)")
_CONV = {"conv2d", "depthwise_conv2d", "conv3d"}
_CONV_T = {"conv2d_transpose", "depthwise_conv2d_transpose", "conv3d_transpose"}


def _numel(t) -> int:
    return int(math.prod(t.shape)) if isinstance(t, paddle.Tensor) else 0


def _tensors(args):
    for a in args:
        if isinstance(a, paddle.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, paddle.Tensor))


def op_cost(name: str, args, out) -> int:
    """The arithmetic of one op call (module docstring); ``args`` as the ``_C_ops`` function got them."""
    tensors = [t for t in args if isinstance(t, paddle.Tensor)]
    if name in _CONV and len(tensors) >= 2:       # weight [Cout, Cin / groups, kh, kw]
        return 2 * _numel(out) * math.prod(tensors[1].shape[1:])
    if name in _CONV_T and len(tensors) >= 2:     # weight [Cin, Cout / groups, kh, kw]: per input element
        return 2 * _numel(tensors[0]) * math.prod(tensors[1].shape[1:])
    if name == "matmul" and len(tensors) >= 2:
        x = tensors[0]
        transpose_x = bool(args[2]) if len(args) > 2 and isinstance(args[2], bool) else False
        k = x.shape[-2] if transpose_x and len(x.shape) > 1 else x.shape[-1]
        return 2 * _numel(out) * int(k)
    if name == "linear" and len(tensors) >= 2:    # weight [in, out]
        return 2 * _numel(out) * int(tensors[1].shape[0])
    return max([_numel(out), *(_numel(t) for t in _tensors(args))])


def compute_share(calls) -> dict:
    """``{"fp32_share", "cost", "fp32_cost", "fp32_ops"}`` of recorded calls (zoo/export/layers.py
    :class:`~zoo.export.layers.Call`, each with ``cost`` and ``fp32_cost``); ``fp32_ops`` is each op
    type's share of the whole cost that runs fp32, largest first."""
    calls = list(calls.values()) if isinstance(calls, dict) else list(calls)
    total = sum(c.cost for c in calls)
    fp32 = sum(c.fp32_cost for c in calls)
    by_op: dict[str, int] = {}
    for c in calls:
        if c.fp32_cost:
            by_op[c.op] = by_op.get(c.op, 0) + c.fp32_cost
    ops = {op: cost / total for op, cost in sorted(by_op.items(), key=lambda kv: -kv[1])} if total else {}
    return {"fp32_share": fp32 / total if total else 0.0, "cost": int(total), "fp32_cost": int(fp32),
            "fp32_ops": ops}


def share_warning(share: float, keep, precision: str, limit: float = WARN_SHARE,
                  key: str = "export.check.warn_fp32_share") -> str | None:
    """A warning when the keep-list leaves ``precision`` in name only (more than ``limit`` fp32); ``key``
    is the setting that moves the limit, as the tool's user types it."""
    if not keep or share <= limit:
        return None
    return (f"{precision} in name only: keeping {list(keep)} fp32 leaves {100 * share:.0f} % of the compute in fp32 "
            f"and {100 * (1 - share):.0f} % in {precision} (warned above {key}={limit:g})")
