"""Where a skipped training step's inf or NaN starts: the first op, forward or backward.

When the numerics guard stops a run after repeated skipped steps, naming the parameters whose
gradients were non-finite says little: one NaN in the head's backward reaches every parameter, so
the first names in model order are the stem's. :func:`locate` re-runs one step (forward and the
scaled backward, no optimizer update) with every ``_C_ops`` call named by the layer running it
(:class:`~zoo.diagnostics.probe.LayerNames`, :func:`~zoo.diagnostics.conformance.every_op`), and
a gradient hook on each op output. It reports:

- ``forward``: the first op call, in execution order, whose output holds inf or NaN (DB's ``exp``
  under fp16 without its recipe: ``head:exp``);
- ``backward``: the first op output, in the order the backward reaches them, whose incoming
  gradient holds inf or NaN (an op whose forward stayed finite but whose gradient overflows).

It runs under the run's own autocast (real AMP or the emulation), so it sees what the step saw.
"""
from __future__ import annotations

import paddle

from zoo.amp import emulation as emu
from zoo.diagnostics.conformance import every_op
from zoo.diagnostics.probe import LayerNames

_FLOATS = (paddle.float32, paddle.float16, paddle.bfloat16, paddle.float64)


def _finite(t) -> bool:
    return bool(paddle.isfinite(t).all())


def locate(model, forward, backward) -> dict:
    """``backward(forward())`` once: the forward (under the run's autocast, returning the loss) with
    every op watched, then the (scaled) backward with a gradient hook on every op output.

    Returns ``{"forward": {"op": "layer:op", "layer_type": ...} | None, "backward": ... | None}``;
    gradients are left on the parameters (the caller clears them)."""
    emu.install()  # the emulation's wrappers go under every_op's (conformance.every_op)
    found: dict = {"forward": None, "backward": None}
    seen: dict[str, int] = {}
    with LayerNames(model) as names:
        def grad_hook(where, low_dtype):
            def hook(g):
                if g is None:  # an output the loss does not depend on (BatchNorm's saved statistics)
                    return g
                # an emulated low-precision output's gradient is rounded to its format on the way in
                # (zoo/amp/emulation.py), as a GPU's fp16 gradient is: judge it in that format
                judged = g.astype(low_dtype) if low_dtype else g
                if found["backward"] is None and not _finite(judged):
                    found["backward"] = where
                return g
            return hook

        def op_hook(name, fn, args, kwargs):
            out = fn(*args, **kwargs)
            items = out if isinstance(out, (list, tuple)) else [out]
            layer, kind = names.current
            base = f"{layer}:{name}"
            seen[base] = seen.get(base, 0) + 1
            where = {"op": base if seen[base] == 1 else f"{base}#{seen[base] - 1}", "layer_type": kind}
            for t in items:
                if not isinstance(t, paddle.Tensor) or t.dtype not in _FLOATS:
                    continue
                if found["forward"] is None and not _finite(t):
                    found["forward"] = where
                if not t.stop_gradient:
                    active = getattr(emu._state, "active", None)
                    low = active.dtype if active is not None and emu.is_low(t) else None
                    t.register_hook(grad_hook(where, low))
            return out

        with every_op(op_hook):
            loss = forward()
    backward(loss)
    return found


def describe(found: dict | None) -> str:
    """One clause for the guard's message."""
    if not found or not (found.get("forward") or found.get("backward")):
        return "no op output or gradient was non-finite when the step was re-run"
    parts = []
    if found.get("forward"):
        f = found["forward"]
        parts.append(f"first non-finite output in the forward: {f['op']} ({f['layer_type']})")
    if found.get("backward"):
        b = found["backward"]
        parts.append(f"first non-finite gradient in the backward: into the output of {b['op']} ({b['layer_type']})")
    return "; ".join(parts)


def locate_and_describe(model, forward, backward) -> tuple[dict, str]:
    """:func:`locate` and :func:`describe` in one call: what the trainer's guard stop takes."""
    found = locate(model, forward, backward)
    return found, describe(found)
