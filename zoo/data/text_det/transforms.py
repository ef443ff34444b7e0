"""Deterministic DB text-detection transforms (train augmentation, crop, eval resize).

Mirrors PaddleOCR's ``det_mv3_db.yml`` pipelines, with every random draw taken
from an explicit ``numpy.random.Generator``:

* train: ``IaaAugment`` (``ppocr/data/imaug/iaa_augment.py``: Fliplr p 0.5,
  Affine rotate [-10, 10], Resize [0.5, 3]) -> ``EastRandomCropData``
  (``ppocr/data/imaug/random_crop_data.py``) -> ``MakeBorderMap`` ->
  ``MakeShrinkMap`` -> ``NormalizeImage`` + ``ToCHWImage``;
* eval: ``DetResizeForTest`` (``ppocr/data/imaug/operators.py``) -> normalise + CHW, either with
  ``image_shape`` and ``keep_ratio`` False (a fixed size; det_mv3_db's 736x1280) or, given
  ``limit_side_len``, its limit-side modes (``max`` / ``min`` / ``resize_long``, each side rounded to a
  multiple of 32; PP-OCRv5 evaluates at 736 / min), which give each image its own size.

Deliberate differences from upstream, all about correctness:

* point coordinates follow the pixel-centre convention of ``cv2.resize`` /
  ``cv2.warpAffine`` / ``cv2.fillPoly`` (flip ``x -> w-1-x``, resize
  ``x -> (x+0.5)s-0.5``), so polygons stay on their text to the sub-pixel;
* the crop search includes the last text-free run of rows/columns (upstream's
  ``split_regions`` drops it, so crops never reach past the last text), and
  clips text extents to the image before marking them (upstream's slices wrap
  around for negative coordinates after rotation);
* ``rng.choice`` replaces ``int(np.random.choice(..., size=1))``, which raises
  on numpy >= 2.4;
* by default (``geometry="one_warp"``, :func:`augment_and_crop`) flip, rotation,
  resize and the crop are one ``cv2.warpAffine`` into the crop: the same draws,
  crop and polygons (bit-identical), the image sampled once instead of three
  times (a little sharper; ``geometry="sequential"`` keeps upstream's order);
* ``DetTrainTransform.decode_and_apply`` plans that geometry from a JPEG's header
  and decodes it reduced (1/2, 1/4, 1/8) when the map shrinks that much.

The geometry functions live in :mod:`zoo.data.text_det.geometry` (re-exported here).
Images are HWC uint8 in the dataset's channel order (BGR by default, as PaddleOCR's
``DecodeImage``; no transform depends on it); polygons ``[K,4,2]`` float (x, y) pixels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import cv2
import numpy as np

from zoo.data.images import decode_image, image_size
from zoo.data.text_det.copy_paste import CopyPaste
from zoo.data.text_det.geometry import (
    augment_and_crop,
    crop_area,
    east_random_crop,
    iaa_augment,
    map_scale,
    plan_augment_and_crop,
    warp_crop,
)
from zoo.data.text_det.labels import make_border_map, make_shrink_map
from zoo.data.transforms import chw_uint8, normalize_chw

__all__ = ["LIMIT_TYPES", "DetEvalTransform", "DetTrainTransform", "augment_and_crop", "crop_area",
           "east_random_crop", "iaa_augment", "limit_side_shape", "pad_eval_batch"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NORMALIZE_ON = ("host", "device")
LIMIT_TYPES = ("max", "min", "resize_long")


def limit_side_shape(h: int, w: int, limit_side_len: int, limit_type: str,
                     max_side_limit: int | None = None) -> tuple[int, int]:
    """``(H, W)`` of DetResizeForTest's limit-side resize of an ``h`` x ``w`` image (upstream's
    ``resize_image_type0``): the scale makes the longer side ``limit_side_len`` when it is longer
    (``max``: only shrinks), the shorter side ``limit_side_len`` when it is shorter (``min``: only
    grows), or the longer side equal to it (``resize_long``); each side is truncated to an int, then
    rounded to the nearest multiple of 32, at least 32. PaddleX's predictor also caps the longer side
    at ``max_side_limit`` (4000) before rounding; PaddleOCR's training-side evaluation does not (None)."""
    if limit_type == "max":
        ratio = limit_side_len / max(h, w) if max(h, w) > limit_side_len else 1.0
    elif limit_type == "min":
        ratio = limit_side_len / min(h, w) if min(h, w) < limit_side_len else 1.0
    elif limit_type == "resize_long":
        ratio = limit_side_len / max(h, w)
    else:
        raise ValueError(f"limit_type: expected one of {', '.join(LIMIT_TYPES)}, got {limit_type!r}")
    rh, rw = int(h * ratio), int(w * ratio)
    if max_side_limit is not None and max(rh, rw) > max_side_limit:
        cap = max_side_limit / max(rh, rw)
        rh, rw = int(rh * cap), int(rw * cap)
    return max(int(round(rh / 32) * 32), 32), max(int(round(rw / 32) * 32), 32)
