"""COCO-format box detection data (``instances_*.json``) for PP-YOLOE.

Reading follows PaddleDetection ``ppdet/data/source/coco.py`` (``COCODataSet``):
category ids are mapped to contiguous labels in sorted-id order, crowd and
``ignore`` annotations are left out of training, boxes with width or height
below 1e-5 are skipped, and images without boxes are dropped from training
unless ``allow_empty``.  Unlike upstream, malformed input is an error naming the
json file, the annotation or image id and the key (or, with
``bad_samples="skip"``, the image is left out and counted), and every image is
kept for evaluation.

Boxes that are well-formed but do not fit their image are accepted by a rule,
as the PaddleOCR labels' polygons are (:func:`load_coco_instances`): a box
partly outside is clipped to the image, one with nothing inside it (wholly
outside, or under 1e-5 px left after clipping) is dropped, and an exact
duplicate (same ``image_id``, ``category_id`` and ``bbox``) is dropped, the
first kept. Each is counted and named by its annotation id (``data_report``,
the run folder's ``data_problems.txt``); evaluation's ground truth follows the
same rule.

Datasets are indexed by sampler keys (see :mod:`zoo.data.sampler`); train items
draw all augmentation randomness from ``np.random.default_rng((seed, epoch, index))``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import paddle

from zoo.data.coco.transforms import (
    INTERPOLATIONS,
    MEAN,
    STD,
    BoxEvalTransform,
    BoxTrainTransform,
    pad_targets,
)
from zoo.data.images import ImageDecodeError, read_image_rgb, verify_image_file
from zoo.data.skip_limit import DEFAULT_MAX_LOST_FRACTION, check_max_lost_fraction, lost_line, refuse_if_most_lost
from zoo.data.skip_limit import KEY as MAX_LOST_KEY
from zoo.data.text_encoding import decode_utf8

__all__ = ["COCODetData", "COCODetDataset", "CocoInstances", "PPYOLOE_MULTISCALE", "load_coco_instances"]
log = logging.getLogger(__name__)

BAD_SAMPLE_POLICIES = ("fail", "skip")
SPLITS = ("train", "val")
PPYOLOE_MULTISCALE = tuple(range(320, 769, 32))  # ppyoloe_reader.yml BatchRandomResize target_size
_EPS = 1e-5


@dataclass
class CocoInstances:
    """Result of :func:`load_coco_instances`.

    ``records``: per image ``{"file": Path, "im_id": int, "width": int, "height": int,
    "boxes": float32 [K,4] xyxy pixels, "labels": int64 [K]}``, sorted by image id.
    ``cat_ids`` sorted; label ``i`` is ``cat_ids[i]`` named ``class_names[i]``.
    ``skipped``: messages of images/annotations left out under ``bad_samples="skip"``.
    ``notes``: messages of the boxes the fit-to-image rule clipped or dropped (see
    :func:`load_coco_instances`) in the images read, by image id, then in file order.
    ``gt``: the COCO dict restricted to the kept images (only with ``keep_gt``).
    ``num_images``, ``num_annotations``: the json's entries; ``lost_annotations``: those left out
    with a skipped problem (their own or their image's); :attr:`lost_images` likewise.
    """

    records: list
    cat_ids: list
    class_names: list
    skipped: list = field(default_factory=list)
    num_crowd: int = 0
    num_degenerate: int = 0
    num_empty_dropped: int = 0
    degenerate_ids: list = field(default_factory=list)  # annotation ids of boxes of zero width or height
    clipped_ids: list = field(default_factory=list)     # ... of boxes partly outside their image (clipped)
    outside_ids: list = field(default_factory=list)     # ... of boxes with nothing inside their image (dropped)
    duplicate_ids: list = field(default_factory=list)   # ... of exact repeats of an earlier box (dropped)
    notes: list = field(default_factory=list)           # one message per box above: what was done and why
    gt: dict | None = None
    num_images: int = 0
    num_annotations: int = 0
    lost_annotations: int = 0

    @property
    def lost_images(self) -> int:
        """Images of the json left out with a skipped problem (not those dropped for having no boxes)."""
        return self.num_images - len(self.records) - self.num_empty_dropped


def _read_json(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"COCO annotation file not found: {path}") from None
    try:  # a BOM (Windows editors) is accepted, as in PaddleOCR label files; not UTF-8 is one clear error
        data = json.loads(decode_utf8(path, raw))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object with 'images', 'annotations', 'categories'")
    for key in ("images", "categories"):
        if not isinstance(data.get(key), list):
            raise ValueError(f"{path}: missing or non-list top-level key {key!r} "
                             "(a COCO instances file has 'images', 'annotations', 'categories')")
    return data


def _categories(data: dict, path: Path) -> tuple[list[int], list[str]]:
    cats = {}
    for k, cat in enumerate(data["categories"]):
        if not isinstance(cat, dict) or not isinstance(cat.get("id"), int) or "name" not in cat:
            raise ValueError(f"{path}: categories[{k}]: expected an object with integer 'id' and 'name', got {cat!r}")
        if cat["id"] in cats:
            raise ValueError(f"{path}: categories[{k}]: duplicate category id {cat['id']}")
        cats[cat["id"]] = str(cat["name"])
    if not cats:
        raise ValueError(f"{path}: 'categories' is empty")
    ids = sorted(cats)
    return ids, [cats[i] for i in ids]


def _check_image(img, k: int, path: Path) -> str:
    """Validate one 'images' entry; returns a description for messages."""
    if not isinstance(img, dict):
        raise ValueError(f"{path}: images[{k}]: expected an object, got {img!r}")
    for key in ("id", "file_name", "width", "height"):
        if key not in img:
            raise ValueError(f"{path}: images[{k}] (id={img.get('id')}): missing key {key!r}")
    where = f"{path}: image id={img['id']} ({img['file_name']})"
    if isinstance(img["id"], bool) or not isinstance(img["id"], int):
        raise ValueError(f"{where}: 'id' must be an integer, got {img['id']!r}")
    for key in ("width", "height"):
        v = img[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{where}: '{key}' must be a positive number, got {v!r}")
    return where


def _check_bbox(ann: dict, where: str) -> list[float]:
    bbox = ann["bbox"]
    if (not isinstance(bbox, (list, tuple)) or len(bbox) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)):
        raise ValueError(f"{where}: 'bbox' must be 4 numbers [x, y, w, h], got {bbox!r}")
    if not all(math.isfinite(v) for v in bbox):
        raise ValueError(f"{where}: 'bbox' has non-finite numbers: {bbox!r}")
    if bbox[2] < 0 or bbox[3] < 0:
        raise ValueError(f"{where}: negative bbox width/height in [x, y, w, h] = {bbox!r}")
    return [float(v) for v in bbox]


@dataclass
class _Image:
    """One entry of the json's ``images`` while its annotations are read."""

    img: dict                                         # the json's entry
    where: str                                        # "<json>: images[k] (id=N, file)" for messages
    boxes: list = field(default_factory=list)         # (xyxy, label) to train on
    kept: list = field(default_factory=list)          # the annotations evaluation's ground truth holds
    fitted: list = field(default_factory=list)        # (kind, annotation id, note) of boxes fitted to the image
    annotations: int = 0                              # annotations naming this image, good or bad


def _index_images(data: dict, path: Path, problem) -> tuple[dict, set]:
    """``{image id: _Image}`` and the ids of bad entries."""
    images, bad = {}, set()
    for k, img in enumerate(data["images"]):
        try:
            where = _check_image(img, k, path)
            if img["id"] in images:
                raise ValueError(f"{where}: duplicate image id {img['id']}")
        except ValueError as e:
            problem(str(e))
            if isinstance(img, dict) and isinstance(img.get("id"), int):
                bad.add(img["id"])  # its annotations go with it
            continue
        images[img["id"]] = _Image(img, where)
    return images, bad


def _fmt(values) -> str:
    return "[" + ", ".join(f"{float(v):g}" for v in values) + "]"


def _fit_box(ann: dict, img: dict, where: str, seen: dict):
    """The box of ``ann`` under the fit-to-image rule: ``(kind, xyxy, message)``, ``kind`` None
    (inside its image, kept as it is), ``"clipped"`` (partly outside: clipped, kept), or
    ``"duplicate"``, ``"degenerate"``, ``"outside"`` (dropped: ``xyxy`` None), checked in that order.
    ``seen`` maps the image's earlier boxes, ``(category_id, x, y, w, h)``, to their annotation ids.

    PaddleDetection's ``COCODataSet`` (``ppdet/data/source/coco.py``) keeps every box with
    ``area > 0`` and width and height above 1e-5 as it is in the file, logging the others as
    "invalid bbox" (its 2019 version clipped to ``[0, w-1] x [0, h-1]`` first and dropped what had no
    area left); it neither drops repeated boxes nor says which boxes reach outside. Here coordinates
    are continuous, so boxes are clipped to ``[0, width] x [0, height]``.
    """
    x, y, w, h = (float(v) for v in ann["bbox"])
    shown = _fmt(ann["bbox"])
    key = (ann["category_id"], x, y, w, h)
    if key in seen:  # the same object twice would count twice in the loss and in mAP's recall
        return "duplicate", None, (f"{where}: the same image_id, category_id and bbox {shown} as annotation "
                                   f"id={seen[key]}; dropped (the first is kept)")
    seen[key] = ann["id"]
    if w < _EPS or h < _EPS:
        return "degenerate", None, f"{where}: bbox {shown} has zero width or height; dropped"
    width, height = float(img["width"]), float(img["height"])
    x1, y1 = min(max(x, 0.0), width), min(max(y, 0.0), height)
    x2, y2 = min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)
    size = f"{img['width']:g}x{img['height']:g}"
    if x2 - x1 < _EPS or y2 - y1 < _EPS:
        return "outside", None, (f"{where}: bbox {shown} lies outside the {size} (w x h) image (under 1e-5 px "
                                 "of it inside); dropped")
    if (x1, y1, x2, y2) == (x, y, x + w, y + h):
        return None, [x1, y1, x2, y2], ""
    return "clipped", [x1, y1, x2, y2], (f"{where}: bbox {shown} reaches outside the {size} (w x h) image; "
                                         f"clipped to {_fmt([x1, y1, x2 - x1, y2 - y1])}")


