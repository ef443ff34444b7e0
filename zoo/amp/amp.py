"""The AMP component: the one place where precision is handled.

The training loop calls the same four things whatever the precision (STYLE.md: nanoGPT's
``GradScaler(enabled=...)``, timm's NativeScaler, mmengine's AmpOptimWrapper)::

    model, optimizer = amp.setup(model, optimizer, device)   # once
    with amp.autocast():
        losses = task.losses(model, batch)
    amp.backward(losses["loss"])
    stepped = amp.step(optimizer)        # False when the loss scaler skipped the update

What was *requested* and what is *effective* are kept apart and both recorded: a request for fp16
on a device where Paddle's AMP cannot act is never reported as fp16 (``amp.on_unsupported``).
"""
from __future__ import annotations

import contextlib
import inspect
import io
import logging

import paddle

from zoo.amp.capability import DeviceInfo
from zoo.amp.emulation import (
    Emulation,
    low_precision_parameters,
    mark_o2_parameters,
    round_parameter_grads,
    unknown_op,
)
from zoo.amp.numerics_guard import NumericsGuard
from zoo.amp.scaler import load_scaler_state, make_grad_scaler, scale_loss
from zoo.utils.checks import COUNT, POSITIVE, Bound, check_table, prefixed

log = logging.getLogger(__name__)

LEVELS = ("O0", "O1", "O2")
DTYPES = ("float16", "bfloat16")
ON_UNSUPPORTED = ("fp32", "error", "emulate")
_SHORT = {"float16": "fp16", "bfloat16": "bf16"}


# The loss scaler's numbers (configs/amp/*.yaml), as paddle.amp.GradScaler needs them: a scale that
# starts positive, grows (> 1) and shrinks (in (0, 1)) by finite ratios, every whole number of steps.
# Also checked, as amp.<key>, with the rest of a run's config before anything is built (zoo/engine/run.py).
SETTINGS = {
    "init_loss_scaling": POSITIVE,
    "incr_ratio": Bound(1, low_inclusive=False),
    "decr_ratio": Bound(0, 1, low_inclusive=False),
    "incr_every_n_steps": COUNT,
    "decr_every_n_nan_or_inf": COUNT,
}


class AmpConfigError(ValueError):
    """An ``amp.*`` config value is invalid; the message names the key."""


class AmpUnsupportedError(RuntimeError):
    """AMP was requested on a device that cannot run it and ``amp.on_unsupported`` said so."""


def _check(cond: bool, key: str, expected: str, got) -> None:
    if not cond:
        raise AmpConfigError(f"amp.{key}: expected {expected}, got {got!r}")


def _check_master_grad_supported(master_grad: bool) -> None:
    """Paddle before 2.6 has no ``master_grad`` in ``decorate``: refuse rather than drop the flag
    silently (PaddleDetection drops it on Paddle >= 2.6 instead; our configs pass it through)."""
    if master_grad and "master_grad" not in inspect.signature(paddle.amp.decorate).parameters:
        raise AmpConfigError(f"amp.master_grad: true, but paddle {paddle.__version__}'s "
                             "paddle.amp.decorate has no master_grad; upgrade Paddle (>= 2.6) or set "
                             "amp.master_grad=false and accept fp16 gradients")


def keep_layers_fp32(model, names) -> list:
    """Run the sublayers ``names`` of ``model`` (``amp.fp32_layers``) in fp32: each one's forward inside
    ``paddle.amp.auto_cast(enable=False)`` with its low-precision tensor inputs cast to float32 (in the
    emulation that region computes unrounded, zoo/amp/emulation.py ``suspended``); at O2 they are also
    left out of ``paddle.amp.decorate`` (``excluded_layers``), so their parameters stay fp32. For the one
    layer that overflows where the op list cannot say it (a conv, the op that carries most of the
    compute). Returns the layers; an unknown name is one error listing the nearest names."""
    if not names:
        return []
    inner = getattr(model, "_layers", model)  # paddle.DataParallel keeps the model here
    layers = dict(inner.named_sublayers())
    out = []
    for name in names:
        if name not in layers:
            import difflib

            near = difflib.get_close_matches(name, list(layers), n=3, cutoff=0.5)
            raise AmpConfigError(f"amp.fp32_layers: no sublayer {name!r} in {type(inner).__name__}"
                                 + (f"; nearest: {', '.join(near)}" if near else ""))
        layer = layers[name]
        if not getattr(layer, "_zoo_fp32", False):
            _wrap_fp32(layer)
        out.append(layer)
    return out


