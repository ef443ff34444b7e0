"""The embedded default text-detection set: rendered words on varied backgrounds.

Each image holds a few words or short lines of random letters/digits rendered
with Pillow's built-in TrueType font (``ImageFont.load_default(size=...)``, so
no font files are needed), at varied sizes, mostly small angles (a tenth up to
+-30 degrees), varied colours with a guaranteed contrast, over flat, gradient,
noisy or cluttered backgrounds.  Every word gets its own quad (the rotated box
of its ink plus a small margin).  Some regions are don't-care (``###``): tiny
words and heavily blurred words, as ICDAR2015 marks illegible text.

On first use the images are generated into a cache folder named after a
version tag and every generation parameter, written to a temporary sibling and
published with ``os.rename``.  Image ``i`` of split ``s`` is drawn from
``default_rng((seed, s, i))``, so the output is byte-identical for identical
parameters (on the same Pillow/OpenCV build).  The result is an ordinary
PaddleOCR detection root (``train_label.txt``, ``val_label.txt``) read by
:class:`~zoo.data.text_det.dataset.TextDetData`.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import cv2
import numpy as np

from zoo.data.text_det.dataset import TextDetData
from zoo.utils.cache import cache_dir, publish_atomically

__all__ = ["SyntheticTextData", "generate_dataset", "render_text_image"]

VERSION = "v1"  # bump whenever rendering changes, so stale caches are never reused
ALPHABET = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"


@functools.lru_cache(maxsize=64)
def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _random_word(rng: np.random.Generator) -> str:
    n = int(rng.integers(2, 9))
    if rng.random() < 0.15:
        return "".join(rng.choice(list(DIGITS), n))
    word = "".join(rng.choice(list(ALPHABET), n))
    style = rng.random()
    return word.upper() if style < 0.3 else word.capitalize() if style < 0.6 else word


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Flat, gradient, smooth-noise or cluttered background, float32 HWC."""
    kind = rng.integers(0, 4)
    base = rng.uniform(0, 255, 3).astype(np.float32)
    img = np.empty((h, w, 3), np.float32)
    img[:] = base
    if kind == 1:  # linear gradient to a second colour
        other = rng.uniform(0, 255, 3).astype(np.float32)
        t = rng.uniform(0, 2 * math.pi)
        ramp = np.cos(t) * np.arange(w)[None, :] / w + np.sin(t) * np.arange(h)[:, None] / h
        ramp = ((ramp - ramp.min()) / max(np.ptp(ramp), 1e-6)).astype(np.float32)[..., None]
        img = base * (1 - ramp) + other * ramp
    elif kind == 2:  # smooth blotches
        img += cv2.resize(rng.normal(0, 40, (4, 4, 3)).astype(np.float32), (w, h), interpolation=cv2.INTER_CUBIC)
    elif kind == 3:  # clutter: non-text shapes the detector must learn to reject
        for _ in range(int(rng.integers(3, 9))):
            colour = tuple(float(c) for c in rng.uniform(0, 255, 3))
            x0, x1 = sorted(rng.uniform(0, w, 2).astype(int).tolist())
            y0, y1 = sorted(rng.uniform(0, h, 2).astype(int).tolist())
            shape = rng.integers(0, 3)
            if shape == 0:
                cv2.rectangle(img, (x0, y0), (x1, y1), colour, int(rng.choice([-1, 2, 4])))
            elif shape == 1:
                cv2.circle(img, ((x0 + x1) // 2, (y0 + y1) // 2), max(2, (x1 - x0) // 3), colour,
                           int(rng.choice([-1, 2])), lineType=cv2.LINE_AA)
            else:
                cv2.line(img, (x0, y0), (x1, y1), colour, int(rng.integers(1, 5)), lineType=cv2.LINE_AA)
    return img


def _render_line(rng: np.random.Generator, words: list[str], size: int):
    """Render words on one baseline: returns alpha (uint8 [h,w]) and one box
    ``(x0, y0, x1, y1)`` per word around its ink, plus a margin."""
    from PIL import Image, ImageDraw

    font = _font(size)
    gaps = [font.getlength(" ") * rng.uniform(1.5, 3.0) for _ in words]
    widths = [font.getlength(word) for word in words]
    pad = size
    width = int(sum(widths) + sum(gaps[:-1]) + 2 * pad)
    height = int(2.5 * size)
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    boxes, x = [], float(pad)
    margin = max(1.0, 0.06 * size)
    for word, wd, gap in zip(words, widths, gaps):
        left, t, r, b = draw.textbbox((x, 1.6 * size), word, font=font, anchor="ls")
        draw.text((x, 1.6 * size), word, fill=255, font=font, anchor="ls")
        boxes.append((left - margin, t - margin, r + margin, b + margin))
        x += wd + gap
    return np.asarray(canvas), boxes


def _place(rng: np.random.Generator, alpha: np.ndarray, boxes, angle: float, h: int, w: int,
           occupied: np.ndarray, tries: int = 20):
    """Find a rotation+translation putting all ``boxes`` inside the image without
    touching ``occupied``; returns (2x3 matrix, quads [n,4,2]) or None."""
    ch, cw = alpha.shape
    rot = cv2.getRotationMatrix2D((cw / 2, ch / 2), angle, 1.0)
    corners = np.array([[[x0, y0], [x1, y0], [x1, y1], [x0, y1]] for x0, y0, x1, y1 in boxes], np.float64)
    rotated = corners @ rot[:, :2].T + rot[:, 2]
    lo, hi = rotated.reshape(-1, 2).min(axis=0), rotated.reshape(-1, 2).max(axis=0)
    if hi[0] - lo[0] > w - 4 or hi[1] - lo[1] > h - 4:
        return None
    for _ in range(tries):
        shift = rng.uniform(2 - lo, (w - 2, h - 2) - hi)
        quads = rotated + shift
        test = np.zeros_like(occupied)
        cv2.fillPoly(test, [np.round(q).astype(np.int32) for q in quads], 1)
        if not (test & occupied).any():
            m = rot.copy()
            m[:, 2] += shift
            return m, quads
    return None


def _text_colour(rng: np.random.Generator, bg: np.ndarray) -> np.ndarray:
    """A random colour whose luminance differs from ``bg``'s by at least 100."""
    lum = np.array([0.299, 0.587, 0.114])
    for _ in range(20):
        colour = rng.uniform(0, 255, 3)
        if abs((colour - bg) @ lum) >= 100:
            return colour.astype(np.float32)
    return np.full(3, 0.0 if bg @ lum > 127 else 255.0, np.float32)


def _add_instance(rng: np.random.Generator, img: np.ndarray, occupied: np.ndarray, tiny: bool) -> list:
    """Draw one word or short line into ``img`` (in place) where ``occupied`` is
    free; returns its ``(transcription, quad)`` labels (empty if it did not fit)."""
    h, w = occupied.shape
    blurred = not tiny and rng.random() < 0.08
    if tiny:
        size, words = int(rng.integers(7, 11)), [_random_word(rng)]
    else:
        size = round(rng.uniform(0.08, 0.2) * min(h, w))
        words = [_random_word(rng) for _ in range(1 if rng.random() < 0.7 else int(rng.integers(2, 4)))]
    r = rng.random()  # mostly near-horizontal, some strongly rotated
    angle = rng.normal(0, 2) if r < 0.7 else rng.uniform(-15, 15) if r < 0.9 else rng.uniform(-30, 30)
    for _ in range(3):  # a line too long for the free space is retried smaller
        alpha, boxes = _render_line(rng, words, size)
        placed = _place(rng, alpha, boxes, angle, h, w, occupied)
        if placed is not None or tiny:
            break
        size = max(8, int(size * 0.75))
    if placed is None:
        return []
    m, quads = placed
    # Composite inside the instance's bounding box only (plus room for blur).
    grow = int(0.6 * size) + 2
    x0, y0 = np.maximum(np.floor(quads.reshape(-1, 2).min(axis=0)).astype(int) - grow, 0)
    x1, y1 = np.minimum(np.ceil(quads.reshape(-1, 2).max(axis=0)).astype(int) + grow, (w - 1, h - 1))
    m[:, 2] -= (x0, y0)
    a = cv2.warpAffine(alpha, m, (x1 - x0 + 1, y1 - y0 + 1), flags=cv2.INTER_LINEAR).astype(np.float32) / 255
    if blurred:
        a = cv2.GaussianBlur(a, (0, 0), rng.uniform(0.12, 0.2) * size)
    roi = img[y0:y1 + 1, x0:x1 + 1]
    inside = a > 0.5
    bg = roi[inside].mean(axis=0) if inside.any() else roi.reshape(-1, 3).mean(axis=0)
    roi += (_text_colour(rng, bg) - roi) * a[..., None]
    # Mark each word's box enlarged by 15% so later instances keep a gap.
    cv2.fillPoly(occupied, [np.round(q + (q - q.mean(axis=0)) * 0.15).astype(np.int32) for q in quads], 1)
    return [("###" if blurred or tiny else word, q) for word, q in zip(words, quads)]


def render_text_image(rng: np.random.Generator, h: int, w: int, max_instances: int = 5):
    """Render one image; returns (uint8 RGB [h,w,3], list of (transcription, quad [4,2]))."""
    img = _background(rng, h, w)
    occupied = np.zeros((h, w), np.uint8)
    n = int(rng.integers(1, max_instances + 1))
    n_tiny = int(rng.integers(1, 3)) if rng.random() < 0.3 else 0
    labels = []
    for tiny in [False] * n + [True] * n_tiny:
        labels += _add_instance(rng, img, occupied, tiny)
    if rng.random() < 0.5:
        img += rng.standard_normal(img.shape, dtype=np.float32) * np.float32(rng.uniform(2, 8))
    return np.clip(np.round(img), 0, 255).astype(np.uint8), labels


def generate_dataset(out_dir: Path, num_train: int, num_val: int, height: int, width: int,
                     max_instances: int, seed: int) -> None:
    """Write ``train/*.jpg``, ``val/*.jpg``, ``train_label.txt`` and ``val_label.txt`` into ``out_dir``."""
    from zoo.utils.progress import Progress

    total = num_train + num_val
    with Progress(total=total, desc="generating synthetic text", unit="img", disable=total <= 200, leave=False) as bar:
        for split_id, (split, count) in enumerate((("train", num_train), ("val", num_val))):
            (out_dir / split).mkdir(parents=True)
            lines = []
            for i in range(count):
                img, labels = render_text_image(np.random.default_rng((seed, split_id, i)), height, width,
                                                max_instances)
                rel = f"{split}/{i:06d}.jpg"
                ok, data = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 92])
                if not ok:
                    raise OSError(f"failed to encode {out_dir / rel}")
                (out_dir / rel).write_bytes(data.tobytes())
                boxes = [{"transcription": t, "points": np.round(q).astype(int).tolist()} for t, q in labels]
                lines.append(f"{rel}\t{json.dumps(boxes, ensure_ascii=False)}\n")
                bar.update(1)
            (out_dir / f"{split}_label.txt").write_text("".join(lines), encoding="utf-8")


