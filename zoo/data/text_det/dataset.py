"""Text-detection data in PaddleOCR's label format (e.g. ICDAR2015).

A label file has one image per line (``ppocr/data/simple_dataset.py``,
``ppocr/data/imaug/label_ops.py`` ``DetLabelEncode``)::

    relative/path.jpg<TAB>[{"transcription": "...", "points": [[x,y],[x,y],[x,y],[x,y]]}, ...]

with points clockwise from the top-left and paths relative to the data root.
Transcriptions ``###`` and ``*`` mark don't-care regions.  Polygons with more
than four points are replaced by their minimum-area rectangle (upstream instead
pads all polygons of an image to the same point count); this dataset handles
quadrilaterals only.

Datasets are indexed by sampler keys (see :mod:`zoo.data.sampler`); train items
draw all augmentation randomness from ``np.random.default_rng((seed, epoch, index))``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import paddle

from zoo.data.images import (
    ImageDecodeError,
    ImageFileError,
    image_size,
    read_image_bgr,
    read_image_rgb,
    verify_image_file,
)
from zoo.data.skip_limit import DEFAULT_MAX_LOST_FRACTION, check_max_lost_fraction, refuse_if_most_lost
from zoo.data.skip_limit import KEY as MAX_LOST_KEY
from zoo.data.text_det.memory import check_keep_freed_memory, keep_freed_memory
from zoo.data.text_det.transforms import DetEvalTransform, DetTrainTransform, pad_eval_batch
from zoo.data.text_encoding import utf8_lines

__all__ = ["IGNORE_TRANSCRIPTIONS", "TextDetData", "TextDetDataset", "load_det_labels", "read_det_label_file"]
log = logging.getLogger(__name__)
BAD_SAMPLE_POLICIES = ("fail", "skip")

IGNORE_TRANSCRIPTIONS = ("###", "*")
SPLITS = ("train", "val")


def _min_area_quad(points: np.ndarray) -> np.ndarray:
    """Minimum-area rectangle of ``points`` as 4 corners, clockwise from the
    corner nearest the top-left (smallest x + y)."""
    import cv2

    box = cv2.boxPoints(cv2.minAreaRect(points.astype(np.float32)))
    centre = box.mean(axis=0)
    # Clockwise in image coordinates (y down) is increasing atan2(dy, dx).
    box = box[np.argsort(np.arctan2(box[:, 1] - centre[1], box[:, 0] - centre[0]))]
    return np.roll(box, -int(np.argmin(box.sum(axis=1))), axis=0)


def _parse_points(points, where: str) -> np.ndarray:
    try:
        arr = np.asarray(points, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: 'points' must be a list of [x, y] numbers, got {points!r}") from None
    if arr.ndim != 2 or arr.shape[1] != 2 or len(arr) < 4:
        raise ValueError(f"{where}: 'points' must be at least 4 [x, y] pairs (a 4x2 list), "
                         f"got shape {arr.shape}: {points!r}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{where}: 'points' contains non-finite numbers: {points!r}")
    return _min_area_quad(arr) if len(arr) > 4 else arr


def parse_det_label_line(line: str, where: str) -> tuple[str, np.ndarray, np.ndarray]:
    """Parse one non-blank label line; ``where`` ("file:line") prefixes errors."""
    if "\t" not in line:
        raise ValueError(f"{where}: no tab between image path and JSON label in {line[:80]!r}")
    path, label = line.split("\t", 1)
    if not path.strip():
        raise ValueError(f"{where}: empty image path")
    try:
        items = json.loads(label)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: bad JSON label ({e.msg} at column {e.pos + 1}): {label[:80]!r}") from None
    if not isinstance(items, list):
        raise ValueError(f"{where}: JSON label must be a list of objects, got {type(items).__name__}")
    polys, ignore = [], []
    for k, item in enumerate(items):
        at = f"{where}: box {k}"
        if not isinstance(item, dict) or "points" not in item or "transcription" not in item:
            raise ValueError(f"{at}: expected an object with 'transcription' and 'points', got {item!r}")
        polys.append(_parse_points(item["points"], at))
        ignore.append(item["transcription"] in IGNORE_TRANSCRIPTIONS)
    return (path.strip(), np.asarray(polys, np.float32).reshape(-1, 4, 2), np.asarray(ignore, bool))


VERIFY_MODES = (True, False, "decode")


def _verify_image(path: Path, where: str, decode: bool = False) -> None:
    # Existence and the JPEG/PNG end marker (a truncated JPEG decodes with only a warning) cost
    # ~0.06 ms per image; ``decode`` adds a reduced (1/8) decode, ~2 ms per 1280x720 JPEG, which
    # also finds damage inside a complete file. Without it such a file stops the run when first
    # loaded, naming its label line (zoo/data/loader.py), instead of being skipped at start.
    try:
        verify_image_file(path, decode=decode)
    except (OSError, ImageDecodeError) as e:
        raise ImageFileError(f"{where}: image is missing or cannot be decoded: {e}") from None


def clip_polys_to_image(polys: np.ndarray, ignore: np.ndarray, h: int, w: int):
    """Clip polygon points to the image's extent (pixel centres -0.5 .. size-0.5).

    Points inside are left bit-exactly as they are. A polygon that had points outside counts as
    clipped; one left with (almost) no area becomes don't-care. Returns ``(polys, ignore, n_clipped)``.
    """
    if not len(polys):
        return polys, ignore, 0
    x, y = polys[..., 0], polys[..., 1]
    outside = ((x < -0.5) | (x > w - 0.5) | (y < -0.5) | (y > h - 0.5)).any(axis=1)
    if not outside.any():
        return polys, ignore, 0
    polys, ignore = polys.copy(), ignore.copy()
    polys[..., 0] = np.clip(x, -0.5, w - 0.5)
    polys[..., 1] = np.clip(y, -0.5, h - 0.5)
    px, py = polys[..., 0], polys[..., 1]
    area = 0.5 * np.abs((px * np.roll(py, -1, axis=1) - np.roll(px, -1, axis=1) * py).sum(axis=1))
    ignore[outside & (area < 1.0)] = True
    return polys, ignore, int(outside.sum())


def _check_geometry(sample, image: Path, where: str, stats: dict):
    """Clip ``sample``'s polygons to the size of ``image`` (read from its header) and count."""
    path, polys, ignore = sample
    if not len(polys):
        stats["empty_label_lists"] = stats.get("empty_label_lists", 0) + 1
        return sample
    try:
        h, w = image_size(image)
    except ImageDecodeError as e:  # as _verify_image words it, with the label line
        raise ImageFileError(f"{where}: image is missing or cannot be decoded: {e}") from None
    polys, ignore, clipped = clip_polys_to_image(polys, ignore, h, w)
    if clipped:
        stats["clipped_polygons"] = stats.get("clipped_polygons", 0) + clipped
        at = stats.setdefault("clipped_at", [])
        if len(at) < 20:  # where, for the log and summary.json; the count covers all
            at.append(where)
    return path, polys, ignore