GEOMETRIES = ("one_warp", "sequential")  # see augment_and_crop
REDUCED_FLAGS = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
                 8: cv2.IMREAD_REDUCED_COLOR_8}
REDUCE_TOLERANCE = 0.02  # a reduced decode may be enlarged by up to 2 % by the warp


def _check_normalize_on(value: str) -> str:
    if value not in NORMALIZE_ON:
        raise ValueError(f"data.builder.normalize_on: expected host or device, got {value!r}")
    return value


def _no_clock(stage: str) -> None:
    pass


def _finish(img: np.ndarray, t) -> np.ndarray:
    """CHW float32 normalised on the host, or CHW uint8 left for the device (``t``: a transform)."""
    return normalize_chw(img, t.mean, t.std) if t.normalize_on == "host" else chw_uint8(img)


class DetTrainTransform:
    """Train pipeline ``(img, polys, ignore, rng) -> item dict``.

    Item: ``image`` float32 [3,S,S] normalised (uint8 with ``normalize_on="device"``), and float32 [S,S]
    ``shrink_map``, ``shrink_mask``, ``threshold_map``, ``threshold_mask``.

    ``copy_paste``: null (off, det_mv3_db) or the settings of
    :class:`~zoo.data.text_det.copy_paste.CopyPaste` (``{objects_paste_ratio: 0.2, limit_paste: true}``,
    PP-OCRv4/v5 det): instances of a donor image the dataset passes in are pasted first.
    """

    def __init__(self, crop_size: int = 640, flip_p: float = 0.5, rotate=(-10, 10), scale=(0.5, 3.0),
                 max_tries: int = 50, min_crop_side_ratio: float = 0.1, shrink_ratio: float = 0.4,
                 min_text_size: float = 8, thresh_min: float = 0.3, thresh_max: float = 0.7,
                 mean=MEAN, std=STD, normalize_on: str = "host", geometry: str = "one_warp",
                 reduced_decode: bool = True, copy_paste=None):
        self.normalize_on = _check_normalize_on(normalize_on)
        if copy_paste is not None and not isinstance(copy_paste, Mapping):
            raise ValueError(f"data.builder.copy_paste: expected null or a mapping such as "
                             f"{{objects_paste_ratio: 0.2, limit_paste: true}}, got {copy_paste!r}")
        try:
            self.copy_paste = None if copy_paste is None else CopyPaste(**dict(copy_paste))
        except TypeError as e:
            raise ValueError(f"data.builder.copy_paste: {e}") from None
        self.reduced_decode = bool(reduced_decode)
        if geometry not in GEOMETRIES:
            raise ValueError(f"data.builder.geometry: expected one of {GEOMETRIES}, got {geometry!r}")
        self.geometry = geometry
        if crop_size < 8:
            raise ValueError(f"crop_size must be >= 8, got {crop_size}")
        if not (0 <= flip_p <= 1 and rotate[0] <= rotate[1] and 0 < scale[0] <= scale[1]):
            raise ValueError(f"bad augmentation ranges: flip_p={flip_p}, rotate={rotate}, scale={scale}")
        if not 0 < min_crop_side_ratio <= 1 or not 0 < shrink_ratio < 1 or max_tries < 1:
            raise ValueError(f"need 0 < min_crop_side_ratio <= 1, 0 < shrink_ratio < 1, max_tries >= 1; got "
                             f"{min_crop_side_ratio}, {shrink_ratio}, {max_tries}")
        self.crop_size, self.flip_p = int(crop_size), float(flip_p)
        self.rotate, self.scale = tuple(rotate), tuple(scale)
        self.max_tries, self.min_crop_side_ratio = int(max_tries), float(min_crop_side_ratio)
        self.shrink_ratio, self.min_text_size = float(shrink_ratio), float(min_text_size)
        self.thresh_min, self.thresh_max = float(thresh_min), float(thresh_max)
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(self, img: np.ndarray, polys: np.ndarray, ignore: np.ndarray, rng: np.random.Generator,
                 clock=None, donor=None) -> dict:
        """``clock(stage)``, if given, is called after each stage (tools/benchmark.py --pipeline).
        ``donor``: ``rng -> (image, polys, ignore)`` of another training image, for CopyPaste."""
        clock = clock or _no_clock
        if self.copy_paste is not None:
            if donor is None:
                raise ValueError("data.builder.copy_paste is on but no donor image was given")
            img, polys, ignore = self.copy_paste(img, polys, ignore, donor(rng), rng)
            clock("copy_paste")
        if self.geometry == "one_warp":
            img, polys, ignore = augment_and_crop(img, polys, ignore, rng, self.crop_size, self.flip_p, self.rotate,
                                                  self.scale, self.max_tries, self.min_crop_side_ratio, clock)
        else:  # the three full-size interpolations of upstream's order
            img, polys = iaa_augment(img, polys, rng, self.flip_p, self.rotate, self.scale)
            clock("augment")
            img, polys, ignore = east_random_crop(img, polys, ignore, rng, self.crop_size, self.max_tries,
                                                  self.min_crop_side_ratio)
            clock("crop")
        return self._targets(img, polys, ignore, clock)

    def decode_and_apply(self, data: bytes, path, polys: np.ndarray, ignore: np.ndarray, rng: np.random.Generator,
                         bgr: bool = True, clip=None, clock=None, donor=None) -> dict:
        """The item of the encoded image ``data`` (the bytes of ``path``): the same draws and labels as
        decoding it and calling the transform.

        With ``geometry=one_warp`` and ``reduced_decode`` a JPEG's geometry is planned from its
        header first; when the whole map shrinks by 2, 4 or 8 (within 2 %) the JPEG is decoded
        at that reduction (``cv2.IMREAD_REDUCED_COLOR_*``, a 2x2 (4x4, 8x8) low-pass much like the
        bilinear sample at that scale) and the warp starts from the reduced image. ``clip(polys,
        ignore, h, w)`` clips the polygons to the image first. With CopyPaste on, the image is decoded
        whole (the paste changes it before the geometry); ``donor`` as for ``__call__``.
        """
        clock = clock or _no_clock
        clip = clip or (lambda p, g, h, w: (p, g))
        if not (self.geometry == "one_warp" and self.reduced_decode and data[:2] == b"\xff\xd8") \
                or self.copy_paste is not None:
            img = decode_image(data, path)
            img = img if bgr else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
            polys, ignore = clip(polys, ignore, *img.shape[:2])
            clock("read_decode")
            return self(img, polys, ignore, rng, clock, donor)
        h, w = image_size(path, data)
        polys, ignore = clip(polys, ignore, h, w)
        m, fw, fh, polys, ignore = plan_augment_and_crop(h, w, polys, ignore, rng, self.crop_size, self.flip_p,
                                                         self.rotate, self.scale, self.max_tries,
                                                         self.min_crop_side_ratio)
        clock("augment")
        stretch = map_scale(m)
        k = next((k for k in (8, 4, 2) if stretch * k <= 1 + REDUCE_TOLERANCE), 1)
        img = decode_image(data, path, REDUCED_FLAGS[k])
        if k > 1 and img.shape[:2] != (-(-h // k), -(-w // k)):  # not what the header promised
            img, k = decode_image(data, path), 1
        if img.shape[:2] != (h, w) and k == 1:
            raise ValueError(f"image file {path} decodes to {img.shape[1]}x{img.shape[0]} (w x h) but its header "
                             f"says {w}x{h}")
        if k > 1:  # reduced pixel centres -> full-size pixel coordinates, then the planned map
            rx, ry = w / img.shape[1], h / img.shape[0]
            m = m @ np.array([[rx, 0, 0.5 * rx - 0.5], [0, ry, 0.5 * ry - 0.5], [0, 0, 1]])
        img = img if bgr else cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        clock("read_decode")
        img = warp_crop(img, m, fw, fh, self.crop_size)
        clock("crop")
        return self._targets(img, polys, ignore, clock)

    def _targets(self, img: np.ndarray, polys: np.ndarray, ignore: np.ndarray, clock) -> dict:
        s = self.crop_size
        # Same order as det_mv3_db.yml: the border map sees the unclipped polygons.
        thr, thr_mask = make_border_map(polys, ignore, s, s, self.shrink_ratio, self.thresh_min, self.thresh_max)
        clock("border_map")
        gt, gt_mask = make_shrink_map(polys, ignore, s, s, self.shrink_ratio, self.min_text_size)
        clock("shrink_map")
        image = _finish(img, self)
        clock("normalize")
        return {"image": image, "shrink_map": gt, "shrink_mask": gt_mask,
                "threshold_map": thr, "threshold_mask": thr_mask}

    def __repr__(self) -> str:
        return (f"DetTrainTransform(crop={self.crop_size}, flip={self.flip_p}, rotate={self.rotate}, "
                f"scale={self.scale}, min_crop_side_ratio={self.min_crop_side_ratio}"
                + (f", {self.copy_paste!r})" if self.copy_paste is not None else ")"))


class DetEvalTransform:
    """Eval pipeline ``img -> {"image": [3,H,W], "shape": [4]}``: PaddleOCR's ``DetResizeForTest``.

    With ``limit_side_len`` None (the default): a fixed ``image_shape`` ``eval_size`` (H, W),
    ``keep_ratio`` False. Given ``limit_side_len``: its limit-side mode ``limit_type`` (``max`` |
    ``min`` | ``resize_long``; :func:`limit_side_shape`), so each image gets its own size, a multiple
    of 32 (``eval_size`` is then unused). PP-OCRv5's evaluation: 736 / min; its predictor: 960 / max.

    ``shape`` = (src_h, src_w, ratio_h, ratio_w), float32.  As upstream, images
    with h + w < 64 are first zero-padded bottom/right to at least 32x32 (the
    ratios then refer to the padded size, so polygons still map correctly).
    """

    def __init__(self, eval_size: Sequence[int] = (736, 1280), mean=MEAN, std=STD, normalize_on: str = "host",
                 limit_side_len: int | None = None, limit_type: str = "min"):
        self.normalize_on = _check_normalize_on(normalize_on)
        if len(eval_size) != 2 or min(eval_size) < 1:
            raise ValueError(f"eval_size must be (height, width), got {eval_size}")
        self.eval_size = (int(eval_size[0]), int(eval_size[1]))
        if limit_side_len is not None and int(limit_side_len) < 1:
            raise ValueError(f"data.builder.limit_side_len: expected a positive side length or null, "
                             f"got {limit_side_len}")
        if limit_type not in LIMIT_TYPES:
            raise ValueError(f"data.builder.limit_type: expected one of {', '.join(LIMIT_TYPES)}, got {limit_type!r}")
        self.limit_side_len = None if limit_side_len is None else int(limit_side_len)
        self.limit_type = limit_type
        self.mean, self.std = tuple(mean), tuple(std)

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        """Network input (H, W) for a (padded) ``h`` x ``w`` image."""
        if self.limit_side_len is None:
            return self.eval_size
        return limit_side_shape(h, w, self.limit_side_len, self.limit_type)

    def __call__(self, img: np.ndarray) -> dict:
        src_h, src_w = img.shape[:2]
        if src_h + src_w < 64:
            pad = np.zeros((max(32, src_h), max(32, src_w)) + img.shape[2:], img.dtype)
            pad[:src_h, :src_w] = img
            img = pad
        out_h, out_w = self.out_size(*img.shape[:2])
        ratio_h, ratio_w = out_h / img.shape[0], out_w / img.shape[1]
        img = cv2.resize(img, (out_w, out_h), interpolation=cv2.INTER_LINEAR)
        shape = np.array([src_h, src_w, ratio_h, ratio_w], dtype=np.float32)
        return {"image": _finish(img, self), "shape": shape}

    def pad_value(self) -> np.ndarray:
        """Per channel, what a black pixel becomes in this transform's output (padding of a batch)."""
        return _finish(np.zeros((1, 1, 3), np.uint8), self)[:, 0, 0]

    def __repr__(self) -> str:
        if self.limit_side_len is None:
            return f"DetEvalTransform(eval_size={self.eval_size})"
        return f"DetEvalTransform(limit_side_len={self.limit_side_len}, limit_type={self.limit_type!r})"


def pad_eval_batch(items: Sequence[dict], pad_value) -> dict:
    """Stack eval items whose images differ in size (a limit-side resize): each image padded
    bottom/right to the batch's largest H and W with ``pad_value`` (per channel: black), and
    ``valid_hw`` [N, 2] int64 holding each image's own size, for the task to crop its maps to before
    post-processing. With one image per batch nothing is padded, which is how PaddleOCR evaluates."""
    h = max(int(it["image"].shape[1]) for it in items)
    w = max(int(it["image"].shape[2]) for it in items)
    pad = np.asarray(pad_value).reshape(-1, 1, 1)
    out = {"valid_hw": np.array([it["image"].shape[1:] for it in items], np.int64)}
    images = []
    for it in items:
        img = it["image"]
        if img.shape[1:] != (h, w):
            full = np.empty((img.shape[0], h, w), img.dtype)
            full[:] = pad.astype(img.dtype)
            full[:, :img.shape[1], :img.shape[2]] = img
            img = full
        images.append(img)
    out["image"] = np.stack(images)
    for key in items[0]:
        if key != "image":
            out[key] = np.stack([np.asarray(it[key]) for it in items])
    return out
