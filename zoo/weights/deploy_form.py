"""Weights of a deploy-form inference model (``inference.pdiparams`` beside its ``.pdmodel`` / ``.json``
program) loaded into the zoo's dygraph model.

An exported program names its tensors after the exporter's variables (``conv2d_394.w_0``), not the
model's state-dict keys, so they are mapped by use: the program runs its ops in the order the
exporter's forward called the layers, and the zoo's model, switched to the same (deploy) form and run
once in eval mode, calls its layers in the same order. Each layer holding tensors of its own is
matched with the next group of program tensors (a conv's filter and the bias added to its output; a
batch norm's four; an affine ``scale * x + bias``), by role and shape. Everything is checked: the
group count, each group's roles and shapes, and, where the exporter's ``.pdiparams.info`` names a
tensor with a key of the model, that key. The first disagreement is an error naming both sides;
nothing is loaded unless all of the program's tensors found their place.

Layers the eval-mode forward never calls (DB's threshold branch, which the export drops) keep their
values and are reported as missing.
"""
from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import paddle

logger = logging.getLogger(__name__)

__all__ = ["DeployFormError", "is_inference_params", "load_deploy_form", "map_program_tensors"]

# (op type, input slot) -> the state-dict role of the tensor fed there (old-IR names; the PIR loader
# of zoo.weights.program maps its ops onto them).
_ROLES = {("conv2d", "Filter"): "weight", ("depthwise_conv2d", "Filter"): "weight",
          ("conv2d_transpose", "Filter"): "weight", ("depthwise_conv2d_transpose", "Filter"): "weight",
          ("matmul_v2", "Y"): "weight", ("batch_norm", "Scale"): "weight", ("batch_norm", "Bias"): "bias",
          ("batch_norm", "Mean"): "_mean", ("batch_norm", "Variance"): "_variance",
          ("layer_norm", "Scale"): "weight", ("layer_norm", "Bias"): "bias",
          ("elementwise_mul", "X"): "scale", ("elementwise_mul", "Y"): "scale",
          ("elementwise_add", "Y"): "bias"}


class DeployFormError(ValueError):
    """The deploy-form weights do not map onto the model; the message names the first mismatch."""


def is_inference_params(path) -> bool:
    """``path`` is a deploy-form parameters file (``*.pdiparams``)."""
    return os.fspath(path).endswith(".pdiparams")


@dataclass
class _Group:
    """Tensors used together: one layer's on the model side, one op's (plus its bias add) in the program."""
    where: str
    tensors: dict[str, tuple] = field(default_factory=dict)  # role -> (name, shape)

    def text(self) -> str:
        return f"{self.where} {{" + ", ".join(f"{r} {n} {list(s)}" for r, (n, s) in self.tensors.items()) + "}"


def _program_groups(program) -> list[_Group]:
    """The program's tensors grouped by the op that first uses them, in execution order. A bias
    ``elementwise_add`` joins the group of the op whose output it adds to."""
    groups, seen, last_out = [], set(), {}
    for index, op in enumerate(program.ops):
        fed = [(slot, n) for slot, names in op.inputs.items() for n in names if n in program.params]
        new = [(slot, n) for slot, n in fed if n not in seen]
        if not new:
            continue
        x = (op.inputs.get("X") or [None])[0]
        group = last_out.get(x) if op.type == "elementwise_add" else None
        if group is None or "bias" in group.tensors:
            group = _Group(f"op #{index} {op.type}")
            groups.append(group)
        for slot, name in new:
            role = _ROLES.get((op.type, slot))
            if role is None:
                raise DeployFormError(f"{program.path}: op #{index} {op.type} takes parameter {name!r} in slot "
                                      f"{slot!r}, which the deploy-form loader does not know")
            if role in group.tensors:
                raise DeployFormError(f"{program.path}: op #{index} {op.type} feeds two {role} tensors")
            group.tensors[role] = (name, tuple(program.params[name].shape))
            seen.add(name)
        for names in op.outputs.values():
            for n in names:
                last_out[n] = group
    return groups


def _own_tensors(layer: paddle.nn.Layer) -> list:
    return list(layer.named_parameters(include_sublayers=False)) + list(layer.named_buffers(include_sublayers=False))