def load_coco_instances(ann_file, image_root, bad_samples: str = "fail", allow_empty: bool = False,
                        keep_gt: bool = False, verify_images: bool = False) -> CocoInstances:
    """Read a COCO instances json; image files are looked up under ``image_root``.

    ``bad_samples="fail"`` raises at the first problem; ``"skip"`` leaves out the
    affected image (or an annotation of an unknown image) and lists the message
    in ``skipped``.  Images without boxes are kept only if ``allow_empty``.  ``verify_images``
    checks each kept image file is complete and has the json's width and height (header and end
    marker only, see :func:`zoo.data.images.verify_image_file`).

    Well-formed boxes that do not fit their image follow a rule instead (:func:`_fit_box`): an exact
    repeat of an earlier box of the image (same ``category_id`` and ``bbox``) is dropped
    (``duplicate_ids``), a box of zero width or height is dropped (``degenerate_ids``), one with
    nothing inside the image is dropped (``outside_ids``), and one partly outside is clipped to it
    (``clipped_ids``); ``notes`` says for each which box and what was done. Evaluation's ground
    truth (``keep_gt``) holds the same boxes, clipped ones clipped (``area`` is kept when given).
    """
    if bad_samples not in BAD_SAMPLE_POLICIES:
        raise ValueError(f"data.builder.bad_samples: expected one of {BAD_SAMPLE_POLICIES}, got {bad_samples!r}")
    path, image_root = Path(ann_file), Path(image_root)
    data = _read_json(path)
    cat_ids, names = _categories(data, path)
    label_of = {c: i for i, c in enumerate(cat_ids)}
    out = CocoInstances([], cat_ids, names)

    def problem(msg: str, exc=ValueError):
        if bad_samples == "fail":
            raise exc(msg)
        out.skipped.append(msg)

    images, bad = _index_images(data, path, problem)
    _read_annotations(data, path, images, bad, label_of, out, problem)
    out.num_images, out.lost_annotations = len(data["images"]), out.num_annotations
    gt_anns = []
    for iid in sorted(images):
        entry = images[iid]
        if iid in bad or not _image_file_ok(entry, image_root, verify_images, problem):
            continue
        out.lost_annotations -= entry.annotations  # read: what follows is the fit-to-image rule, not loss
        for kind, ann_id, note in entry.fitted:  # counted for the images read, whether their boxes all went or not
            getattr(out, f"{kind}_ids").append(ann_id)
            out.notes.append(note)
        if not entry.boxes and not allow_empty:
            out.num_empty_dropped += 1
            continue
        img = entry.img
        out.records.append({"file": image_root / img["file_name"], "im_id": iid, "width": int(img["width"]),
                            "height": int(img["height"]),
                            "boxes": np.array([b for b, _ in entry.boxes], np.float32).reshape(-1, 4),
                            "labels": np.array([c for _, c in entry.boxes], np.int64)})
        if keep_gt:
            # COCOeval reads 'area' and 'iscrowd'; user-made files may lack them.
            gt_anns.append((img, [dict(a, area=a.get("area", a["bbox"][2] * a["bbox"][3]),
                                       iscrowd=int(a.get("iscrowd", 0))) for a in entry.kept]))
    out.num_degenerate = len(out.degenerate_ids)
    if keep_gt:
        out.gt = {"images": [img for img, _ in gt_anns], "annotations": [a for _, anns in gt_anns for a in anns],
                  "categories": data["categories"]}
    return out


