"""Non-finite values in an evaluation: how many images met inf or NaN, and which layer made them.

A low-precision evaluation can overflow where training did not (DB's ``head.binarize.conv1`` reaches
3.4e5 before its BatchNorm on the validation images of a 250-step fp16 run: inf, then NaN through the
norm, on 28 of 100 images). A metric computed on such values looks like a small accuracy loss and
says nothing. :class:`NonFiniteWatch` makes it visible. A forward post-hook on every layer (leaves,
and containers, whose own forward may compute: FPN additions, DB's step function) flags, per image,
an output tensor holding inf or NaN; the flags of one forward are read in one transfer at its end.
Looking only at the model's outputs would miss most of it: ReLU maps NaN to 0 in Paddle's kernels,
so a NaN in the head can leave finite (and wrong) maps behind.

Per image it records whether any layer output held a non-finite value, which layer did first (in
the order layers finish: a child before its container), and whether the model's outputs still hold
one. What runs inside a layer between its sublayers (an ``exp`` whose inf becomes 0 in ``1/(1+inf)``)
is seen only through the layer's output. :meth:`NonFiniteWatch.result` is plain JSON: images seen,
images that met a non-finite value (``nonfinite_images``), those whose outputs hold one
(``nonfinite_output_images``), their sample indices (the first 20), and per first layer the number
of images.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np
import paddle

_FLOATS = (paddle.float32, paddle.float16, paddle.bfloat16, paddle.float64)
MAX_LISTED = 20


def _tensors(out):
    if isinstance(out, paddle.Tensor):
        yield out
    elif isinstance(out, Mapping):
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors(v)


def bad_per_image(out, n: int) -> np.ndarray | None:
    """Bool [n]: image i has an inf or NaN in some floating output tensor of leading size n; None
    when no output has that leading size (nothing per image to judge)."""
    bad, seen = np.zeros(n, dtype=bool), False
    for t in _tensors(out):
        if t.dtype not in _FLOATS or t.ndim == 0 or t.shape[0] != n:
            continue
        seen = True
        finite = paddle.isfinite(t).reshape([n, -1]).all(axis=1)
        bad |= ~finite.numpy().astype(bool)
    return bad if seen else None


def describe(result: dict | None) -> str | None:
    """``28 of 100 images met non-finite values (first at head.binarize.conv1 (Conv2D) in 28; in 20
    they reach the outputs)``, or None when there were none."""
    if not result or not result.get("nonfinite_images"):
        return None
    firsts = result.get("first_layers") or {}
    where = []
    if firsts:
        name, count = max(firsts.items(), key=lambda kv: kv[1])
        where.append(f"first at {name} in {count}" + (f", {len(firsts) - 1} other layers" if len(firsts) > 1 else ""))
    if "nonfinite_output_images" in result:
        where.append(f"in {result['nonfinite_output_images']} they reach the outputs")
    detail = f" ({'; '.join(where)})" if where else ""
    return f"{result['nonfinite_images']} of {result['images']} images met non-finite values{detail}"


class NonFiniteWatch:
    """``with NonFiniteWatch(model) as watch:`` counts the images whose forward met inf or NaN.

    Call :meth:`begin_batch` with the batch's sample indices before each forward (optional: without
    it images are numbered in the order seen). ``layers=False`` watches the model's outputs only:
    for an FP32 evaluation, where the per-layer checks cost about a fifth of the time (db_det,
    MODEL_CARDS.md "Evaluation under AMP") and an inf/NaN is rare; a low-precision evaluation pays
    about 1 % for them.
    """

    def __init__(self, model: paddle.nn.Layer, layers: bool = True):
        self.model, self.layers = model, bool(layers)
        self.images = 0
        self.bad: list[int] = []
        self.bad_outputs = 0
        self.first_layers: Counter = Counter()
        self._indices: list[int] | None = None
        self._handles: list = []
        self._names: list[str] = []
        self._flags: list = []   # (layer index, bool tensor [n]) of the forward under way
        self._n: int | None = None

    def __enter__(self):
        root = self.model
        self._handles.append(root.register_forward_pre_hook(self._before_forward))
        for name, layer in (root.named_sublayers() if self.layers else ()):
            self._names.append(f"{name} ({type(layer).__name__})")
            self._handles.append(layer.register_forward_post_hook(self._flagger(len(self._names) - 1)))
        self._names.append(f"model ({type(root).__name__})")
        self._handles.append(root.register_forward_post_hook(self._after_forward))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles, self._names = [], []
        return False

    def begin_batch(self, indices) -> None:
        self._indices = [int(i) for i in indices]

    def _before_forward(self, _layer, inputs):
        x = inputs[0] if isinstance(inputs, (list, tuple)) and inputs else inputs
        self._n = int(x.shape[0]) if isinstance(x, paddle.Tensor) and x.ndim > 0 else 1
        self._flags = []
        return None

    def _flagger(self, index: int):
        def hook(_layer, _inputs, output):
            if self._n is not None:
                flags = _flags_per_image(output, self._n)
                if flags is not None:
                    self._flags.append((index, flags))
            return None
        return hook

    def _after_forward(self, _layer, _inputs, output):
        n = self._n
        if n is None:
            return None
        at_output = _flags_per_image(output, n)
        rows = self._flags + ([(len(self._names) - 1, at_output)] if at_output is not None else [])
        indices = self._indices if self._indices is not None and len(self._indices) == n else \
            list(range(self.images, self.images + n))
        self._indices, self._n, self._flags = None, None, []
        self.images += n
        if not rows:
            return None
        table = paddle.stack([f for _, f in rows]).numpy().astype(bool)  # [layers, n]: one transfer
        for i in np.flatnonzero(table.any(axis=0)):
            self.bad.append(indices[i])
            self.first_layers[self._names[rows[int(np.argmax(table[:, i]))][0]]] += 1
            self.bad_outputs += int(at_output is not None and table[-1, i])
        return None

    def result(self) -> dict:
        """JSON-ready counts (see the module docstring)."""
        return {"images": self.images, "watched": "layers" if self.layers else "outputs",
                "nonfinite_images": len(self.bad),
                "nonfinite_output_images": self.bad_outputs, "image_indices": sorted(self.bad)[:MAX_LISTED],
                "first_layers": dict(self.first_layers.most_common())}


def _flags_per_image(out, n: int):
    """Bool tensor [n] (not yet transferred): image i has inf or NaN in a floating output tensor of
    leading size n; None when no output has that leading size."""
    flags = None
    for t in _tensors(out):
        if t.dtype not in _FLOATS or t.ndim == 0 or t.shape[0] != n:
            continue
        bad = paddle.logical_not(paddle.isfinite(t).reshape([n, -1]).all(axis=1))
        flags = bad if flags is None else paddle.logical_or(flags, bad)
    return flags


def merge(parts: list[dict]) -> dict:
    """One result from several (ranks of a distributed evaluation)."""
    firsts: Counter = Counter()
    for p in parts:
        firsts.update(p.get("first_layers") or {})
    bad = sorted(i for p in parts for i in p.get("image_indices", []))
    return {"images": sum(p["images"] for p in parts), "watched": parts[0].get("watched") if parts else None,
            "nonfinite_images": sum(p["nonfinite_images"] for p in parts),
            "nonfinite_output_images": sum(p.get("nonfinite_output_images", 0) for p in parts),
            "image_indices": bad[:MAX_LISTED], "first_layers": dict(firsts.most_common())}
