"""The embedded default dataset: procedurally drawn shapes (no downloads).

Ten shape classes are drawn with random position, size, rotation (limited
where it would make classes collide, e.g. square vs diamond), random
foreground/background colours, low-frequency background shading, pixel
noise and distractor strokes (half of them in the foreground colour), so
colour and position carry no class information.

On first use the images are generated into a cache folder whose name holds a
version tag and every generation parameter, written to a temporary sibling
and published with ``os.rename``; a half-written folder is never used.  The
result is an ordinary PaddleClas root (``train_list.txt``, ``val_list.txt``,
``labels.txt``) read by :class:`~zoo.data.classification.dataset.ClassificationData`.
"""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np

from zoo.data.classification.dataset import ClassificationData
from zoo.utils.cache import cache_dir, publish_atomically

__all__ = ["SHAPE_NAMES", "SyntheticShapesData", "generate_dataset", "render_shape_image"]

# Bump whenever rendering changes, so stale caches are never reused.
VERSION = "v1"
SUPERSAMPLE = 4  # shapes are drawn at 4x and area-downsampled for anti-aliasing
SMALL_TILT = math.radians(12)


def _rect(x0, y0, x1, y1):
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def _regular(n, radius=1.0, phase=-math.pi / 2):
    t = phase + 2 * math.pi * np.arange(n) / n
    return np.stack([radius * np.cos(t), radius * np.sin(t)], axis=1)


def _star(points=5, inner=0.38):
    outer = _regular(points)
    inner_pts = _regular(points, inner, phase=-math.pi / 2 + math.pi / points)
    return np.stack([outer, inner_pts], axis=1).reshape(-1, 2)


_SQUARE = [(_rect(-0.85, -0.85, 0.85, 0.85), 255)]
_PLUS = [(_rect(-1, -0.3, 1, 0.3), 255), (_rect(-0.3, -1, 0.3, 1), 255)]
_BARS = [(_rect(-1, y, 1, y + 0.4), 255) for y in (-1.0, -0.2, 0.6)]
# name -> (list of (unit polygon, mask value), base angle, angle jitter).
# Classes that differ only by orientation (square/diamond, plus/X, bar pairs)
# keep a small tilt so they can never be rotated into each other.
SHAPES = {
    "circle": ([(_regular(64), 255)], 0.0, 0.0),
    "square": (_SQUARE, 0.0, SMALL_TILT),
    "triangle": ([(_regular(3, 1.1, phase=math.pi / 2), 255)], 0.0, math.pi),
    "plus": (_PLUS, 0.0, SMALL_TILT),
    "ring": ([(_regular(64), 255), (_regular(64, 0.55), 0)], 0.0, 0.0),
    "star": ([(_star(), 255)], 0.0, math.pi),
    "horizontal_bars": (_BARS, 0.0, SMALL_TILT),
    "vertical_bars": (_BARS, math.pi / 2, SMALL_TILT),
    "diamond": (_SQUARE, math.pi / 4, SMALL_TILT),
    "x_cross": (_PLUS, math.pi / 4, SMALL_TILT),
}
SHAPE_NAMES = tuple(SHAPES)


