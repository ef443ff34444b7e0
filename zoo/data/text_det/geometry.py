"""DB train geometry: PaddleOCR's flip/rotate/resize (``IaaAugment``) and ``EastRandomCropData``.

:func:`iaa_augment` and :func:`east_random_crop` are the step-by-step versions
(``ppocr/data/imaug/iaa_augment.py``, ``ppocr/data/imaug/random_crop_data.py``);
:func:`augment_and_crop` makes the same draws, the same crop and the same
polygons with one ``cv2.warpAffine`` (see :mod:`zoo.data.text_det.transforms` for the
deliberate differences from upstream). :func:`plan_augment_and_crop` computes
that geometry from the image size alone, so a JPEG can be decoded reduced.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

__all__ = ["augment_and_crop", "crop_area", "east_random_crop", "iaa_augment", "map_scale",
           "plan_augment_and_crop", "warp_crop"]


def iaa_augment(img: np.ndarray, polys: np.ndarray, rng: np.random.Generator, flip_p: float = 0.5,
                rotate: Sequence[float] = (-10, 10), scale: Sequence[float] = (0.5, 3.0)):
    """Random horizontal flip, rotation about the centre (same canvas size,
    black fill, as imgaug/albumentations ``Affine``) and isotropic resize.

    All three draws are made every time, so the stream layout does not depend
    on the outcome.  Returns the new image and polygons.
    """
    flip = rng.random() < flip_p
    angle = rng.uniform(rotate[0], rotate[1])
    factor = rng.uniform(scale[0], scale[1])
    polys = np.array(polys, dtype=np.float64).reshape(-1, 4, 2)
    h, w = img.shape[:2]
    if flip:
        img = cv2.flip(img, 1)
        polys[..., 0] = (w - 1) - polys[..., 0]
    if angle != 0:
        m = cv2.getRotationMatrix2D(((w - 1) / 2, (h - 1) / 2), angle, 1.0)
        img = cv2.warpAffine(img, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                             borderValue=0)
        polys = polys @ m[:, :2].T + m[:, 2]
    new_w, new_h = max(1, int(w * factor)), max(1, int(h * factor))
    img = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    polys = (polys + 0.5) * (new_w / w, new_h / h) - 0.5
    return img, polys


def _free_runs(covered: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Indices where ``covered`` is 0 and their maximal consecutive runs."""
    free = np.flatnonzero(covered == 0)
    if len(free) == 0:
        return free, []
    breaks = np.flatnonzero(np.diff(free) != 1) + 1
    return free, np.split(free, breaks)


def _select(free: np.ndarray, runs: list[np.ndarray], size: int, rng: np.random.Generator):
    """Two crop edges: from two random runs if there are several (so text between
    runs can be kept whole), else two random free positions."""
    if len(runs) > 1:
        picks = [int(rng.choice(runs[int(i)])) for i in rng.integers(0, len(runs), size=2)]
    else:
        picks = [int(v) for v in rng.choice(free, size=2)]
    lo, hi = min(picks), max(picks)
    return min(max(lo, 0), size - 1), min(max(hi, 0), size - 1)


def _outside(poly: np.ndarray, x: float, y: float, w: float, h: float) -> bool:
    """Whether ``poly``'s bounding box misses the rectangle (upstream's test)."""
    return bool(poly[:, 0].max() < x or poly[:, 0].min() > x + w
                or poly[:, 1].max() < y or poly[:, 1].min() > y + h)