def _model_groups(model: paddle.nn.Layer, size: int = 64) -> list[_Group]:
    """The model's layers owning tensors, in the order an eval-mode forward first calls them."""
    owners = {name: layer for name, layer in model.named_sublayers(include_self=True) if _own_tensors(layer)}
    order: list[str] = []
    hooks = [layer.register_forward_pre_hook(lambda _l, _in, name=name: order.append(name) if name not in order
                                             else None) for name, layer in owners.items()]
    first_conv = next((m for m in model.sublayers() if isinstance(m, paddle.nn.Conv2D)), None)
    channels = first_conv.weight.shape[1] * first_conv._groups if first_conv is not None else 3
    was_training = model.training
    model.eval()
    try:
        with paddle.no_grad():
            model(paddle.zeros([1, channels, size, size]))
    finally:
        for h in hooks:
            h.remove()
        model.train() if was_training else model.eval()
    groups = []
    for name in order:
        group = _Group(f"layer '{name}'")
        for local, value in _own_tensors(owners[name]):
            group.tensors[local] = (f"{name}.{local}" if name else local, tuple(int(d) for d in value.shape))
        groups.append(group)
    return groups


def _structured_names(params_file: Path) -> dict[str, str]:
    """Variable -> state-dict name from the exporter's ``.pdiparams.info``, when it is there and readable."""
    from zoo.weights.safe_pickle import PickleLoadError, load

    info = Path(str(params_file) + ".info")
    if not info.is_file():
        return {}
    try:
        table = load(str(info), return_numpy=True)
    except PickleLoadError as err:
        logger.warning("%s: not used (%s)", info, err)
        return {}
    if not isinstance(table, dict):
        return {}
    return {k: v["structured_name"] for k, v in table.items() if isinstance(v, dict) and "structured_name" in v}


def map_program_tensors(model: paddle.nn.Layer, program, structured: dict[str, str] | None = None) -> dict[str, str]:
    """``{state-dict key: program variable}`` for every tensor of ``program``, checked as the module
    docstring says; raises :class:`DeployFormError` at the first mismatch."""
    ours, theirs = _model_groups(model), _program_groups(program)
    where = f"{program.path} into {type(model).__name__}"
    for i, (mine, other) in enumerate(zip(ours, theirs)):
        same_roles = set(mine.tensors) == set(other.tensors)
        if not same_roles or any(mine.tensors[r][1] != other.tensors[r][1] for r in mine.tensors):
            raise DeployFormError(f"deploy-form weights {where}: layer no. {i + 1} in order of use differs: "
                                  f"the model's {mine.text()}, the program's {other.text()}")
    if len(ours) != len(theirs):
        extra = ours[len(theirs)] if len(ours) > len(theirs) else theirs[len(ours)]
        raise DeployFormError(f"deploy-form weights {where}: the model uses {len(ours)} layers with tensors, "
                              f"the program {len(theirs)} groups; the first without a partner: {extra.text()}")
    mapping = {mine.tensors[r][0]: other.tensors[r][0] for mine, other in zip(ours, theirs) for r in mine.tensors}
    keys = {v: k for k, v in mapping.items()}
    for var, name in (structured or {}).items():
        if var in keys and name in mapping and keys[var] != name:
            raise DeployFormError(f"deploy-form weights {where}: by order of use {var!r} is '{keys[var]}', "
                                  f"but the exporter's .pdiparams.info names it '{name}'")
    return mapping


def load_deploy_form(model: paddle.nn.Layer, params_file) -> dict:
    """Switch ``model`` to its deploy form (``model.rep()``, when it has one) and load the tensors of the
    inference model whose parameters are ``params_file``; returns a load report as
    :func:`zoo.weights.loading.compare_state_dict` does (``missing``: keys the program does not hold)."""
    from zoo.weights.program import ProgramError, load_program

    params_file = Path(params_file)
    try:
        program = load_program(params_file)
    except ProgramError as err:
        raise DeployFormError(str(err)) from None
    if hasattr(model, "rep"):
        model.rep()
    mapping = map_program_tensors(model, program, _structured_names(params_file))
    state = model.state_dict()
    values = {key: np.asarray(program.params[var], dtype=str(state[key].dtype).split(".")[-1])
              for key, var in mapping.items()}
    with warnings.catch_warnings():
        # Paddle warns per key the dict lacks; the report says it once.
        warnings.filterwarnings("ignore", message="Skip loading for")
        model.set_state_dict(values)
    report = {"matched": sorted(mapping), "missing": sorted(set(state) - set(mapping)),
              "unexpected": sorted(set(program.params) - set(mapping.values())), "shape_mismatch": []}
    return report
