"""Normalisation running statistics across a step the loss scaler may skip.

A train-mode forward updates every BatchNorm's ``_mean`` and ``_variance`` before the loss is known.
When that forward overflows in fp16, the loss scaler skips the optimizer step, but the statistics
the forward already wrote stay: Paddle's GradScaler (GPU) does not undo them, and neither did the
zoo's emulation. Training never notices, because train mode normalises with batch statistics; the
evaluation does, because it uses the running ones. The PP-OCRv4 mobile det's fp16 O1 parity run
(seed 3, issue 36) trained to loss 1.59 and evaluated to hmean 0.0, with non-finite statistics in
``head.binarize.conv_bn1`` and ``head.thresh.conv_bn1`` left by one skipped step.

:class:`RunningStats` keeps a copy of the statistics before each step and puts it back

- after a skipped step (the step is dropped whole, statistics included), and
- after a step that moved the parameters but left a statistic non-finite (an op such as DBHead's
  ``fix_nan`` can hide the overflow from the gradients),

and says which layers held non-finite values, for the numerics guard to report. It acts the same on
every device: the copy is taken by the trainer, not by the scaler. ``amp.guard.restore_running_stats``
switches it off (Paddle's own behaviour), for comparison only.
"""
from __future__ import annotations

import paddle

STATS = ("_mean", "_variance")  # Paddle's BatchNorm*/SyncBatchNorm/nn.BatchNorm running statistics


def stat_layers(model) -> list[tuple[str, object]]:
    """(structured name, layer) of every sublayer holding running statistics, in model order."""
    found = []
    for name, layer in model.named_sublayers(include_self=True):
        if all(isinstance(getattr(layer, s, None), paddle.Tensor) for s in STATS):
            found.append((name, layer))
    return found


def _nonfinite(layers: list[tuple[str, object]]) -> list[str]:
    """Names among ``layers`` whose running mean or variance holds inf or NaN (one device-to-host read)."""
    if not layers:
        return []
    with paddle.no_grad():
        flags = paddle.stack([paddle.isfinite(getattr(layer, s)).all() for _, layer in layers for s in STATS])
    flags = flags.numpy()
    return [name for i, (name, _) in enumerate(layers) if not flags[2 * i:2 * i + 2].all()]


def nonfinite_stats(model) -> list[str]:
    """Names of the layers of ``model`` whose running mean or variance holds inf or NaN."""
    return _nonfinite(stat_layers(model))


class RunningStats:
    """Copy before a step, restore after it when it was skipped or left a statistic non-finite."""

    def __init__(self, model, restore: bool = True):
        self.layers = stat_layers(model)
        self.restore = restore  # False: only report (amp.guard.restore_running_stats=false)
        self._saved: list[paddle.Tensor] | None = None
        self.restores = 0            # steps that left statistics non-finite (restored unless restore is off)
        self.layers_seen: list[str] = []  # every layer named by such a restore, first occurrence first
        self._kept_bad: set[str] = set()  # restore off: layers already non-finite before this step

    @property
    def tensors(self) -> list[paddle.Tensor]:
        return [getattr(layer, s) for _, layer in self.layers for s in STATS]

    def snapshot(self) -> None:
        if not self.restore:
            self._saved = []
            return
        with paddle.no_grad():
            self._saved = [t.clone() for t in self.tensors]

    def after_step(self, stepped: bool) -> list[str]:
        """Restore the copy when the step was skipped or a statistic went non-finite (unless
        ``restore`` is off).

        Returns the layers whose statistics this step left non-finite (empty when none were, also
        after a skipped step whose forward left them finite: those are restored too, and not
        reported). With ``restore`` off, a layer still non-finite from an earlier step is not named again.
        """
        if self._saved is None:
            raise RuntimeError("RunningStats.after_step without snapshot() before the step")
        bad = _nonfinite(self.layers)
        if not self.restore:
            bad, self._kept_bad = [n for n in bad if n not in self._kept_bad], set(bad)
        if self.restore and (bad or not stepped):
            with paddle.no_grad():
                for t, saved in zip(self.tensors, self._saved):
                    paddle.assign(saved, output=t)
        if bad:
            self.restores += 1
            self.layers_seen += [n for n in bad if n not in self.layers_seen]
        self._saved = None
        return bad

    def summary(self) -> dict | None:
        """For summary.json and checkpoints: None when no statistic ever went non-finite."""
        if not self.restores:
            return None
        return {"steps": self.restores, "layers": list(self.layers_seen), "restored": self.restore}

    def load(self, saved: dict) -> None:
        """Continue the counts of a resumed run (what :meth:`summary` wrote into its checkpoint)."""
        self.restores = int(saved["steps"])
        self.layers_seen = list(saved["layers"])