def ensure_generated(target: Path, **params) -> Path:
    """Generate the dataset into ``target`` atomically unless it already exists."""
    return publish_atomically(target, lambda tmp: generate_dataset(tmp, **params))


class SyntheticTextData(TextDetData):
    """TextDetData over the generated synthetic text set.

    ``root`` is the *parent* of the generated folder (default
    ``cache_dir("datasets")``); the dataset itself is ``self.root``.  Defaults
    are sized for a quick from-scratch DB run on CPU: 256x256 images evaluated at
    their own size, 160x160 train crops, at most 5 text instances (a
    fifth of them short lines) per image.  Other keywords go to :class:`TextDetData`.
    """

    def __init__(self, num_train: int = 2000, num_val: int = 100, image_size=(256, 256), seed: int = 0,
                 root=None, crop_size: int = 160, eval_size=None, max_polys: int = 32,
                 max_instances: int = 5, **kw):
        hh, ww = (image_size, image_size) if isinstance(image_size, int) else (int(v) for v in image_size)
        if num_train < 1 or num_val < 1 or min(hh, ww) < 32 or seed < 0 or max_instances < 1:
            raise ValueError(f"need num_train, num_val, max_instances >= 1, image_size >= 32, seed >= 0; got "
                             f"{num_train}, {num_val}, {max_instances}, {image_size}, {seed}")
        self.params = dict(num_train=int(num_train), num_val=int(num_val), height=hh, width=ww,
                           max_instances=int(max_instances), seed=int(seed))
        name = f"synthetic_text-{VERSION}-{hh}x{ww}-{max_instances}inst-{num_train}tr-{num_val}va-seed{seed}"
        parent = Path(root).expanduser() if root is not None else cache_dir("datasets")
        super().__init__(parent / name, train_label="train_label.txt", val_label="val_label.txt",
                         crop_size=crop_size, eval_size=eval_size or (hh, ww), max_polys=max_polys, **kw)
        self._generated = False

    def prepare(self) -> None:
        """Generate the images on first use (no-op once the folder exists)."""
        if not self._generated:
            ensure_generated(self.root, **self.params)
            self._generated = True
