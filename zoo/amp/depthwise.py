"""Depthwise convolution with the low-precision accumulation of Paddle's own CUDA kernel.

cuDNN convolutions and cuBLAS matmuls accumulate fp16 products in fp32, so rounding their output
is all an emulation needs. ``depthwise_conv2d`` is different: on CUDA it is Paddle's hand-written
kernel (``paddle/phi/kernels/funcs/depthwise_conv.cu``; ``F.conv2d`` picks it with
``use_cudnn=False`` whenever ``groups == in_channels``), templated on the tensor type ``T``. With
fp16 tensors (O2: the filter is an fp16 parameter) every ``value += w * x`` is an fp16 multiply
and an fp16 add, each rounded. This module reproduces the kernels' orders for the NCHW layout:

- forward (``KernelDepthwiseConvCFilterNCHW`` / ``KernelDepthwiseConvNCHW``): per output pixel,
  the taps in row-major filter order, ``acc = rnd(acc + rnd(w * x))`` from ``acc = 0``;
- input gradient (``KernelDepthwiseConvInputGradCFilterNCHW``): per input pixel, the taps in
  *reversed* row-major order (the kernel walks output rows upwards with a flipped filter);
- filter gradient (``KernelDepthwiseConvFilterGradNCHW``): one block per filter element, threads
  ``(min(Wo, 512), min(max(512 // Wo, 1), Ho))``; each thread accumulates its strided share
  (``w = tx, tx + bdx, ...`` outer, batch middle, ``h = ty, ty + bdy, ...`` inner) in ``T``, then
  ``BlockReduceSum<T>``: a warp shuffle tree (cub's offsets 1, 2, 4, 8, 16, each add rounded) over
  thread ids ``tx + ty * bdx``, the warp sums reduced by the first warp the same way.

The arithmetic is done in NumPy float32, which holds every product of two fp16 (or bf16) values
exactly, followed by a rounding to the format, so each step rounds once as the hardware does.
Only ``groups == in_channels == out_channels`` with explicit padding is handled here; other cases
return None and the caller falls back to fp32 accumulation (and says so in its trace).
"""
from __future__ import annotations

import numpy as np
import paddle
from paddle.autograd import PyLayer

_EXP = np.uint32(0x7F800000)
FP16_MAX = 65504.0


def round_np(a: np.ndarray, dtype: str, overflow: bool = True) -> np.ndarray:
    """``a`` (float32) rounded to fp16 or bf16 (round to nearest even), returned as float32.

    fp16 uses the magic-number trick: adding ``m = 1.5 * 2**(e + 13)`` (``2**e <= |a|``, at least
    ``0.75`` so subnormals get the fixed quantum 2**-24) moves ``a`` to where float32's own
    spacing is fp16's, so the hardware's round-to-nearest-even does the work; ``(a + m) - m`` is
    exact afterwards. Equal to ``a.astype(float16).astype(float32)`` on every fp16 value, midpoint
    and neighbour (tests), except that -0 comes back as +0; 2-3x faster, which matters here.
    ``overflow=False`` skips the check for values beyond 65504 when the caller has bounded them.
    """
    a = np.asarray(a, dtype=np.float32)
    if dtype != "float16":
        bits = np.ascontiguousarray(a).view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
        return np.where(np.isnan(a), a, rounded.view(np.float32))
    with np.errstate(over="ignore", invalid="ignore"):
        m = (np.ascontiguousarray(a).view(np.uint32) & _EXP).view(np.float32)
        m *= np.float32(12288.0)
        np.maximum(m, np.float32(0.75), out=m)
        r = a + m
        r -= m
        if overflow and not np.abs(r).max(initial=0.0) <= FP16_MAX:  # also catches NaN
            r = np.where(np.abs(a) >= np.float32(65520.0), np.copysign(np.float32(np.inf), a), r)
            r = np.where(np.isnan(a), a, r)
    return r