def _colour_pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random foreground/background colours that are clearly distinguishable."""
    while True:
        fg, bg = rng.integers(0, 256, size=(2, 3)).astype(np.float32)
        if np.linalg.norm(fg - bg) >= 150:
            return fg, bg


def _shading(rng: np.random.Generator, size: int) -> np.ndarray:
    """Smooth low-frequency colour variation (float32 HWC, roughly zero mean)."""
    shade = rng.normal(0.0, 12.0, size=(4, 4, 3)).astype(np.float32)
    return cv2.resize(shade, (size, size), interpolation=cv2.INTER_CUBIC)


def _distractors(rng: np.random.Generator, canvas: np.ndarray, fg: np.ndarray) -> None:
    """Draw 1-2 thin random strokes; half use the foreground colour."""
    size = canvas.shape[0]
    for _ in range(int(rng.integers(1, 3))):
        colour = fg if rng.random() < 0.5 else rng.integers(0, 256, 3).astype(np.float32)
        p0 = rng.uniform(0, size, 2)
        angle, length = rng.uniform(0, 2 * math.pi), rng.uniform(0.15, 0.5) * size
        p1 = p0 + length * np.array([math.cos(angle), math.sin(angle)])
        # shift=4: sub-pixel endpoints (coordinates in 1/16 pixel).
        cv2.line(canvas, tuple(int(v * 16) for v in p0), tuple(int(v * 16) for v in p1),
                 tuple(float(c) for c in colour), thickness=1, lineType=cv2.LINE_AA, shift=4)


def _shape_alpha(rng: np.random.Generator, name: str, size: int) -> np.ndarray:
    """Anti-aliased coverage in [0,1] (size x size) of one randomly placed,
    scaled and rotated shape, drawn at SUPERSAMPLE x resolution."""
    parts, base_angle, jitter = SHAPES[name]
    big = size * SUPERSAMPLE
    radius = rng.uniform(0.28, 0.45) * big
    centre = rng.uniform(0.9 * radius, big - 0.9 * radius, 2)
    angle = base_angle + rng.uniform(-jitter, jitter)
    rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    mask = np.zeros((big, big), np.uint8)
    for poly, value in parts:
        pts = (poly @ rot.T) * radius + centre
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], value)
    alpha = cv2.resize(mask, (size, size), interpolation=cv2.INTER_AREA)
    return alpha.astype(np.float32)[..., None] / np.float32(255.0)


def render_shape_image(rng: np.random.Generator, label: int, image_size: int) -> np.ndarray:
    """Render one ``image_size`` x ``image_size`` uint8 image of class ``label``."""
    fg, bg = _colour_pair(rng)
    canvas = np.ascontiguousarray(np.broadcast_to(bg, (image_size, image_size, 3)))
    _distractors(rng, canvas, fg)
    alpha = _shape_alpha(rng, SHAPE_NAMES[label], image_size)
    img = canvas * (1.0 - alpha) + fg * alpha
    # Shading and noise go over everything, like uneven lighting and sensor noise.
    img += _shading(rng, image_size)
    img += rng.normal(0.0, rng.uniform(0.0, 8.0), img.shape).astype(np.float32)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def generate_dataset(out_dir: Path, num_train: int, num_val: int, image_size: int,
                     num_classes: int, seed: int) -> None:
    """Write images, ``train_list.txt``, ``val_list.txt`` and ``labels.txt`` into ``out_dir``.

    Image ``i`` of a split has label ``i % num_classes`` (balanced classes) and
    is drawn from ``default_rng((seed, split_id, i))``, so output is
    byte-identical for identical parameters.
    """
    from zoo.utils.progress import Progress

    total = num_train + num_val
    with Progress(total=total, desc="generating synthetic shapes", unit="img",
              disable=total <= 300, leave=False) as bar:
        for split_id, (split, count) in enumerate((("train", num_train), ("val", num_val))):
            (out_dir / split).mkdir(parents=True)
            lines = []
            for i in range(count):
                label = i % num_classes
                img = render_shape_image(np.random.default_rng((seed, split_id, i)), label, image_size)
                rel = f"{split}/{i:06d}.png"
                if not cv2.imwrite(str(out_dir / rel), img):
                    raise OSError(f"failed to write {out_dir / rel}")
                lines.append(f"{rel} {label}\n")
                bar.update(1)
            (out_dir / f"{split}_list.txt").write_text("".join(lines), encoding="utf-8")
    (out_dir / "labels.txt").write_text("".join(n + "\n" for n in SHAPE_NAMES[:num_classes]), encoding="utf-8")


def ensure_generated(target: Path, **params) -> Path:
    """Generate the dataset into ``target`` atomically unless it already exists."""
    return publish_atomically(target, lambda tmp: generate_dataset(tmp, **params))


class SyntheticShapesData(ClassificationData):
    """ClassificationData over the generated shapes dataset.

    ``root`` is the *parent* folder of the generated dataset (default
    ``cache_dir("datasets")``); the dataset itself lives in a sub-folder named
    after the version and parameters, available as ``self.root``.  Defaults
    suited to tiny images: ``resize_size=image_size`` (no val crop loss) and a
    mild train crop ``train_crop_scale=(0.6, 1.0)``.  Other keyword arguments
    go to :class:`ClassificationData`.
    """

    def __init__(self, num_train: int = 4000, num_val: int = 1000, image_size: int = 32,
                 num_classes: int = 10, seed: int = 0, root=None, **kw):
        if not 2 <= num_classes <= len(SHAPE_NAMES):
            raise ValueError(f"num_classes must be in [2, {len(SHAPE_NAMES)}], got {num_classes}")
        if num_train < 1 or num_val < 1 or image_size < 8 or seed < 0:
            raise ValueError(
                f"need num_train >= 1, num_val >= 1, image_size >= 8, seed >= 0; got "
                f"{num_train}, {num_val}, {image_size}, {seed}"
            )
        self.params = dict(num_train=int(num_train), num_val=int(num_val), image_size=int(image_size),
                           num_classes=int(num_classes), seed=int(seed))
        name = (f"synthetic_shapes-{VERSION}-{image_size}px-{num_classes}c-"
                f"{num_train}tr-{num_val}va-seed{seed}")
        parent = Path(root).expanduser() if root is not None else cache_dir("datasets")
        kw.setdefault("resize_size", image_size)
        kw.setdefault("train_crop_scale", (0.6, 1.0))
        super().__init__(parent / name, image_size=image_size, num_classes=num_classes, **kw)
        self._generated = False

    def prepare(self) -> None:
        """Generate the images on first use (no-op once the folder exists)."""
        if not self._generated:
            ensure_generated(self.root, **self.params)
            self._generated = True
