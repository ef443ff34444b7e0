"""Non-finite outputs of an evaluation: how many images had inf or NaN, and which layer made them.

A low-precision evaluation can overflow where training did not (DB's ``head.binarize.conv1`` reaches
3.4e5 before its BatchNorm on the validation images of a 250-step fp16 run: inf, then NaN through the
norm, on 28 of 100 images). A metric computed on such outputs looks like a small accuracy loss and
says nothing. :class:`NonFiniteWatch` makes it visible:

- a forward post-hook on the model checks every floating output tensor whose first dimension is the
  batch (DB's maps, PP-YOLOE's boxes and scores, a classifier's logits) and marks each image with any
  inf or NaN; that costs one ``isfinite`` per output tensor;
- only for a batch with a marked image is the forward run once more, with a post-hook on every
  sublayer: the first hook to see a non-finite value for an image names the layer that produced it
  (a leaf layer, or a container whose own forward computed it: containers finish after their
  children). The re-run happens inside the same autocast or emulation, so it computes the same values.

The result (:meth:`NonFiniteWatch.result`) is plain JSON: images seen, images with non-finite
outputs, their sample indices (the first 20), and per first layer the number of images.
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
    """``28 of 100 images had non-finite outputs (first at head.binarize.conv1 (Conv2D) in 28)``,
    or None when there were none."""
    if not result or not result.get("nonfinite_images"):
        return None
    firsts = result.get("first_layers") or {}
    where = ""
    if firsts:
        name, count = max(firsts.items(), key=lambda kv: kv[1])
        where = f"; first at {name} in {count}" + (f", {len(firsts) - 1} other layers" if len(firsts) > 1 else "")
    return f"{result['nonfinite_images']} of {result['images']} images had non-finite outputs{where}"


class NonFiniteWatch:
    """``with NonFiniteWatch(model) as watch:`` counts the images whose outputs hold inf or NaN.

    Call :meth:`begin_batch` with the batch's sample indices before each forward (optional: without
    it images are numbered in the order seen). ``locate=False`` skips finding the first layer.
    """

    def __init__(self, model: paddle.nn.Layer, locate: bool = True):
        self.model, self.locate = model, bool(locate)
        self.images = 0
        self.bad: list[int] = []
        self.first_layers: Counter = Counter()
        self._indices: list[int] | None = None
        self._handles: list = []
        self._rerun = False

    def __enter__(self):
        self._handles = [self.model.register_forward_post_hook(self._after_forward)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False

    def begin_batch(self, indices) -> None:
        self._indices = [int(i) for i in indices]

    def _after_forward(self, layer, inputs, output):
        if self._rerun:
            return None
        x = inputs[0] if isinstance(inputs, (list, tuple)) and inputs else inputs
        n = int(x.shape[0]) if isinstance(x, paddle.Tensor) and x.ndim > 0 else 1
        bad = bad_per_image(output, n)
        indices = self._indices if self._indices is not None and len(self._indices) == n else \
            list(range(self.images, self.images + n))
        self._indices = None
        self.images += n
        if bad is None or not bad.any():
            return None
        self.bad.extend(i for i, b in zip(indices, bad) if b)
        if self.locate:
            for name in self._first_layers(layer, inputs, n, bad):
                self.first_layers[name] += 1
        return None

    def _first_layers(self, root, inputs, n: int, bad: np.ndarray) -> list[str]:
        """Run the forward again with a hook on every sublayer; the first layer (in the order layers
        finish) with a non-finite value for each bad image. Images never caught are ``unknown``."""
        first: dict[int, str] = {}

        def hook_for(name, sub):
            def hook(_layer, _inputs, out):
                flags = bad_per_image(out, n)
                if flags is None:
                    return None
                for i in np.flatnonzero(flags & bad):
                    first.setdefault(int(i), f"{name or 'model'} ({type(sub).__name__})")
                return None
            return hook

        handles = [sub.register_forward_post_hook(hook_for(name, sub))
                   for name, sub in root.named_sublayers(include_self=True)]
        self._rerun = True
        try:
            args = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
            root(*args)
        finally:
            self._rerun = False
            for h in handles:
                h.remove()
        return [first.get(int(i), "unknown") for i in np.flatnonzero(bad)]

    def result(self) -> dict:
        """JSON-ready counts (see the module docstring)."""
        return {"images": self.images, "nonfinite_images": len(self.bad),
                "image_indices": sorted(self.bad)[:MAX_LISTED],
                "first_layers": dict(self.first_layers.most_common())}


def merge(parts: list[dict]) -> dict:
    """One result from several (ranks of a distributed evaluation)."""
    firsts: Counter = Counter()
    for p in parts:
        firsts.update(p.get("first_layers") or {})
    bad = sorted(i for p in parts for i in p.get("image_indices", []))
    return {"images": sum(p["images"] for p in parts),
            "nonfinite_images": sum(p["nonfinite_images"] for p in parts),
            "image_indices": bad[:MAX_LISTED], "first_layers": dict(firsts.most_common())}