def _read_annotations(data: dict, path: Path, images: dict, bad: set, label_of: dict, out: CocoInstances,
                      problem) -> None:
    """Sort every annotation into its image (:class:`_Image`): a box to train on (fitted to its image,
    :func:`_fit_box`), a crowd region (ground truth only), or a problem; an image with a bad
    annotation joins ``bad``."""
    seen: dict[int, dict] = {}  # per image: (category_id, x, y, w, h) -> first annotation id
    anns = data.get("annotations") or []
    if not isinstance(anns, list):
        raise ValueError(f"{path}: 'annotations' must be a list")
    out.num_annotations = len(anns)
    for k, ann in enumerate(anns):
        if not isinstance(ann, dict):
            problem(f"{path}: annotations[{k}]: expected an object, got {ann!r}")
            continue
        iid = ann.get("image_id")
        entry = images.get(iid) if isinstance(iid, int) else None
        if entry is not None:
            entry.annotations += 1
        name = f", {entry.img['file_name']}" if entry else ""
        where = f"{path}: annotation id={ann.get('id')} (image id={iid}{name})"
        missing = [key for key in ("id", "image_id", "category_id", "bbox") if key not in ann]
        try:
            if missing:
                raise ValueError(f"{where}: missing key {missing[0]!r}")
            if entry is None:
                if iid not in bad:  # annotations of skipped images are dropped silently
                    problem(f"{where}: image_id {iid} has no entry in 'images'")
                continue
            _check_bbox(ann, where)
            if ann["category_id"] not in label_of:
                raise ValueError(f"{where}: unknown category_id {ann['category_id']!r}; known: {list(label_of)}")
        except ValueError as e:
            problem(str(e))
            if entry is not None:
                bad.add(iid)
            continue
        if ann.get("iscrowd", 0) or ann.get("ignore", 0):
            out.num_crowd += 1
            entry.kept.append(ann)
            continue
        kind, box, note = _fit_box(ann, entry.img, where, seen.setdefault(iid, {}))
        if kind is not None:
            entry.fitted.append((kind, ann["id"], note))
        if box is None:
            continue
        entry.boxes.append((box, label_of[ann["category_id"]]))
        # evaluation's ground truth: the box as trained on (a given 'area', the segment's, is kept)
        entry.kept.append(ann if kind is None else dict(ann, bbox=[box[0], box[1], box[2] - box[0], box[3] - box[1]]))