def _ieee_nan():
    """``np.errstate`` for the kernels' arithmetic below, where NaN is an expected result.

    In an overflowing step (a loss scale too high for this batch: the case dynamic loss scaling
    exists for) gradients hold +inf and -inf, so ``inf + (-inf)`` and ``inf * 0`` (a padded zero)
    give NaN, as they do in fp16 on the GPU. The NaN is the emulated kernel's correct output: the
    scaler's finiteness check sees it, skips the step and lowers the scale. NumPy's "invalid value
    encountered" warning for it would only tell the user what the skip count already says.
    """
    return np.errstate(invalid="ignore")


def _fits(bound: float) -> bool:
    """True when no value of a computation bounded by ``bound`` can reach fp16's overflow."""
    return bound * 1.01 < FP16_MAX


def _block_size(width: int) -> int:
    """Threads per block along the output width (the launcher's rule in depthwise_conv.cu)."""
    if 1024 < width <= 2048:
        return (width - 1) // 2 + 1
    if 512 < width <= 1024:
        return width
    return 512


def _tree_sum(v: np.ndarray, dtype: str) -> np.ndarray:
    """Sum over the last axis (length 32) as a warp shuffle tree with a rounding after each add."""
    while v.shape[-1] > 1:
        with _ieee_nan():  # inf + -inf of an overflowing step: NaN, as on the GPU
            v = round_np(v[..., 0::2] + v[..., 1::2], dtype)
    return v[..., 0]


def _pad_to(v: np.ndarray, axis: int, multiple: int) -> np.ndarray:
    extra = (-v.shape[axis]) % multiple
    if not extra:
        return v
    widths = [(0, 0)] * v.ndim
    widths[axis] = (0, extra)
    return np.pad(v, widths)


class Geometry:
    """Stride, padding and dilation of one depthwise call, and the tap views they imply."""

    def __init__(self, x_shape, w_shape, stride, padding, dilation):
        self.n, self.c, self.h, self.w = x_shape
        self.kh, self.kw = w_shape[2], w_shape[3]
        self.sh, self.sw = stride
        self.pt, self.pb, self.pl, self.pr = padding
        self.dh, self.dw = dilation
        self.ho = (self.h + self.pt + self.pb - self.dh * (self.kh - 1) - 1) // self.sh + 1
        self.wo = (self.w + self.pl + self.pr - self.dw * (self.kw - 1) - 1) // self.sw + 1

    def taps(self):
        return [(i, j) for i in range(self.kh) for j in range(self.kw)]

    def view(self, padded: np.ndarray, i: int, j: int) -> tuple[slice, slice]:
        """Index of the padded input that tap (i, j) multiplies, one element per output pixel."""
        r0, c0 = i * self.dh, j * self.dw
        return (slice(r0, r0 + self.sh * (self.ho - 1) + 1, self.sh),
                slice(c0, c0 + self.sw * (self.wo - 1) + 1, self.sw))

    def pad(self, x: np.ndarray) -> np.ndarray:
        return np.pad(x, ((0, 0), (0, 0), (self.pt, self.pb), (self.pl, self.pr)))


def forward_np(x: np.ndarray, w: np.ndarray, g: Geometry, dtype: str) -> np.ndarray:
    xp = g.pad(x)
    check = not _fits(float(np.abs(w).sum(axis=(1, 2, 3)).max(initial=0.0)) * float(np.abs(x).max(initial=0.0)))
    acc = None
    for i, j in g.taps():
        rows, cols = g.view(xp, i, j)
        with _ieee_nan():  # inf * 0 and inf + -inf of an overflowing step: NaN, as on the GPU
            prod = round_np(xp[:, :, rows, cols] * w[None, :, 0, i, j, None, None], dtype, check)
            acc = prod if acc is None else round_np(acc + prod, dtype, check)  # 0 + p needs no rounding
    return acc


def input_grad_np(dy: np.ndarray, w: np.ndarray, g: Geometry, dtype: str) -> np.ndarray:
    gp = np.zeros((g.n, g.c, g.h + g.pt + g.pb, g.w + g.pl + g.pr), np.float32)
    check = not _fits(float(np.abs(w).sum(axis=(1, 2, 3)).max(initial=0.0)) * float(np.abs(dy).max(initial=0.0)))
    for i, j in reversed(g.taps()):
        rows, cols = g.view(gp, i, j)
        with _ieee_nan():  # inf * 0 and inf + -inf of an overflowing step: NaN, as on the GPU
            gp[:, :, rows, cols] = round_np(
                gp[:, :, rows, cols] + round_np(dy * w[None, :, 0, i, j, None, None], dtype, check), dtype, check)
    return gp[:, :, g.pt:g.pt + g.h, g.pl:g.pl + g.w]


