"""The embedded default box-detection set: coloured shapes on varied backgrounds.

Each image holds 1 to ``max_objects`` shapes of eight classes (circle, square,
triangle, star, ellipse, cross, ring, diamond) with sizes log-uniform in
``[min_size, max_size]`` pixels, random colours with a guaranteed contrast to
what lies under them, over flat, gradient, blotchy or line-cluttered
backgrounds, sometimes with pixel noise.  A new shape may cover at most a
quarter of an earlier shape's visible area, so overlaps occur but no object
disappears.  Boxes are the tight bounds of each object's *visible* pixels
(those at least half its colour after anti-aliasing and occlusion); ``area``
is the visible pixel count, as COCO's segmentation area.

On first use the images are generated into a cache folder whose name holds a
version tag, the main parameters and a hash of all of them, written to a
temporary sibling and published with ``os.rename``.  Image ``i`` of split ``s``
is drawn from ``default_rng((seed, s, i))``, so the output is byte-identical
for identical parameters (on the same OpenCV build).  The result is an
ordinary COCO root read by :class:`~zoo.data.coco.dataset.COCODetData`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import cv2
import numpy as np

from zoo.data.coco.dataset import COCODetData
from zoo.utils.cache import cache_dir, publish_atomically

__all__ = ["DET_SHAPE_NAMES", "SyntheticShapesDetData", "generate_dataset", "render_detection_image"]

VERSION = "v1"  # bump whenever rendering changes, so stale caches are never reused
DET_SHAPE_NAMES = ("circle", "square", "triangle", "star", "ellipse", "cross", "ring", "diamond")
TILT = math.radians(12)  # square/diamond/cross stay within this of upright so classes never coincide
JPEG_QUALITY = 92
MAX_COVER = 0.25


def _regular(n: int, radius: float = 1.0, phase: float = -math.pi / 2) -> np.ndarray:
    t = phase + 2 * math.pi * np.arange(n) / n
    return np.stack([radius * np.cos(t), radius * np.sin(t)], axis=1)


_STAR = np.stack([_regular(5), _regular(5, 0.4, -math.pi / 2 + math.pi / 5)], axis=1).reshape(-1, 2)


def _cross(t: float) -> np.ndarray:
    """A plus sign with arm half-width ``t`` inside the unit circle (12 corners)."""
    a = math.sqrt(1 - t * t)
    return np.array([[-t, -a], [t, -a], [t, -t], [a, -t], [a, t], [t, t], [t, a], [-t, a], [-t, t], [-a, t],
                     [-a, -t], [-t, -t]])


def _polys(rng: np.random.Generator, name: str) -> list[np.ndarray]:
    """Unit polygon(s) (inside the unit circle) of one randomly shaped instance."""
    if name == "square":
        return [_regular(4, 1.0, math.pi / 4 + rng.uniform(-TILT, TILT))]
    if name == "diamond":  # a rhombus standing on a corner, possibly narrower than tall
        pts = _regular(4, 1.0, 0.0) * (rng.uniform(0.6, 1.0), 1.0)
        return [_rotate(pts, rng.uniform(-TILT, TILT))]
    if name == "triangle":
        return [_regular(3, 1.0, rng.uniform(0, 2 * math.pi))]
    if name == "star":
        return [_rotate(_STAR, rng.uniform(0, 2 * math.pi))]
    if name == "cross":
        return [_rotate(_cross(rng.uniform(0.22, 0.36)), rng.uniform(-TILT, TILT))]
    raise KeyError(name)


def _rotate(pts: np.ndarray, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return pts @ np.array([[c, s], [-s, c]])


def _shape_mask(rng: np.random.Generator, name: str, size: int, min_size: float, max_size: float) -> np.ndarray:
    """Anti-aliased uint8 coverage [size,size] of one shape placed fully inside the image."""
    d = math.exp(rng.uniform(math.log(min_size), math.log(max_size)))
    r = d / 2
    centre = rng.uniform(r + 1, size - r - 1, 2)
    mask = np.zeros((size, size), np.uint8)
    fix = lambda v: int(round(v * 16))  # noqa: E731  (shift=4: coordinates in 1/16 pixel)
    c16 = (fix(centre[0] - 0.5), fix(centre[1] - 0.5))  # OpenCV puts integer coordinates at pixel centres
    if name in ("circle", "ring"):
        cv2.circle(mask, c16, fix(r), 255, -1, cv2.LINE_AA, 4)
        if name == "ring":
            cv2.circle(mask, c16, fix(r * rng.uniform(0.45, 0.62)), 0, -1, cv2.LINE_AA, 4)
    elif name == "ellipse":
        axes = (fix(r), fix(r * rng.uniform(0.35, 0.65)))
        cv2.ellipse(mask, c16, axes, float(rng.uniform(0, 180)), 0, 360, 255, -1, cv2.LINE_AA, 4)
    else:
        pts = [np.round((p * r + centre - 0.5) * 16).astype(np.int32) for p in _polys(rng, name)]
        cv2.fillPoly(mask, pts, 255, cv2.LINE_AA, 4)
    return mask


def _background(rng: np.random.Generator, size: int, plain: bool) -> np.ndarray:
    """Flat, gradient, blotchy or line-cluttered background, float32 HWC."""
    img = np.zeros((size, size, 3), np.float32)
    if plain:
        return img
    kind = int(rng.integers(0, 4))
    img[:] = rng.uniform(0, 255, 3)
    if kind == 1:
        other = rng.uniform(0, 255, 3).astype(np.float32)
        t = rng.uniform(0, 2 * math.pi)
        ramp = np.cos(t) * np.arange(size)[None, :] + np.sin(t) * np.arange(size)[:, None]
        ramp = ((ramp - ramp.min()) / max(np.ptp(ramp), 1e-6)).astype(np.float32)[..., None]
        img = img * (1 - ramp) + other * ramp
    elif kind == 2:
        img += cv2.resize(rng.normal(0, 45, (4, 4, 3)).astype(np.float32), (size, size),
                          interpolation=cv2.INTER_CUBIC)
    elif kind == 3:  # thin lines: clutter that is not an object
        for _ in range(int(rng.integers(3, 10))):
            p = np.round(rng.uniform(0, size, 4) * 16).astype(int)
            cv2.line(img, (int(p[0]), int(p[1])), (int(p[2]), int(p[3])), tuple(float(c) for c in
                     rng.uniform(0, 255, 3)), int(rng.integers(1, 3)), cv2.LINE_AA, 4)
    return img


def _colour(rng: np.random.Generator, under: np.ndarray) -> np.ndarray:
    """A random colour at least 120 (RGB distance) away from ``under``."""
    for _ in range(20):
        c = rng.uniform(0, 255, 3).astype(np.float32)
        if np.linalg.norm(c - under) >= 120:
            return c
    return np.where(under > 127, 0.0, 255.0).astype(np.float32)


def render_detection_image(rng: np.random.Generator, size: int = 256, max_objects: int = 6,
                           min_size: float = 12, max_size: float = 110, plain: bool = False):
    """Render one image.

    Returns ``(uint8 RGB [size,size,3], boxes float32 [K,4] xyxy, labels int64 [K],
    areas int64 [K])``; ``plain`` gives a black background without clutter or noise.
    """
    max_size = min(max_size, 0.9 * size - 2)
    img = _background(rng, size, plain)
    visible, labels = [], []  # per object: visible coverage in [0,1], float32 [size,size]
    for _ in range(int(rng.integers(1, max_objects + 1))):
        label = int(rng.integers(len(DET_SHAPE_NAMES)))
        for _ in range(10):
            mask = _shape_mask(rng, DET_SHAPE_NAMES[label], size, min_size, max_size)
            x, y, w, h = cv2.boundingRect(mask)
            roi = (slice(y, y + h), slice(x, x + w))
            solid = mask[roi] >= 128
            if all((v[roi] >= 0.5)[solid].sum() <= MAX_COVER * (v >= 0.5).sum() for v in visible):
                break
        else:
            continue
        a = mask[roi].astype(np.float32) / np.float32(255)
        colour = _colour(rng, img[roi][solid].mean(axis=0) if solid.any() else img[roi].reshape(-1, 3).mean(axis=0))
        img[roi] = img[roi] * (1 - a[..., None]) + colour * a[..., None]
        for v in visible:
            v[roi] *= 1 - a
        own = np.zeros((size, size), np.float32)
        own[roi] = a
        visible.append(own)
        labels.append(label)
    if not plain and rng.random() < 0.5:
        img += rng.standard_normal(img.shape, dtype=np.float32) * np.float32(rng.uniform(2, 8))
    boxes, kept, areas = [], [], []
    for v, label in zip(visible, labels):
        ys, xs = np.nonzero(v >= 0.5)
        if len(xs):  # always true with MAX_COVER < 1; guards the annotation against an empty mask
            boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
            kept.append(label)
            areas.append(len(xs))
    return (np.clip(np.round(img), 0, 255).astype(np.uint8), np.array(boxes, np.float32).reshape(-1, 4),
            np.array(kept, np.int64), np.array(areas, np.int64))


def generate_dataset(out_dir: Path, num_train: int, num_val: int, image_size: int, max_objects: int,
                     min_size: float, max_size: float, seed: int) -> None:
    """Write ``train/*.jpg``, ``val/*.jpg`` and ``annotations/instances_{train,val}.json`` into ``out_dir``."""
    from zoo.utils.progress import Progress

    categories = [{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(DET_SHAPE_NAMES)]
    (out_dir / "annotations").mkdir(parents=True)
    total = num_train + num_val
    with Progress(total=total, desc="generating synthetic detection set", unit="img", disable=total <= 200,
              leave=False) as bar:
        for split_id, (split, count) in enumerate((("train", num_train), ("val", num_val))):
            (out_dir / split).mkdir()
            images, anns = [], []
            for i in range(count):
                rng = np.random.default_rng((seed, split_id, i))
                img, boxes, labels, areas = render_detection_image(rng, image_size, max_objects, min_size, max_size)
                rel = f"{i:06d}.jpg"
                ok, data = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                                        [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
                if not ok:
                    raise OSError(f"failed to encode {out_dir / split / rel}")
                (out_dir / split / rel).write_bytes(data.tobytes())
                images.append({"id": i + 1, "file_name": rel, "width": image_size, "height": image_size})
                for (x1, y1, x2, y2), label, area in zip(boxes.tolist(), labels.tolist(), areas.tolist()):
                    anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": label + 1,
                                 "bbox": [x1, y1, x2 - x1, y2 - y1], "area": area, "iscrowd": 0})
                bar.update(1)
            doc = {"images": images, "annotations": anns, "categories": categories}
            (out_dir / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc), encoding="utf-8")


def ensure_generated(target: Path, **params) -> Path:
    """Generate the dataset into ``target`` atomically unless it already exists."""
    return publish_atomically(target, lambda tmp: generate_dataset(tmp, **params))


class SyntheticShapesDetData(COCODetData):
    """COCODetData over the generated shapes detection set.

    ``root`` is the *parent* of the generated folder (default
    ``cache_dir("datasets")``); the dataset itself is ``self.root``.  Train and
    eval sizes default to ``image_size``, ``max_boxes`` to ``max_objects`` and
    multi-scale training is off.  Other keywords go to :class:`COCODetData`.
    """

    def __init__(self, num_train: int = 1000, num_val: int = 200, image_size: int = 256, seed: int = 0,
                 root=None, max_objects: int = 6, min_size: float = 12, max_size: float = 110,
                 train_size: int | None = None, eval_size: int | None = None, multiscale=None,
                 max_boxes: int | None = None, **kw):
        if num_train < 1 or num_val < 1 or image_size < 32 or seed < 0 or max_objects < 1:
            raise ValueError(f"data.builder: need num_train, num_val, max_objects >= 1, image_size >= 32, "
                             f"seed >= 0; got {num_train}, {num_val}, {max_objects}, {image_size}, {seed}")
        if not 4 <= min_size <= max_size:
            raise ValueError(f"data.builder.min_size / max_size: need 4 <= min_size <= max_size, got "
                             f"{min_size}, {max_size}")
        self.params = dict(num_train=int(num_train), num_val=int(num_val), image_size=int(image_size),
                           max_objects=int(max_objects), min_size=float(min_size), max_size=float(max_size),
                           seed=int(seed))
        digest = hashlib.sha1(json.dumps([VERSION, DET_SHAPE_NAMES, MAX_COVER, JPEG_QUALITY, self.params],
                                         sort_keys=True).encode()).hexdigest()[:8]
        name = (f"synthetic_det-{VERSION}-{image_size}px-{max_objects}obj-{num_train}tr-{num_val}va-"
                f"seed{seed}-{digest}")
        parent = Path(root).expanduser() if root is not None else cache_dir("datasets")
        super().__init__(parent / name, train_ann="annotations/instances_train.json",
                         val_ann="annotations/instances_val.json", train_images="train", val_images="val",
                         image_size=train_size or image_size, eval_size=eval_size or image_size,
                         multiscale=multiscale, max_boxes=max_boxes or max_objects, **kw)
        self._generated = False

    def prepare(self) -> None:
        """Generate the images on first use (no-op once the folder exists)."""
        if not self._generated:
            ensure_generated(self.root, **self.params)
            self._generated = True
