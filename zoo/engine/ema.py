"""Exponential moving average of model weights, always kept in float32.

Under O2 the model's parameters may be fp16; averaging in fp16 loses the small updates EMA exists
to accumulate (PaddleDetection PR #8305 moved its EMA to fp32 for this reason).
"""
from __future__ import annotations

import contextlib

import paddle

from zoo.utils.checks import Bound, check


class ModelEMA:
    """fp32 weight average with the usual warm-up ramp ``min(decay, (1 + t) / (10 + t))``, so the
    average follows the model closely during the first updates instead of lagging at its init."""

    def __init__(self, model, decay: float = 0.9998):
        check("trainer.ema_decay", decay, Bound(0, 1, low_inclusive=False))
        self.decay = decay
        self.updates = 0
        self.shadow = {k: v.astype("float32").clone() for k, v in model.state_dict().items()}

    @paddle.no_grad()
    def update(self, model) -> None:
        """Fold the model's current weights into the average (float buffers only; counters copied)."""
        self.updates += 1
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for k, v in model.state_dict().items():
            s = self.shadow[k]
            if v.dtype in (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64):
                s.set_value(s * d + v.astype("float32") * (1.0 - d))
            else:
                s.set_value(v.astype(s.dtype))

    @contextlib.contextmanager
    def applied(self, model):
        """Temporarily load the averaged weights into ``model`` (for evaluation and export)."""
        backup = {k: v.clone() for k, v in model.state_dict().items()}
        model.set_state_dict({k: v.astype(backup[k].dtype) for k, v in self.shadow.items()})
        try:
            yield model
        finally:
            model.set_state_dict(backup)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates, "shadow": self.shadow}

    def set_state_dict(self, state: dict) -> None:
        self.decay, self.updates = state["decay"], state["updates"]
        self.shadow = {k: paddle.to_tensor(v).astype("float32") for k, v in state["shadow"].items()}
