"""What the current device can compute in low precision.

Paddle's ``auto_cast`` / ``GradScaler`` / ``decorate`` only act on GPU, XPU and custom devices; on a
CPU they warn and run FP32 (see ../shared/NOTES.md). ``paddle.amp.is_float16_supported()`` is not a
usable test on its own: it is False on CPU but ``is_bfloat16_supported()`` is True there while
auto_cast still refuses the CPU place. So the zoo decides from the device kind and, on CUDA, the
compute capability: fp16 needs sm 7.0 (tensor cores), bf16 needs sm 8.0.
"""
from __future__ import annotations

from dataclasses import dataclass

import paddle

FP16_MIN_CC = (7, 0)
BF16_MIN_CC = (8, 0)


@dataclass(frozen=True)
class DeviceInfo:
    """The device a run executes on, as recorded in summary.json."""

    kind: str  # "cpu", "gpu", "xpu" or a custom device type
    name: str  # e.g. "cpu", "gpu:0 (NVIDIA A100, sm80)"
    compute_capability: tuple[int, int] | None = None

    def supports(self, dtype: str) -> tuple[bool, str]:
        """Whether Paddle's AMP really computes in ``dtype`` here, and why (or why not)."""
        if self.kind == "cpu":
            return False, "Paddle's AMP does not act on a CPU (auto_cast would silently run FP32)"
        if self.kind == "gpu":
            need = FP16_MIN_CC if dtype == "float16" else BF16_MIN_CC
            cc = self.compute_capability or (0, 0)
            if cc < need:
                return False, (f"{dtype} needs CUDA compute capability >= {need[0]}.{need[1]}, "
                               f"this GPU has {cc[0]}.{cc[1]}")
            return True, f"CUDA compute capability {cc[0]}.{cc[1]}"
        # XPU and custom devices: Paddle's AMP acts there; trust Paddle's own capability query.
        ok = paddle.amp.is_float16_supported() if dtype == "float16" else paddle.amp.is_bfloat16_supported()
        return bool(ok), f"paddle.amp reports {dtype} support={bool(ok)} on {self.kind}"


def current_device() -> DeviceInfo:
    """Describe the device Paddle will place tensors on."""
    place = paddle.device.get_device()  # "cpu", "gpu:0", "xpu:0", "npu:0", ...
    kind = place.split(":")[0]
    if kind == "gpu":
        idx = int(place.split(":")[1]) if ":" in place else 0
        cc = tuple(paddle.device.cuda.get_device_capability(idx))
        name = f"{place} ({paddle.device.cuda.get_device_name(idx)}, sm{cc[0]}{cc[1]})"
        return DeviceInfo("gpu", name, (int(cc[0]), int(cc[1])))
    return DeviceInfo(kind, place)