def _wrap_fp32(layer) -> None:
    forward = layer.forward

    def fp32_forward(*args, **kwargs):
        def up(x):
            return x.astype("float32") if isinstance(x, paddle.Tensor) and x.is_floating_point() else x

        with paddle.amp.auto_cast(enable=False):  # looked up now: the emulation's wrapper when installed
            return forward(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})

    layer.forward = fp32_forward
    layer._zoo_fp32 = True


class Amp:
    """Autocast, O2 decoration and loss scaling behind one interface.

    Arguments mirror ``paddle.amp.auto_cast``, ``paddle.amp.decorate`` and ``paddle.amp.GradScaler``
    (same names, same defaults as Paddle 3.3), plus ``on_unsupported`` (``fp32`` | ``error`` |
    ``emulate``) deciding what happens when the device cannot run the requested precision.
    """

    def __init__(self, name: str = "fp32", enabled: bool = False, level: str = "O1",
                 dtype: str = "float16", custom_white_list=(), custom_black_list=(),
                 master_weight: bool = True, master_grad: bool = False,
                 init_loss_scaling: float = 65536.0, incr_ratio: float = 2.0,
                 decr_ratio: float = 0.5, incr_every_n_steps: int = 2000,
                 decr_every_n_nan_or_inf: int = 1, use_dynamic_loss_scaling: bool = True,
                 on_unsupported: str = "emulate", guard: dict | None = None,
                 emulation: dict | None = None, fp32_layers=()):
        _check(isinstance(enabled, bool), "enabled", "true or false", enabled)
        _check(level in LEVELS, "level", f"one of {', '.join(LEVELS)}", level)
        _check(dtype in DTYPES, "dtype", f"one of {', '.join(DTYPES)}", dtype)
        _check(on_unsupported in ON_UNSUPPORTED, "on_unsupported",
               f"one of {', '.join(ON_UNSUPPORTED)}", on_unsupported)
        scaler = dict(init_loss_scaling=init_loss_scaling, incr_ratio=incr_ratio, decr_ratio=decr_ratio,
                      incr_every_n_steps=incr_every_n_steps, decr_every_n_nan_or_inf=decr_every_n_nan_or_inf)
        check_table(lambda key: scaler[key.removeprefix("amp.")], prefixed("amp.", SETTINGS), AmpConfigError)
        for key, lst in (("custom_white_list", custom_white_list), ("custom_black_list", custom_black_list)):
            _check(all(isinstance(op, str) for op in lst), key, "a list of Paddle op names", list(lst))
            for op in lst:  # Paddle ignores a name it never meets: a typo would silently change nothing
                if (problem := unknown_op(op)) is not None:
                    raise AmpConfigError(f"amp.{key}: {problem}")
        _check(not isinstance(fp32_layers, str) and all(isinstance(n, str) and n for n in fp32_layers),
               "fp32_layers", "a list of sublayer names (e.g. head.binarize.conv1)", fp32_layers)
        self.fp32_layers = list(fp32_layers)
        self.name = name
        self.enabled = enabled and level != "O0"
        self.level, self.dtype = level, dtype
        self.white, self.black = sorted(custom_white_list), sorted(custom_black_list)
        self.master_weight, self.master_grad = master_weight, master_grad
        self.scaler_args = dict(init_loss_scaling=float(init_loss_scaling), incr_ratio=float(incr_ratio),
                                decr_ratio=float(decr_ratio), incr_every_n_steps=int(incr_every_n_steps),
                                decr_every_n_nan_or_inf=int(decr_every_n_nan_or_inf),
                                use_dynamic_loss_scaling=bool(use_dynamic_loss_scaling))
        self.on_unsupported = on_unsupported
        self.emulation_options = dict(emulation or {})
        unknown = set(self.emulation_options) - {"forward", "backward", "depthwise_accumulation"}
        _check(not unknown, "emulation", "keys forward, backward, depthwise_accumulation", sorted(unknown))
        for key, value in self.emulation_options.items():
            _check(isinstance(value, bool), f"emulation.{key}", "true or false", value)
        self.effective = "fp32"
        self.reason = "AMP not requested"
        self.scaler: paddle.amp.GradScaler | None = None
        self.emulation: Emulation | None = None
        self.guard = NumericsGuard(**dict(guard or {}))
        self.guard.dynamic = bool(use_dynamic_loss_scaling)
        self.skipped_steps = 0
        self._low_grads: list = []  # parameters whose gradients are stored low (emulated O2)

    # ---- what was asked and what runs -------------------------------------------------------
    @property
    def requested(self) -> str:
        """Requested precision, e.g. ``fp16-O1``; ``fp32`` when AMP is off."""
        return f"{_SHORT[self.dtype]}-{self.level}" if self.enabled else "fp32"

    @property
    def active(self) -> bool:
        """True when the run computes in low precision (real AMP, or emulated numerics)."""
        return self.effective != "fp32"

    @property
    def emulated(self) -> bool:
        return self.emulation is not None

    def resolve(self, device: DeviceInfo) -> str:
        """Decide the effective precision on ``device``; raise if ``on_unsupported=error``."""
        if not self.enabled:
            self.effective, self.reason = "fp32", "AMP not requested"
            return self.effective
        ok, why = device.supports(self.dtype)
        if ok:
            self.effective, self.reason = self.requested, why
        elif self.on_unsupported == "fp32":
            self.effective = "fp32"
            self.reason = f"{why}; amp.on_unsupported=fp32, so this run computes in FP32"
        elif self.on_unsupported == "error":
            raise AmpUnsupportedError(f"{self.requested} requested on {device.name}: {why} "
                                      "(amp.on_unsupported=error). Set amp.on_unsupported=fp32 to "
                                      "run FP32 and record it, or use amp=fp32.")
        else:
            self.emulation = Emulation(self.level, self.dtype, self.white, self.black, **self.emulation_options)
            self.effective = f"emulated-{self.requested}"
            if not self.emulation.faithful:  # an ablation is never reported as the precision itself
                kept = [k for k in ("forward", "backward") if getattr(self.emulation, k)] or ["none"]
                self.effective += f"-ablation-{'+'.join(kept)}-rounding"
            what = "rounding, overflow and loss scaling" if self.dtype == "float16" else "rounding"
            self.reason = (f"{why}; amp.on_unsupported=emulate: {self.dtype} {what} emulated in FP32 "
                           "arithmetic (the numbers of AMP, not its speed)")
        return self.effective

    def describe(self, device: DeviceInfo) -> str:
        """The one line printed at start: requested vs effective precision and why."""
        line = f"precision: requested {self.requested}, effective {self.effective} on {device.name}"
        if self.requested != self.effective or not self.active:
            line += f" ({self.reason})"
        if self.active and self.level == "O2":
            line += ("; parameter gradients fp32 (amp.master_grad=true)" if self.master_grad else
                     f"; parameter gradients stored in {_SHORT[self.dtype]} (amp.master_grad=false)")
        if self.scaler is not None:
            a = self.scaler_args
            line += (f"; loss scale {a['init_loss_scaling']:g}"
                     f"{' dynamic' if a['use_dynamic_loss_scaling'] else ' static'}")
        return line

    # ---- the four calls the loop makes ------------------------------------------------------
    def setup(self, model, optimizer, device: DeviceInfo):
        """Resolve precision, decorate for O2 and build the scaler. Returns (model, optimizer).

        ``optimizer`` may be None (evaluation only): then no scaler is built.
        """
        self.resolve(device)
        if not self.active:
            return model, optimizer
        kept = keep_layers_fp32(model, self.fp32_layers)
        if self.level == "O2" and self.emulated:
            # Emulation keeps fp32 master parameters itself and rounds the ones decorate would cast
            # wherever they are used; without master_grad their gradients are stored low too.
            mark_o2_parameters(model, self.dtype, exclude=kept)
            stored_low = not self.master_grad and self.emulation.backward
            self._low_grads = low_precision_parameters(model.parameters()) if stored_low else []
        elif self.level == "O2":
            _check_master_grad_supported(self.master_grad)
            # save_dtype float32 keeps checkpoints fp32 whatever the compute dtype (PaddleClas does
            # the same); master_grad accumulates fp32 grads (PaddleDetection PR #8305).
            out = paddle.amp.decorate(
                models=model, optimizers=optimizer, level="O2", dtype=self.dtype,
                master_weight=self.master_weight, save_dtype="float32", master_grad=self.master_grad,
                excluded_layers=kept or None)
            model, optimizer = out if optimizer is not None else (out, None)
        if self.dtype == "float16" and optimizer is not None:  # Paddle's scaler is off for bf16
            self.scaler = make_grad_scaler(self.emulated, **self.scaler_args)
        return model, optimizer

    def autocast(self):
        """Context in which the forward pass runs (a no-op when the effective precision is FP32)."""
        if not self.active:
            return contextlib.nullcontext()
        if self.emulated:
            return self.emulation()
        return paddle.amp.auto_cast(enable=True, custom_white_list=self.white or None,
                                    custom_black_list=self.black or None, level=self.level,
                                    dtype=self.dtype)

    def backward(self, loss: paddle.Tensor) -> None:
        """Backward of the (scaled) loss."""
        (scale_loss(self.scaler, loss, self.dtype) if self.scaler is not None else loss).backward()

    def step(self, optimizer) -> bool:
        """Unscale, step unless gradients overflowed, update the scale. True if parameters moved."""
        low = self._low_grads
        if low:  # O2 without master_grad: the accumulated gradient is stored in the format
            round_parameter_grads(low, self.dtype)
        if self.scaler is None:
            optimizer.step()
            return True
        if low:  # GradScaler._unscale multiplies in fp32 and writes back in the grads' dtype
            self.scaler.unscale_(optimizer)
            if round_parameter_grads(low, self.dtype):
                self.scaler._found_inf = paddle.to_tensor(True)
        self.scaler.step(optimizer)
        found_inf = bool(self.scaler._cache_found_inf)  # set by GradScaler.step, Paddle 3.x
        with contextlib.redirect_stdout(io.StringIO()):  # GradScaler prints every decrease;
            self.scaler.update()                         # the guard logs skips instead
        self.skipped_steps += int(found_inf)
        return not found_inf

    @property
    def loss_scale(self) -> float | None:
        """Current loss scale, None when no scaler is in use."""
        if self.scaler is None:
            return None
        return float(self.scaler._scale)  # kept 0-d by zoo.amp.scaler

    # ---- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Scaler state (Paddle's keys) plus the zoo's skip counter; empty scaler state if none."""
        return {"scaler": self.scaler.state_dict() if self.scaler is not None else {},
                "skipped_steps": self.skipped_steps, "effective": self.effective}

    def set_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` wrote; refuses a checkpoint of another precision."""
        saved = state.get("effective", "fp32")
        if saved != self.effective:
            raise AmpConfigError(f"checkpoint was trained with effective precision {saved}, this run "
                                 f"is {self.effective}; resume with the same amp settings")
        if self.scaler is not None and state.get("scaler"):
            load_scaler_state(self.scaler, state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
