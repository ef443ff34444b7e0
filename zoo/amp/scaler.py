"""paddle.amp.GradScaler, made usable for emulation on a CPU and on NumPy 2.

Two Paddle 3.3 details are worked around here, in one place:
- GradScaler disables itself unless the tracer's place is a GPU/XPU/custom device. Emulation needs
  the *same* scaler (same rule, same state_dict, Paddle's own ``check_finite_and_unscale_`` kernel,
  which runs on CPU), so construction is done with the place check answered as GPU.
  ``scale()`` also disables the scaler unless the AMP dtype in Paddle's global state is float16,
  which only ``auto_cast`` sets; :func:`scale_loss` sets it for the call.
- GradScaler keeps its scale as a shape-[1] tensor and prints ``float(self._scale)`` when it finds
  inf/nan; on NumPy >= 2 ``float()`` of a 1-element array raises, so the first overflow crashes
  training (on a GPU too). The scale is kept 0-d instead; checkpoints keep Paddle's [1] layout.
"""
from __future__ import annotations

import contextlib

import numpy as np
import paddle
import paddle.amp.grad_scaler as _gs
from paddle.amp.auto_cast import amp_global_state


class _GpuPlace:
    def is_gpu_place(self):
        return True

    def is_xpu_place(self):
        return False

    def is_custom_place(self):
        return False


class _TracerAsGpu:
    def __init__(self, tracer):
        self._tracer = tracer
        self._expected_place = _GpuPlace()


@contextlib.contextmanager
def _place_answered_as_gpu():
    real = _gs._dygraph_tracer
    _gs._dygraph_tracer = lambda: _TracerAsGpu(real())
    try:
        yield
    finally:
        _gs._dygraph_tracer = real


def make_grad_scaler(emulated: bool, **scaler_args) -> paddle.amp.GradScaler:
    """An enabled ``paddle.amp.GradScaler`` (also on a CPU when ``emulated``), with a 0-d scale."""
    with _place_answered_as_gpu() if emulated else contextlib.nullcontext():
        scaler = paddle.amp.GradScaler(enable=True, **scaler_args)
    if not scaler._enable:
        raise RuntimeError("paddle.amp.GradScaler refused to enable; this Paddle version's internals "
                           "differ from what zoo.amp.scaler expects")
    scaler._scale = scaler._scale.reshape([])
    return scaler


def scale_loss(scaler: paddle.amp.GradScaler, loss: paddle.Tensor, dtype: str) -> paddle.Tensor:
    """``scaler.scale(loss)`` with Paddle's AMP dtype state set as auto_cast would set it."""
    state = amp_global_state()
    old = state.amp_dtype
    state.amp_dtype = dtype
    try:
        return scaler.scale(loss)
    finally:
        state.amp_dtype = old


def load_scaler_state(scaler: paddle.amp.GradScaler, state: dict) -> None:
    """``scaler.load_state_dict`` accepting the 0-d scale our scalers save."""
    state = dict(state)
    state["scale"] = np.asarray(state["scale"], dtype=np.float32).reshape([1])
    scaler.load_state_dict(state)
    scaler._scale = scaler._scale.reshape([])
