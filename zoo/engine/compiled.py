"""``trainer.compile``: the training forward and loss under ``paddle.jit.to_static``.

What is compiled is the function the loop calls before backward: the autocast context, the model's
forward and the task's loss (``task.losses``), in SOT mode (``full_graph=False``). What SOT made of
it in Paddle 3.3.1 on this CPU (``SOT_LOG_LEVEL=3``): SOT has no handler for ``with`` statements, so
the frame holding the autocast context runs as Python and the frames it calls are translated and
compiled, once, then reused from SOT's cache: resnet's forward whole; DB's model forward and loss
frames, with one graph break at DBLoss's ``auto_cast(enable=False)`` block. Those compiled
frames run under whatever AMP state the tracer holds (real ``auto_cast`` on a GPU).

Backward, the loss scaler and the optimizer step stay in dygraph: Paddle builds the backward of the
compiled forward itself, and SOT breaks the graph at ``loss.backward()`` and inside
``optimizer.step()`` anyway (checked: a whole step under to_static gives ``[BreakGraph]`` there), so
compiling the whole step would compile nothing more while hiding GradScaler's host reads.

Two combinations are refused before training, in one line naming the keys:

- the CPU fp16/bf16 emulation (``amp.on_unsupported=emulate``, zoo/amp/emulation.py): it wraps
  Paddle ops in Python and tags tensors with attributes; under to_static (SOT and AST modes alike,
  Paddle 3.3.1) those wrappers are not what the graph records, and the run computes plain FP32
  while saying fp16 (checked: the losses equal the FP32 run's to the last bit);
- ``amp.guard.find_nonfinite_layer=true``: its forward hooks read every layer's output on the host.
"""
from __future__ import annotations

import paddle

# What trainer.compile=true puts under paddle.jit.to_static (recorded in summary.json).
COMPILED_SCOPE = "autocast + forward + loss (paddle.jit.to_static, SOT); backward and optimizer step eager"


class CompileUnsupportedError(ValueError):
    """``trainer.compile=true`` with a setting that cannot run compiled; the message names both keys."""


def check_compile(compile: bool, amp, device_name: str) -> None:
    """Refuse ``trainer.compile=true`` where it would silently change what the run computes.

    ``amp`` is the resolved Amp component (``amp.resolve(device)`` called).
    """
    if not compile:
        return
    if amp.emulated:
        raise CompileUnsupportedError(
            f"trainer.compile=true cannot run with amp={amp.name} on {device_name}: the run would use the "
            f"CPU {amp.requested} emulation (amp.on_unsupported=emulate), which does not survive "
            "paddle.jit.to_static (it would silently compute FP32); set trainer.compile=false, or "
            "amp=fp32 / amp.on_unsupported=fp32 to compile an FP32 run")
    if amp.guard.find_layer:
        raise CompileUnsupportedError(
            "trainer.compile=true cannot run with amp.guard.find_nonfinite_layer=true (its forward hooks "
            "read each layer's output on the host); set one of them to false")


def training_forward(task, model, amp, compile: bool):
    """``batch -> loss dict``: autocast + forward + loss, compiled with to_static if ``compile``."""

    def forward_losses(batch):
        with amp.autocast():
            return task.losses(model, batch)

    if not compile:
        return forward_losses
    # full_graph=False: SOT, which runs as Python what it cannot translate (a with-block) and
    # compiles the rest, instead of failing the run as the AST mode would.
    return paddle.jit.to_static(forward_losses, full_graph=False)