def crop_area(h: int, w: int, care_polys, rng: np.random.Generator, min_crop_side_ratio: float = 0.1,
              max_tries: int = 50) -> tuple[int, int, int, int]:
    """Choose ``(x, y, crop_w, crop_h)``, as upstream's ``crop_area``.

    Crop edges are picked in rows/columns that no care text spans, so no text is
    cut; a crop must have sides >= ``min_crop_side_ratio`` of the image and touch
    at least one text box.  Falls back to the whole image after ``max_tries``
    (and always when there is no care text).
    """
    h_cov, w_cov = np.zeros(h, np.int8), np.zeros(w, np.int8)
    for poly in care_polys:
        pts = np.round(poly).astype(np.int64)
        x0, x1 = np.clip([pts[:, 0].min(), pts[:, 0].max()], 0, w)
        y0, y1 = np.clip([pts[:, 1].min(), pts[:, 1].max()], 0, h)
        w_cov[x0:x1] = 1
        h_cov[y0:y1] = 1
    w_free, w_runs = _free_runs(w_cov)
    h_free, h_runs = _free_runs(h_cov)
    if len(w_free) == 0 or len(h_free) == 0:
        return 0, 0, w, h
    for _ in range(max_tries):
        xmin, xmax = _select(w_free, w_runs, w, rng)
        ymin, ymax = _select(h_free, h_runs, h, rng)
        if xmax - xmin < min_crop_side_ratio * w or ymax - ymin < min_crop_side_ratio * h:
            continue
        if any(not _outside(p, xmin, ymin, xmax - xmin, ymax - ymin) for p in care_polys):
            return xmin, ymin, xmax - xmin, ymax - ymin
    return 0, 0, w, h


def east_random_crop(img: np.ndarray, polys: np.ndarray, ignore: np.ndarray, rng: np.random.Generator,
                     size: int = 640, max_tries: int = 50, min_crop_side_ratio: float = 0.1):
    """``EastRandomCropData`` with ``keep_ratio`` True: crop (see :func:`crop_area`),
    scale to fit ``size`` x ``size`` keeping the aspect ratio, pad bottom/right
    with zeros.  Polygons whose box misses the scaled crop are dropped, the rest
    kept unclipped with their ignore flags.
    """
    polys = np.asarray(polys, dtype=np.float64).reshape(-1, 4, 2)
    ignore = np.asarray(ignore, dtype=bool).reshape(-1)
    care = [p for p, ign in zip(polys, ignore) if not ign]
    x, y, cw, ch = crop_area(img.shape[0], img.shape[1], care, rng, min_crop_side_ratio, max_tries)
    scale = min(size / cw, size / ch)
    w, h = max(1, int(cw * scale)), max(1, int(ch * scale))
    out = np.zeros((size, size) + img.shape[2:], img.dtype)
    out[:h, :w] = cv2.resize(img[y:y + ch, x:x + cw], (w, h), interpolation=cv2.INTER_LINEAR)
    polys = (polys - (x, y) + 0.5) * (w / cw, h / ch) - 0.5
    keep = np.array([not _outside(p, 0, 0, w, h) for p in polys], dtype=bool)
    return out, polys[keep].reshape(-1, 4, 2), ignore[keep]


def _augment_polys(polys: np.ndarray, h: int, w: int, flip: bool, angle: float, factor: float):
    """Polygons and the 3x3 matrix of :func:`iaa_augment`'s flip, rotation and resize, with the
    same float operations as there (so the crop search sees bit-identical polygons)."""
    polys = np.array(polys, dtype=np.float64).reshape(-1, 4, 2)
    m_all = np.eye(3)
    if flip:
        polys[..., 0] = (w - 1) - polys[..., 0]
        m_all = np.array([[-1.0, 0, w - 1], [0, 1, 0], [0, 0, 1]])
    if angle != 0:
        m = cv2.getRotationMatrix2D(((w - 1) / 2, (h - 1) / 2), angle, 1.0)
        polys = polys @ m[:, :2].T + m[:, 2]
        m_all = np.vstack([m, [0, 0, 1]]) @ m_all
    new_w, new_h = max(1, int(w * factor)), max(1, int(h * factor))
    sx, sy = new_w / w, new_h / h
    polys = (polys + 0.5) * (sx, sy) - 0.5
    m_all = np.array([[sx, 0, 0.5 * sx - 0.5], [0, sy, 0.5 * sy - 0.5], [0, 0, 1]]) @ m_all
    return polys, m_all, new_h, new_w