def load_det_labels(path, bad_samples: str = "fail", image_root=None,
                    line_numbers: list | None = None, stats: dict | None = None,
                    decode: bool = False) -> tuple[list, list[str]]:
    """Read a label file under a bad-sample policy, optionally checking every image decodes.

    ``bad_samples="fail"`` raises at the first bad line or image (before training starts);
    ``"skip"`` leaves such samples out and returns their messages (file:line and reason) so the
    caller can count and report them. Returns ``(samples, problems)``; the label-file line of
    each sample is appended to ``line_numbers`` when a list is given. With ``image_root``,
    polygons reaching outside their image are clipped to it (:func:`clip_polys_to_image`);
    ``stats`` counts them (``clipped_polygons``, ``clipped_at``) and images with an empty label
    list ``[]`` (``empty_label_lists``: allowed, PaddleOCR's format has text-free images).
    Images are checked for existence and completeness (end marker); ``decode`` also decodes them.
    """
    if bad_samples not in BAD_SAMPLE_POLICIES:
        raise ValueError(f"data.builder.bad_samples: expected one of {BAD_SAMPLE_POLICIES}, got {bad_samples!r}")
    samples, problems = [], []
    for lineno, line in utf8_lines(path):  # a BOM is accepted; a line not UTF-8 is a bad line
        if isinstance(line, str) and not line.strip():
            continue
        where = f"{path}:{lineno}"
        sample = None
        try:
            if isinstance(line, ValueError):
                raise line
            sample = parse_det_label_line(line, where)
            if image_root is not None:
                _verify_image(Path(image_root) / sample[0], where, decode)
                sample = _check_geometry(sample, Path(image_root) / sample[0], where,
                                         stats if stats is not None else {})
        except (ValueError, OSError) as e:
            if bad_samples == "fail":
                raise
            problems.append(str(e))
            if stats is not None:  # the boxes lost with it, where its labels could be read (the image could not)
                key = "lost_boxes" if sample is not None else "lost_unread_lines"
                stats[key] = stats.get(key, 0) + (len(sample[1]) if sample is not None else 1)
            continue
        samples.append(sample)
        if line_numbers is not None:
            line_numbers.append(lineno)
    return samples, problems


