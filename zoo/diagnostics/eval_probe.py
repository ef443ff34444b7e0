"""The doctor's look at evaluation: the eval-mode forward on validation images, as a run evaluates.

A run evaluates under the autocast it trains with (``zoo/engine/evaluate.py``), with the model in
eval mode: BatchNorm normalises with its running statistics instead of the batch's, on the
validation split's images at their evaluation size instead of training crops. Activations there can
exceed anything the training steps show (DB's bias-free ``head.binarize.conv1``, before its
BatchNorm, reached 3.4e5 on validation images against 8.0e3 on training crops), so the doctor
runs this forward too:

- :func:`val_batches`: the first ``n`` batches of the validation split, as evaluation batches them;
- :func:`probe_eval`: ``task.eval_stats`` (what evaluation calls) over batches in eval mode under a
  precision rule: an :class:`~zoo.amp.emulation.Emulation` with rounding off (FP32 values, each op
  tagged with the emulation's decision) or the emulated numerics (overflow to inf, as on a GPU).
  :class:`EvalWatch` records every low-precision op's magnitude and which images it took above
  the format's max; the model's outputs are checked image by image for inf/NaN.

Eval mode treats every image on its own, so a batch cut down to some of its images (:func:`subset`)
gives those images the same outputs: the emulated passes re-run only the images that matter.
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import paddle

from zoo.amp import emulation as emu
from zoo.data import EvalBatchSampler, build_loader
from zoo.diagnostics import conformance as conf
from zoo.diagnostics.probe import _OVER, LayerNames
from zoo.engine.run import build, seed_everything


@dataclass
class EvalOp:
    """One named op of the eval forward over all probed batches (low-precision calls measured)."""

    key: str
    op: str
    layer: str
    layer_type: str
    mode: str
    calls: int = 0
    low_calls: int = 0
    numel: int = 0              # entries of its low-precision outputs
    above: int = 0              # of them above the format's max (or non-finite)
    max_abs: float = 0.0        # largest finite magnitude
    own_overflows: int = 0      # calls that went above the max from inputs that had not (a cause)

    @property
    def low(self) -> bool:
        return self.low_calls * 2 > self.calls


class EvalWatch:
    """Records :class:`EvalOp` s of the forwards run inside :meth:`batch`, and per image of the batch
    whether an op took it above ``limit`` from clean inputs (:attr:`flags`)."""

    def __init__(self, model, emulation: emu.Emulation, limit: float):
        self.emulation, self.limit = emulation, limit
        self.records: dict[str, EvalOp] = {}
        self.flags = np.zeros(0, bool)
        self._names, self._seen = LayerNames(model), Counter()

    def _hook(self, name, fn, args, kwargs):
        out = fn(*args, **kwargs)
        floats = conf._float_out(out)
        if not floats:
            return out
        layer, kind = self._names.current
        base = f"{layer}:{name}"
        self._seen[base] += 1
        key = base if self._seen[base] == 1 else f"{base}#{self._seen[base] - 1}"
        rec = self.records.get(key) or self.records.setdefault(
            key, EvalOp(key, name, layer, kind, self.emulation.mode(name)))
        t = floats[0]
        rec.calls += 1
        if not emu.is_low(t):
            return out
        rec.low_calls += 1
        a = t.numpy()
        rec.numel += a.size
        top = max(float(a.max()), -float(a.min())) if a.size else 0.0   # nan when any entry is
        if top <= self.limit:   # the common case: two reductions, no temporaries
            rec.max_abs = max(rec.max_abs, top)
        else:
            a = np.abs(a)
            finite = np.isfinite(a)
            over = ~finite | (a > self.limit)
            rec.above += int(over.sum())
            rec.max_abs = max(rec.max_abs, float(a[finite].max()) if finite.any() else 0.0)
            setattr(t, _OVER, True)
            if not any(getattr(x, _OVER, False) for x in emu._float_tensors(args)):
                rec.own_overflows += 1
                n = self.flags.size
                if a.ndim and a.shape[0] == n:
                    self.flags |= over.reshape(n, -1).any(axis=1)
                else:   # no batch dimension: every image of the batch may have fed it
                    self.flags[:] = True
        return out

    @contextlib.contextmanager
    def batch(self, n: int):
        """Watch one batch of ``n`` images (its op calls numbered afresh)."""
        self._seen.clear()
        self.flags = np.zeros(n, bool)
        with self._names, conf.every_op(self._hook):
            yield


@dataclass
class EvalRun:
    """What one pass of the eval-mode forward saw: images in probe order."""

    records: dict = field(default_factory=dict)     # key -> EvalOp (empty when not watched)
    images: int = 0
    nonfinite: list = field(default_factory=list)   # images whose outputs are not all finite
    flagged: list = field(default_factory=list)     # images some low op took above the max (watched)
    seconds: float = 0.0


def val_batches(cfg, n: int | None) -> tuple[list, object]:
    """The first ``n`` (None: all) validation batches of ``model.eval_batch_size``, and the split."""
    seed_everything(cfg.seed)
    val_set = build(cfg.data.builder, "data").build("val", cfg.seed)
    sampler = EvalBatchSampler(len(val_set), int(cfg.model.eval_batch_size))
    loader = build_loader(val_set, sampler, 0)
    out = []
    try:
        for batch in loader:
            if n is not None and len(out) == n:
                break
            out.append(batch)
    finally:
        loader.close()   # its loading thread would go on filling a queue
    return out, val_set


def batch_size(batch) -> int:
    return int(batch["image"].shape[0])


def subset(batch, rows: list[int]):
    """``batch`` cut down to the images ``rows`` (every entry with a batch dimension)."""
    n, idx = batch_size(batch), np.asarray(rows, np.int64)
    out = {}
    for k, v in batch.items():
        if isinstance(v, paddle.Tensor) and v.ndim and v.shape[0] == n:
            out[k] = paddle.gather(v, paddle.to_tensor(idx))
        elif isinstance(v, np.ndarray) and v.ndim and v.shape[0] == n:
            out[k] = v[idx]
        elif isinstance(v, list) and len(v) == n:
            out[k] = [v[i] for i in rows]
        else:
            out[k] = v
    return out


def _finite_rows(outputs, n: int) -> np.ndarray:
    """Per image: True when every float output of it is finite (an output without a batch
    dimension counts for every image)."""
    ok, stack = np.ones(n, bool), [outputs]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif isinstance(o, paddle.Tensor) and o.dtype in (paddle.float32, paddle.float64):
            a = o.numpy()
            ok &= (np.isfinite(a.reshape(n, -1)).all(axis=1) if a.ndim and a.shape[0] == n
                   else np.full(n, bool(np.isfinite(a).all())))
    return ok


def probe_eval(model, task, batches, val_set, emulation: emu.Emulation, limit: float, watch: bool) -> EvalRun:
    """``task.eval_stats`` over ``batches`` with the model in eval mode, under ``paddle.no_grad`` and
    ``emulation``, as evaluation runs it; ``watch`` records the ops (:class:`EvalWatch`)."""
    run, seen, size = EvalRun(), [], [0]
    model.eval()
    t0 = time.time()
    emu.install()   # the emulation's op wrappers first, so the watcher's sit outside them
    watcher = EvalWatch(model, emulation, limit) if watch else None
    handle = model.register_forward_post_hook(
        lambda _layer, _inputs, outputs: seen.append(_finite_rows(outputs, size[0])))
    if hasattr(task, "begin_eval"):   # tasks collecting per-image results (COCO) need the split
        task.begin_eval(val_set)
    try:
        with paddle.no_grad():
            for batch in batches:
                size[0] = batch_size(batch)
                ctx = watcher.batch(size[0]) if watcher is not None else contextlib.nullcontext()
                with emulation(), ctx:
                    task.eval_stats(model, batch)
                if watcher is not None:
                    run.flagged += [run.images + int(i) for i in np.flatnonzero(watcher.flags)]
                run.images += size[0]
    finally:
        handle.remove()
    flags = np.concatenate(seen) if seen else np.zeros(0, bool)
    run.nonfinite = [int(i) for i in np.flatnonzero(~flags)]
    run.records = watcher.records if watcher is not None else {}
    run.seconds = time.time() - t0
    return run


def regroup(batches, images: list[int]) -> tuple[list, list[int]]:
    """The batches cut down to ``images`` (indices in probe order), and those indices in the new order."""
    out, order, start = [], [], 0
    wanted = sorted(set(images))
    for batch in batches:
        n = batch_size(batch)
        rows = [i - start for i in wanted if start <= i < start + n]
        if rows:
            out.append(batch if len(rows) == n else subset(batch, rows))
            order += [start + r for r in rows]
        start += n
    return out, order