def plan_augment_and_crop(h: int, w: int, polys: np.ndarray, ignore: np.ndarray, rng: np.random.Generator,
                          size: int = 640, flip_p: float = 0.5, rotate: Sequence[float] = (-10, 10),
                          scale: Sequence[float] = (0.5, 3.0), max_tries: int = 50,
                          min_crop_side_ratio: float = 0.1):
    """The geometry of :func:`augment_and_crop` for an ``h`` x ``w`` image, without its pixels.

    Returns ``(m, fw, fh, polys, ignore)``: the 3x3 map from source pixels to the ``size`` crop,
    the fitted crop's width and height, and the kept polygons and flags.
    """
    flip = rng.random() < flip_p
    angle = rng.uniform(rotate[0], rotate[1])
    factor = rng.uniform(scale[0], scale[1])
    polys, m_aug, ah, aw = _augment_polys(polys, h, w, flip, angle, factor)
    ignore = np.asarray(ignore, dtype=bool).reshape(-1)
    care = [p for p, ign in zip(polys, ignore) if not ign]
    x, y, cw, ch = crop_area(ah, aw, care, rng, min_crop_side_ratio, max_tries)
    fit = min(size / cw, size / ch)
    fw, fh = max(1, int(cw * fit)), max(1, int(ch * fit))
    sx, sy = fw / cw, fh / ch
    polys = (polys - (x, y) + 0.5) * (sx, sy) - 0.5
    keep = np.array([not _outside(p, 0, 0, fw, fh) for p in polys], dtype=bool)
    crop = np.array([[sx, 0, (0.5 - x) * sx - 0.5], [0, sy, (0.5 - y) * sy - 0.5], [0, 0, 1]])
    return crop @ m_aug, fw, fh, polys[keep].reshape(-1, 4, 2), ignore[keep]


def warp_crop(img: np.ndarray, m: np.ndarray, fw: int, fh: int, size: int) -> np.ndarray:
    """The ``size`` x ``size`` crop: ``img`` warped by ``m`` into its top-left ``fw`` x ``fh``, zeros elsewhere."""
    out = np.zeros((size, size) + img.shape[2:], img.dtype)
    out[:fh, :fw] = cv2.warpAffine(img, m[:2], (fw, fh), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                                   borderValue=0)
    return out


def augment_and_crop(img: np.ndarray, polys: np.ndarray, ignore: np.ndarray, rng: np.random.Generator,
                     size: int = 640, flip_p: float = 0.5, rotate: Sequence[float] = (-10, 10),
                     scale: Sequence[float] = (0.5, 3.0), max_tries: int = 50, min_crop_side_ratio: float = 0.1,
                     clock=None):
    """:func:`iaa_augment` then :func:`east_random_crop` as one ``cv2.warpAffine``.

    The same draws from ``rng`` in the same order, the same crop search on the same (bit-identical)
    polygons and the same kept polygons and ignore flags; only the image differs: it is sampled
    once (bilinear) straight from the source by the composed flip, rotation, resize, crop-shift and
    fit-resize, instead of being interpolated three times at full size. So it is slightly sharper
    (no repeated bilinear blur) and pixels at the crop's edge interpolate with their true
    neighbours instead of a replicated edge. The padding right/bottom of the fitted crop is zero,
    as upstream. ``clock(stage)`` marks "augment" (draws, polygon maps, crop search) and "crop"
    (the warp).
    """
    m, fw, fh, polys, ignore = plan_augment_and_crop(img.shape[0], img.shape[1], polys, ignore, rng, size, flip_p,
                                                     rotate, scale, max_tries, min_crop_side_ratio)
    if clock:
        clock("augment")
    out = warp_crop(img, m, fw, fh, size)
    if clock:
        clock("crop")
    return out, polys, ignore


def map_scale(m: np.ndarray) -> float:
    """The largest factor by which the 2x2 part of ``m`` stretches a length."""
    return float(np.linalg.svd(np.asarray(m)[:2, :2], compute_uv=False)[0])