def filter_grad_np(dy: np.ndarray, x: np.ndarray, g: Geometry, dtype: str) -> np.ndarray:
    bdx = min(g.wo, _block_size(g.wo))
    bdy = min(max(_block_size(g.wo) // g.wo, 1), g.ho)
    xp = g.pad(x)
    # products[c, tap, n, ho, wo], each rounded (fp16 multiply)
    check = not _fits(float(np.abs(dy).max(initial=0.0)) * float(np.abs(x).max(initial=0.0)))
    with _ieee_nan():  # inf * 0 (a padded zero) of an overflowing step: NaN, as on the GPU
        prods = np.stack([round_np(dy * xp[:, :, r, s], dtype, check).transpose(1, 0, 2, 3)
                          for r, s in (g.view(xp, i, j) for i, j in g.taps())], axis=1)
    prods = _pad_to(_pad_to(prods, 3, bdy), 4, bdx)
    c, k, n, hp, wp = prods.shape
    # [c, k, n, B, bdy, A, bdx] -> per thread (ty, tx) the sequence (A outer, n, B inner)
    seq = prods.reshape(c, k, n, hp // bdy, bdy, wp // bdx, bdx).transpose(0, 1, 5, 2, 3, 4, 6)
    seq = seq.reshape(c, k, -1, bdy * bdx)
    acc = np.zeros((c, k, bdy * bdx), np.float32)
    for step in range(seq.shape[2]):
        with _ieee_nan():  # inf + -inf of an overflowing step: NaN, as on the GPU
            acc = round_np(acc + seq[:, :, step], dtype)
    warps = _pad_to(acc, 2, 32).reshape(c, k, -1, 32)
    partial = _pad_to(_tree_sum(warps, dtype), 2, 32)
    return _tree_sum(partial, dtype).reshape(c, 1, g.kh, g.kw)


class _DepthwiseLowAccum(PyLayer):
    @staticmethod
    def forward(ctx, x, w, geometry, dtype):
        xn, wn = x.numpy(), w.numpy()
        ctx.geometry, ctx.dtype = geometry, dtype
        ctx.save_for_backward(x, w)
        return paddle.to_tensor(forward_np(xn, wn, geometry, dtype))

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensor()
        g, dtype = ctx.geometry, ctx.dtype
        dyn = round_np(dy.numpy(), dtype)  # the incoming gradient is low precision on a GPU
        dx = paddle.to_tensor(input_grad_np(dyn, w.numpy(), g, dtype))
        dw = paddle.to_tensor(filter_grad_np(dyn, x.numpy(), g, dtype))
        return dx, dw


def _explicit_padding(padding) -> tuple[int, int, int, int] | None:
    p = [int(v) for v in padding]
    if len(p) == 2:
        return p[0], p[0], p[1], p[1]
    if len(p) == 4:
        return tuple(p)
    return None


def depthwise_low_accum(args, dtype: str):
    """Emulated ``_C_ops.depthwise_conv2d(x, w, stride, padding, algo, groups, dilation, layout)``
    with low-precision accumulation, or None when the call is outside what this module handles."""
    if len(args) < 8:
        return None
    x, w, stride, padding, algo, groups, dilation, layout = args[:8]
    pad = _explicit_padding(padding) if algo in ("EXPLICIT", None) else None
    if layout != "NCHW" or pad is None or x.ndim != 4 or not (x.shape[1] == w.shape[0] == groups) \
            or w.shape[1] != 1:
        return None
    stride = [int(stride)] * 2 if isinstance(stride, int) else [int(v) for v in stride]
    dilation = [int(dilation)] * 2 if isinstance(dilation, int) else [int(v) for v in dilation]
    geometry = Geometry(x.shape, w.shape, stride, pad, dilation)
    return _DepthwiseLowAccum.apply(x, w, geometry, dtype)