def _image_file_ok(entry: _Image, image_root: Path, verify_images: bool, problem) -> bool:
    """The image file exists (and, with ``verify_images``, is complete and of the json's size)."""
    file = image_root / entry.img["file_name"]
    if not file.is_file():
        problem(f"{entry.where}: image file {file} not found (file_name under image root {image_root})",
                FileNotFoundError)
        return False
    if verify_images:
        try:
            verify_image_file(file, (entry.img["height"], entry.img["width"]))
        except (OSError, ImageDecodeError) as e:
            problem(f"{entry.where}: {e}")
            return False
    return True


class COCODetDataset(paddle.io.Dataset):
    """Map-style box-detection dataset addressed by sampler keys.

    Train items: ``image`` [3,S,S], ``gt_bbox`` [M,4] xyxy pixels of that image (with
    ``multiscale``: ``image`` is the augmented crop, HWC uint8 at its own size, and ``gt_bbox`` in its
    pixels; :meth:`collate_fn` resizes it once to the batch's size),
    ``gt_class`` [M,1] int32, ``pad_gt_mask`` [M,1], ``epoch`` and ``key`` int64.
    Eval items: ``image`` [3,E,E], ``im_id`` int64, ``scale_factor`` [2] (scale_y,
    scale_x), ``orig_size`` int64 [2] (h, w), and padded ``gt_*`` in source pixels.
    Batch with :meth:`collate_fn` (multi-scale resizing of train batches).
    """

    def __init__(self, records, split: str, seed: int, transform, max_boxes: int = 100, multiscale=None,
                 source: str = "COCO data", coco_factory=None, class_names=(), label_to_cat_id=None):
        super().__init__()
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.split, self.seed, self.train, self.source = split, int(seed), split == "train", str(source)
        self.transform, self.max_boxes = transform, int(max_boxes)
        self.multiscale = tuple(int(s) for s in multiscale) if multiscale and self.train else None
        # Flat arrays instead of per-record dicts, so forked loader workers do not copy them page by page.
        self.files = np.array([os.fsencode(r["file"]) for r in records], dtype=np.bytes_)
        self.im_ids = np.array([r["im_id"] for r in records], np.int64)
        self.sizes = np.array([(r["height"], r["width"]) for r in records], np.int64).reshape(-1, 2)
        counts = np.array([len(r["boxes"]) for r in records], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)])
        self.boxes = np.concatenate([r["boxes"] for r in records] or [np.zeros((0, 4), np.float32)])
        self.labels = np.concatenate([r["labels"] for r in records] or [np.zeros(0, np.int64)])
        # What the evaluation needs besides the images (COCODetData.build passes them).
        self._coco_factory = coco_factory
        self.class_names: list[str] = list(class_names)
        self.label_to_cat_id: dict[int, int] = dict(label_to_cat_id or {})

    def __len__(self) -> int:
        return len(self.files)

    @property
    def coco(self):
        """pycocotools ``COCO`` of this split's ground truth (the metric's reference), built on first use."""
        if self._coco_factory is None:
            raise AttributeError(f"{self.source}: this dataset was built without its COCO ground truth")
        return self._coco_factory()

    def annotations(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Ground truth of image ``index``: boxes float32 [K,4] xyxy, labels int64 [K]."""
        a, b = self.offsets[index], self.offsets[index + 1]
        return self.boxes[a:b].copy(), self.labels[a:b].copy()

    def __getitem__(self, key):
        key, n = int(key), len(self.files)
        if n == 0 or key < 0:
            raise IndexError(f"{self.source}: invalid key {key} for {n} samples")
        epoch, index = divmod(key, n)
        path = os.fsdecode(self.files[index])
        try:
            img = read_image_rgb(path)
        except (OSError, ValueError) as e:
            raise type(e)(f"{e} (image id {self.im_ids[index]} of {self.source})") from None
        if img.shape[:2] != tuple(self.sizes[index]):
            raise ValueError(f"{self.source}: image id {self.im_ids[index]} ({path}) decodes to {img.shape[:2]} "
                             f"(h, w) but the json says {tuple(self.sizes[index])}")
        boxes, labels = self.annotations(index)
        if self.train:
            rng = np.random.default_rng((self.seed, epoch, index))
            if self.multiscale:  # the crop at its own size: collate_fn resizes it once, to the batch's size
                image, boxes, labels = self.transform.augment(img, boxes, labels, rng)
            else:
                image, boxes, labels = self.transform(img, boxes, labels, rng)
            item = {"image": image, **pad_targets(boxes, labels, self.max_boxes)}
            item["epoch"], item["key"] = np.array(epoch, np.int64), np.array(key, np.int64)
            return item
        image, scale = self.transform(img)
        return {"image": image, "im_id": np.array(self.im_ids[index], np.int64), "scale_factor": scale,
                "orig_size": self.sizes[index].copy(), **pad_targets(boxes, labels, self.max_boxes)}

    def batch_size_choice(self, first_key: int) -> tuple[int, int]:
        """``(size, interpolation)`` of the train batch whose first key is ``first_key``."""
        rng = np.random.default_rng((self.seed, int(first_key), 7))
        return int(self.multiscale[rng.integers(len(self.multiscale))]), \
            int(INTERPOLATIONS[rng.integers(len(INTERPOLATIONS))])

    def collate_fn(self, batch: list[dict]) -> dict:
        """Stack items. With ``multiscale`` (train) each item is its crop at its own size
        (``BoxTrainTransform.augment``): every crop is resized once, straight to the batch's size
        and interpolation chosen from (seed, first key), its ``gt_bbox`` scaled by its own ratios
        and clipped, then normalised (PaddleDetection's ``BatchRandomResize`` on the
        ``sample_transforms``' output, ``keep_ratio`` False, ``random_interp``)."""
        if self.multiscale:
            size, interp = self.batch_size_choice(int(batch[0]["key"]))
            batch = [dict(item) for item in batch]
            for item in batch:
                item["image"], item["gt_bbox"] = self.transform.finish(item["image"], item["gt_bbox"], size, interp)
        return {k: np.stack([np.asarray(item[k]) for item in batch]) for k in batch[0]}

    def __repr__(self) -> str:
        return (f"COCODetDataset({self.source}, split={self.split!r}, n={len(self)}, {self.transform!r}, "
                f"multiscale={self.multiscale})")


def _ids(ids: list, limit: int = 10) -> str:
    return ", ".join(map(str, ids[:limit])) + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")


class COCODetData:
    """Factory for train/val :class:`COCODetDataset` objects from a COCO root.

    Defaults follow PaddleDetection's COCO layout and ``ppyoloe_reader.yml``
    (640 train/eval size, BatchRandomResize 320..768 step 32).  ``distort``,
    ``expand``, ``crop``, ``flip`` are probabilities of those augmentations.
    ``bad_samples="skip"`` may leave out up to ``max_lost_fraction`` of a split's images; more is an
    error naming the json and the counts (:mod:`zoo.data.skip_limit`).
    """

    def __init__(self, root, train_ann: str = "annotations/instances_train2017.json",
                 val_ann: str = "annotations/instances_val2017.json", train_images: str = "train2017",
                 val_images: str = "val2017", image_size: int = 640, eval_size: int = 640,
                 multiscale=PPYOLOE_MULTISCALE, max_boxes: int = 100, allow_empty: bool = False,
                 bad_samples: str = "fail", flip: float = 0.5, distort: float = 0.5, expand: float = 0.5,
                 expand_ratio: float = 4.0, crop: float = 1.0, mean=MEAN, std=STD, channel_order: str = "RGB",
                 verify_images: bool = True, max_lost_fraction: float = DEFAULT_MAX_LOST_FRACTION):
        if bad_samples not in BAD_SAMPLE_POLICIES:
            raise ValueError(f"data.builder.bad_samples: expected one of {BAD_SAMPLE_POLICIES}, got {bad_samples!r}")
        if channel_order not in ("BGR", "RGB"):
            raise ValueError(f"data.builder.channel_order: expected BGR or RGB, got {channel_order!r}")
        if max_boxes < 1:
            raise ValueError(f"data.builder.max_boxes must be >= 1, got {max_boxes}")
        if multiscale is not None and (len(multiscale) == 0 or min(int(s) for s in multiscale) < 8):
            raise ValueError(f"data.builder.multiscale: expected a list of sizes >= 8 or null, got {multiscale!r}")
        self.root = Path(root).expanduser()
        self.files = {"train": (train_ann, train_images), "val": (val_ann, val_images)}
        self.multiscale = tuple(int(s) for s in multiscale) if multiscale is not None else None
        self.max_boxes, self.allow_empty, self.bad_samples = int(max_boxes), bool(allow_empty), bad_samples
        self.verify_images = bool(verify_images)
        self.max_lost_fraction = check_max_lost_fraction(max_lost_fraction)
        bgr = channel_order == "BGR"
        self.train_transform = BoxTrainTransform(image_size, flip, distort, expand, expand_ratio, crop,
                                                 mean=mean, std=std, bgr=bgr)
        self.eval_transform = BoxEvalTransform(eval_size, mean, std, bgr)
        self._loaded: dict[str, CocoInstances] = {}
        self._coco: dict = {}

    def prepare(self) -> None:
        """Hook for subclasses that must create ``root`` before it is read."""

    def paths(self, split: str) -> tuple[Path, Path]:
        """(annotation json, image folder) of ``split``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.prepare()
        if not self.root.is_dir():
            raise FileNotFoundError(f"data.root does not exist or is not a directory: {self.root}")
        ann, images = self.files[split]
        return self.root / ann, self.root / images

    def instances(self, split: str) -> CocoInstances:
        """The parsed annotations of ``split`` (cached; eval keeps empty images and the GT dict)."""
        if split not in self._loaded:
            ann, images = self.paths(split)
            train = split == "train"
            inst = load_coco_instances(ann, images, self.bad_samples, self.allow_empty or not train, not train,
                                       self.verify_images)
            if inst.skipped:
                lost_anns = f"{inst.lost_annotations} of {inst.num_annotations} annotations"
                refuse_if_most_lost(split, ann, inst.lost_images, inst.num_images, inst.skipped,
                                    self.max_lost_fraction, lost_anns)
                log.warning("data: %s: left out %s (data.builder.bad_samples=skip, up to %s=%g); first: %s", ann,
                            lost_line(split, inst.lost_images, inst.num_images, len(inst.skipped), lost_anns),
                            MAX_LOST_KEY, self.max_lost_fraction, "; ".join(inst.skipped[:3]))
            for ids, what in ((inst.clipped_ids, "clipped %d boxes reaching outside their image"),
                              (inst.outside_ids, "dropped %d boxes lying outside their image"),
                              (inst.degenerate_ids, "dropped %d boxes of zero width or height"),
                              (inst.duplicate_ids, "dropped %d duplicate boxes (same image, category and bbox "
                                                   "as an earlier one, which is kept)")):
                if ids:
                    log.warning(f"data: %s: {what} (annotation ids %s)", ann, len(ids), _ids(ids))
            if inst.skipped or inst.notes:
                log.warning("data: all %d problems and %d boxes clipped or dropped of %s are listed in the run "
                            "folder's data_problems.txt", len(inst.skipped), len(inst.notes), ann)
            if not inst.records:
                raise ValueError(f"{ann}: no usable images ({len(inst.skipped)} skipped, "
                                 f"{inst.num_empty_dropped} without boxes; allow_empty={self.allow_empty})")
            for other in self._loaded.values():
                if other.cat_ids != inst.cat_ids:
                    raise ValueError(f"{ann}: category ids {inst.cat_ids} differ from the other split's "
                                     f"{other.cat_ids}")
            over = sum(len(r["boxes"]) > self.max_boxes for r in inst.records)
            if over and train:
                log.warning("data: %d images of %s have more than max_boxes=%d boxes; extra boxes are cut off",
                            over, ann, self.max_boxes)
            self._loaded[split] = inst
        return self._loaded[split]

    def data_report(self) -> dict:
        """Per split: images, skipped problems (all messages), crowd boxes, and the boxes the fit-to-image
        rule clipped or dropped: counts, the first 100 annotation ids of each kind, and all their
        messages (``notes``, which go to data_problems.txt with the problems)."""
        report = {}
        for split, inst in self._loaded.items():
            r = {"samples": len(inst.records), "skipped": len(inst.skipped), "problems": list(inst.skipped),
                 "images_in_file": inst.num_images, "images_lost": inst.lost_images,
                 "annotations_in_file": inst.num_annotations, "annotations_lost": inst.lost_annotations,
                 "crowd_boxes": inst.num_crowd}
            for kind in ("clipped", "outside", "degenerate", "duplicate"):
                ids = getattr(inst, f"{kind}_ids")
                r[f"{kind}_boxes"], r[f"{kind}_ids"] = len(ids), ids[:100]
            report[split] = dict(r, empty_images_dropped=inst.num_empty_dropped, notes=list(inst.notes))
        return report

    def build(self, split: str, seed: int) -> COCODetDataset:
        """Build the dataset for ``split`` ("train" or "val"); ``seed`` drives augmentation."""
        inst = self.instances(split)
        transform = self.train_transform if split == "train" else self.eval_transform
        return COCODetDataset(inst.records, split, seed, transform, self.max_boxes, self.multiscale,
                              source=str(self.paths(split)[0]), coco_factory=functools.partial(self.coco, split),
                              class_names=self.class_names, label_to_cat_id=self.label_to_cat_id)

    def coco(self, split: str = "val"):
        """pycocotools ``COCO`` of the images ``build(split)`` holds (for :class:`~zoo.metrics.COCOMetric`)."""
        if split not in self._coco:
            from pycocotools.coco import COCO

            inst = self.instances(split)
            if inst.gt is None:  # train is parsed without it; parse again keeping every image
                ann, images = self.paths(split)
                inst = load_coco_instances(ann, images, self.bad_samples, self.allow_empty, keep_gt=True)
            coco = COCO()
            coco.dataset = inst.gt
            with contextlib.redirect_stdout(io.StringIO()):
                coco.createIndex()
            self._coco[split] = coco
        return self._coco[split]

    def _any(self) -> CocoInstances:
        return next(iter(self._loaded.values())) if self._loaded else self.instances("val")

    @property
    def class_names(self) -> list[str]:
        """Category names in label order."""
        return list(self._any().class_names)

    @property
    def num_classes(self) -> int:
        return len(self._any().cat_ids)

    @property
    def label_to_cat_id(self) -> dict[int, int]:
        """Contiguous label -> COCO category id."""
        return dict(enumerate(self._any().cat_ids))
