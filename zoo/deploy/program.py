"""BatchNorm folding on a :class:`~zoo.weights.program.Program`, and the program reader re-exported
for the deploy check.

:func:`fold_batch_norms` is Paddle Inference's ``conv_bn_fuse_pass`` /
``conv_eltwiseadd_bn_fuse_pass`` on this representation, in fp32. The reader itself (old-IR
``*.pdmodel`` and PIR ``*.json`` with their ``*.pdiparams``) is zoo/weights/program.py.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from zoo.deploy.errors import DeployError
from zoo.weights.program import CONVS, PIR_OPS, OpDesc, Program, load_program

__all__ = ["DeployError", "OpDesc", "PIR_OPS", "Program", "fold_batch_norms", "load_program"]


# ---------------------------------------------------------------- BatchNorm folding

def _consumers(program: Program) -> dict[str, int]:
    count: dict[str, int] = {}
    for op in program.ops:
        for names in op.inputs.values():
            for n in names:
                count[n] = count.get(n, 0) + 1
    for n in program.fetches:
        count[n] = count.get(n, 0) + 1
    return count


def fold_batch_norms(program: Program) -> tuple[Program, int]:
    """A new program in which every ``batch_norm`` whose input is a conv2d / depthwise_conv2d output
    used by nothing else (directly, or through the conv's bias ``elementwise_add``) is folded into
    the conv's filter and a bias, as Paddle Inference's conv_bn_fuse_pass does; returns it and the
    number folded. The folded bias is an ``elementwise_add`` (axis 1) writing the batch_norm's output
    variable, so what follows is unchanged. Arithmetic in fp32."""
    params = dict(program.params)
    uses = _consumers(program)
    producer = {n: i for i, op in enumerate(program.ops) for names in op.outputs.values() for n in names}
    filter_uses: dict[str, int] = {}
    for op in program.ops:
        if op.type in CONVS:
            filter_uses[op.inputs["Filter"][0]] = filter_uses.get(op.inputs["Filter"][0], 0) + 1
    ops = list(program.ops)
    drop, folded = set(), 0
    for bn_index, bn in enumerate(program.ops):
        if bn.type != "batch_norm" or bn.attrs.get("fuse_with_relu") or bn.attrs.get("data_layout", "NCHW") != "NCHW":
            continue
        x = bn.inputs["X"][0]
        source = producer.get(x)
        if source is None or uses.get(x) != 1:
            continue
        add_index = None
        if program.ops[source].type == "elementwise_add":  # conv -> bias add -> batch_norm
            add = program.ops[source]
            y = add.inputs["Y"][0]
            conv_out = add.inputs["X"][0]
            if (y not in params or params[y].ndim != 1 or add.attrs.get("axis", -1) != 1
                    or conv_out not in producer or uses.get(conv_out) != 1):
                continue
            add_index, source = source, producer[conv_out]
        conv = program.ops[source]
        if conv.type not in CONVS or conv.attrs.get("data_format", "NCHW") not in ("NCHW", "AnyLayout"):
            continue
        w_name = conv.inputs["Filter"][0]
        if filter_uses.get(w_name) != 1 or w_name not in params:
            continue
        p = {k: params[bn.inputs[k][0]].astype(np.float32) for k in ("Scale", "Bias", "Mean", "Variance")}
        scale = p["Scale"] / np.sqrt(p["Variance"] + np.float32(bn.attrs.get("epsilon", 1e-5)))
        weight = params[w_name].astype(np.float32)
        params[w_name] = (weight * scale.reshape(-1, 1, 1, 1)).astype(params[w_name].dtype)
        y_out = bn.outputs["Y"][0]
        if add_index is not None:
            b_name = ops[add_index].inputs["Y"][0]
            params[b_name] = ((params[b_name].astype(np.float32) - p["Mean"]) * scale + p["Bias"]).astype(np.float32)
            ops[add_index] = replace(ops[add_index], outputs={**ops[add_index].outputs, "Out": [y_out]})
            drop.add(bn_index)
        else:
            b_name = f"{y_out}.bn_folded_bias"
            params[b_name] = (p["Bias"] - p["Mean"] * scale).astype(np.float32)
            ops[bn_index] = OpDesc("elementwise_add", {"X": [x], "Y": [b_name]}, {"Out": [y_out]}, {"axis": 1})
        folded += 1
    ops = [op for i, op in enumerate(ops) if i not in drop]
    used = {n for op in ops for names in op.inputs.values() for n in names}
    params = {k: v for k, v in params.items() if k in used}
    return replace(program, ops=ops, params=params), folded