def _lost_boxes_text(stats: dict, kept_boxes: int) -> str:
    """``"12 of 340 text boxes (4%)"`` lost with the skipped lines, and how many lines could not be read
    at all (their boxes are unknown)."""
    lost, unread = stats.get("lost_boxes", 0), stats.get("lost_unread_lines", 0)
    total = lost + kept_boxes
    text = f"{lost} of {total} text boxes ({100 * lost / total:.0f}%)" if total else "0 text boxes"
    if unread:
        text += f", plus the boxes of {unread} line{'s' if unread > 1 else ''} that could not be read"
    return text


def read_det_label_file(path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Read a PaddleOCR detection label file.

    Returns ``[(rel_image_path, polys float32 [K,4,2], ignore bool [K]), ...]``.
    Blank lines are skipped; errors name the file, the line number and what is
    wrong.  Polygons with more than 4 points become their minimum-area rectangle.
    """
    out = []
    for lineno, line in utf8_lines(path):  # tolerate a BOM from Windows editors
        if isinstance(line, ValueError):
            raise line
        if line.strip():
            out.append(parse_det_label_line(line, f"{path}:{lineno}"))
    return out


class TextDetDataset(paddle.io.Dataset):
    """Map-style text-detection dataset addressed by sampler keys.

    ``split="train"``: :class:`~zoo.data.text_det.transforms.DetTrainTransform` items
    (``image`` [3,S,S], ``shrink_map``, ``shrink_mask``, ``threshold_map``,
    ``threshold_mask`` [S,S]).  Other splits: ``image`` [3,H,W] resized to
    ``eval_size``, or, given ``limit_side_len``, by DetResizeForTest's ``limit_type`` mode to a size of
    its own (batches are then padded: ``valid_hw``, :func:`~zoo.data.text_det.transforms.pad_eval_batch`),
    ``shape`` [4] = (src_h, src_w, ratio_h, ratio_w), ``polys``
    float32 [P,4,2] in source pixels zero-padded to ``P = max_polys``,
    ``ignore`` int64 [P], ``num_polys`` int64 scalar.  ``aug`` goes to the train
    transform (flip_p, rotate, scale, max_tries, min_crop_side_ratio, shrink_ratio,
    min_text_size, thresh_min, thresh_max, mean, std).
    ``keep_freed_memory`` (``data.builder.keep_freed_memory``, :mod:`zoo.data.text_det.memory`): true, false
    or a byte count; :meth:`process_init` applies it in the process that loads items.
    """

    def __init__(self, root, label_file, split: str, seed: int, crop_size: int = 640,
                 eval_size: Sequence[int] = (736, 1280), max_polys: int = 128, samples=None,
                 channel_order: str = "BGR", line_numbers=None, keep_freed_memory: bool | int = True,
                 limit_side_len: int | None = None, limit_type: str = "min", **aug):
        super().__init__()
        self.keep_freed_bytes = check_keep_freed_memory(keep_freed_memory)
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if channel_order not in ("BGR", "RGB"):
            raise ValueError(f"data.builder.channel_order: expected BGR or RGB, got {channel_order!r}")
        # PaddleOCR decodes BGR and normalises those channels with ImageNet's RGB mean/std
        # (DecodeImage img_mode BGR + NormalizeImage); official DB weights expect exactly that.
        self.bgr = channel_order == "BGR"
        self.root, self.split, self.seed = Path(root), split, int(seed)
        self.label_file = Path(label_file)
        self.max_polys = int(max_polys)
        samples = read_det_label_file(self.label_file) if samples is None else samples
        counts = np.array([len(p) for _, p, _ in samples], dtype=np.int64)
        self.train = split == "train"
        if not self.train and len(counts) and counts.max() > self.max_polys:
            i = int(counts.argmax())
            raise ValueError(f"{self.label_file}: image {samples[i][0]} has {counts[i]} text boxes, more than "
                             f"max_polys={self.max_polys}; raise data max_polys")
        # Flat arrays instead of per-sample Python objects, so forked loader
        # workers do not copy the whole list page by page.
        self.paths = np.array([os.fsencode(p) for p, _, _ in samples], dtype=np.bytes_)
        self.offsets = np.concatenate([[0], np.cumsum(counts)])
        self.polys = np.concatenate([p for _, p, _ in samples] or [np.zeros((0, 4, 2), np.float32)])
        self.ignore = np.concatenate([g for _, _, g in samples] or [np.zeros(0, bool)])
        # Label-file line of each sample, so a load error at training time names it.
        self.lines = np.asarray(line_numbers, np.int64) if line_numbers is not None else None
        if self.train:
            self.transform = DetTrainTransform(crop_size, **aug)
        else:  # only the normalisation settings apply to eval
            self.transform = DetEvalTransform(eval_size, limit_side_len=limit_side_len, limit_type=limit_type,
                                              **{k: aug[k] for k in ("mean", "std", "normalize_on") if k in aug})
            if limit_side_len is not None:  # images of their own sizes: padded per batch
                self.collate_fn = functools.partial(pad_eval_batch, pad_value=self.transform.pad_value())
        # data.builder.normalize_on=device: items carry uint8 images; the loader normalises each
        # batch where it lands (zoo/data/loader.py), a quarter of the bytes through the queues.
        t = self.transform
        self.device_normalize = (t.mean, t.std) if t.normalize_on == "device" else None

    def __len__(self) -> int:
        return len(self.paths)

    def process_init(self) -> None:
        """Per-process set-up of the process that loads items: the loader calls it in each worker at
        its start, and in the main process when it loads there (``trainer.num_workers=0``)."""
        keep_freed_memory(self.keep_freed_bytes)

    def path(self, index: int) -> Path:
        """Absolute path of image ``index``."""
        return self.root / os.fsdecode(self.paths[index])

    def annotations(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Ground truth of image ``index``: polys float32 [K,4,2], ignore bool [K]."""
        a, b = self.offsets[index], self.offsets[index + 1]
        return self.polys[a:b].copy(), self.ignore[a:b].copy()

    def _where(self, index: int) -> str:
        return f"{self.label_file}:{self.lines[index]}" if self.lines is not None \
            else f"{self.label_file} (sample {index})"

    def train_item(self, index: int, epoch: int, clock=None) -> dict:
        """The train item of image ``index`` in ``epoch`` (``clock``: tools/benchmark.py --pipeline)."""
        path = self.path(index)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"{self._where(index)}: image file not found: {path}") from None
        polys, ignore = self.annotations(index)
        clip = lambda p, g, h, w: clip_polys_to_image(p, g, h, w)[:2]  # noqa: E731  (same rule unverified)
        donor = self._donor if self.transform.copy_paste is not None else None
        try:
            return self.transform.decode_and_apply(data, path, polys, ignore,
                                                   np.random.default_rng((self.seed, epoch, index)),
                                                   self.bgr, clip, clock, donor)
        except (OSError, ValueError) as e:
            raise type(e)(f"{self._where(index)}: {e}") from None

    def _donor(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CopyPaste's second image: a training sample drawn with ``rng`` (it may be the item itself, as
        upstream's draw allows), decoded whole, its polygons clipped to it."""
        index = int(rng.integers(len(self.paths)))
        try:
            img = (read_image_bgr if self.bgr else read_image_rgb)(self.path(index))
        except (OSError, ValueError) as e:
            raise type(e)(f"{self._where(index)} (CopyPaste's donor image): {e}") from None
        polys, ignore = self.annotations(index)
        polys, ignore, _ = clip_polys_to_image(polys, ignore, *img.shape[:2])
        return img, polys, ignore

    def __getitem__(self, key):
        key, n = int(key), len(self.paths)
        if n == 0 or key < 0:
            raise IndexError(f"{self.label_file}: invalid key {key} for {n} samples")
        epoch, index = divmod(key, n)
        if self.train:
            return self.train_item(index, epoch)
        try:
            # Decoded once in the order the model wants: OpenCV's own BGR needs no conversion.
            img = (read_image_bgr if self.bgr else read_image_rgb)(self.path(index))
        except (OSError, ValueError) as e:
            raise type(e)(f"{self._where(index)}: {e}") from None
        polys, ignore = self.annotations(index)
        polys, ignore, _ = clip_polys_to_image(polys, ignore, *img.shape[:2])  # same rule unverified
        item = self.transform(img)
        k = len(polys)
        item["polys"] = np.zeros((self.max_polys, 4, 2), np.float32)
        item["polys"][:k] = polys
        item["ignore"] = np.zeros(self.max_polys, np.int64)
        item["ignore"][:k] = ignore
        item["num_polys"] = np.array(k, dtype=np.int64)
        return item

    def __repr__(self) -> str:
        return f"TextDetDataset({self.label_file}, split={self.split!r}, n={len(self)}, {self.transform!r})"


class TextDetData:
    """Factory for train/val :class:`TextDetDataset` objects from one root.

    Defaults follow PaddleOCR's ICDAR2015 layout (``configs/det/det_mv3_db.yml``,
    data_dir ``train_data/icdar2015/text_localization/``): ``root/train_icdar2015_label.txt``
    and ``root/test_icdar2015_label.txt`` listing ``icdar_c4_train_imgs/...`` and
    ``ch4_test_images/...`` relative to ``root``.  ``aug`` keywords go to the
    train transform (see :class:`TextDetDataset`). Evaluation resizes to ``eval_size`` (H, W) or, with
    ``limit_side_len`` set, by DetResizeForTest's ``limit_type`` mode (max | min | resize_long).
    """

    def __init__(self, root, train_label: str = "train_icdar2015_label.txt",
                 val_label: str = "test_icdar2015_label.txt", crop_size: int = 640,
                 eval_size: Sequence[int] = (736, 1280), max_polys: int = 128,
                 channel_order: str = "BGR", bad_samples: str = "fail", verify_images: bool | str = True,
                 keep_freed_memory: bool | int = True, max_lost_fraction: float = DEFAULT_MAX_LOST_FRACTION,
                 limit_side_len: int | None = None, limit_type: str = "min", **aug):
        self.root = Path(root).expanduser()
        check_keep_freed_memory(keep_freed_memory)  # a bad value fails here, naming the key
        self.keep_freed_memory = keep_freed_memory
        self.channel_order = channel_order
        if bad_samples not in BAD_SAMPLE_POLICIES:
            raise ValueError(f"data.builder.bad_samples: expected one of {BAD_SAMPLE_POLICIES}, "
                             f"got {bad_samples!r}")
        if verify_images not in VERIFY_MODES:
            raise ValueError(f"data.builder.verify_images: expected true, false or decode, got {verify_images!r}")
        self.bad_samples, self.verify_images = bad_samples, verify_images
        self.max_lost_fraction = check_max_lost_fraction(max_lost_fraction)
        self.skipped: dict[str, list[str]] = {}
        self.label_files = {"train": train_label, "val": val_label}
        self.crop_size, self.eval_size = int(crop_size), tuple(int(v) for v in eval_size)
        if max_polys < 1:
            raise ValueError(f"max_polys must be >= 1, got {max_polys}")
        self.max_polys, self.aug = int(max_polys), dict(aug)
        self._samples: dict[str, list] = {}
        self._lines: dict[str, list[int]] = {}
        self.stats: dict[str, dict] = {}
        # Fail early on bad transform settings rather than at the first batch.
        DetTrainTransform(self.crop_size, **self.aug)
        DetEvalTransform(self.eval_size, limit_side_len=limit_side_len, limit_type=limit_type)
        self.limit_side_len, self.limit_type = limit_side_len, limit_type

    def prepare(self) -> None:
        """Hook for subclasses that must create ``root`` before it is read."""

    def label_path(self, split: str) -> Path:
        """The label file of ``split`` (checked to exist)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.prepare()
        if not self.root.is_dir():
            raise FileNotFoundError(f"data.root does not exist or is not a directory: {self.root}")
        path = self.root / self.label_files[split]
        if not path.is_file():
            raise FileNotFoundError(f"data.root {self.root}: no {split} label file {path} (PaddleOCR format "
                                    "lines 'relative/image.jpg<TAB>[{\"transcription\": ..., \"points\": ...}]')")
        return path

    def data_report(self) -> dict:
        """Per split: samples, skipped (with every message), clipped polygons, empty label lists."""
        return {split: dict(self.stats.get(split, {}), problems=list(self.skipped.get(split, [])))
                for split in self._samples}

    def build(self, split: str, seed: int) -> TextDetDataset:
        """Build the dataset for ``split`` ("train" or "val"); ``seed`` drives augmentation."""
        path = self.label_path(split)
        if split not in self._samples:
            lines: list[int] = []
            stats: dict = {}
            samples, problems = load_det_labels(path, self.bad_samples,
                                                self.root if self.verify_images else None, lines, stats,
                                                decode=self.verify_images == "decode")
            if problems:
                total = len(problems) + len(samples)
                kept_boxes = sum(len(s[1]) for s in samples)
                boxes = _lost_boxes_text(stats, kept_boxes)
                refuse_if_most_lost(split, path, len(problems), total, problems, self.max_lost_fraction,
                                    also=boxes, unit="label lines (images)")
                log.warning("data: skipped %d of %d samples of %s (%.0f%% of the %s split's label lines, each an "
                            "image) and %s; data.builder.bad_samples=skip, up to %s=%g; all listed in the run "
                            "folder's data_problems.txt; first: %s", len(problems), total, path,
                            100 * len(problems) / total, split, boxes, MAX_LOST_KEY, self.max_lost_fraction,
                            "; ".join(problems[:3]))
            if stats.get("clipped_polygons"):
                log.warning("data: %s: clipped %d polygons reaching outside their image (first at %s)", path,
                            stats["clipped_polygons"], ", ".join(stats["clipped_at"][:3]))
            stats["samples"], stats["skipped"] = len(samples), len(problems)
            self.stats[split] = stats
            if not samples:
                raise ValueError(f"{path}: no usable samples ({len(problems)} skipped)")
            self._samples[split], self.skipped[split], self._lines[split] = samples, problems, lines
        return TextDetDataset(self.root, path, split, seed, self.crop_size, self.eval_size, self.max_polys,
                              samples=self._samples[split], channel_order=self.channel_order,
                              line_numbers=self._lines[split], keep_freed_memory=self.keep_freed_memory,
                              limit_side_len=self.limit_side_len, limit_type=self.limit_type, **self.aug)
