"""ImageNet-style classification data: PaddleClas list files or class folders.

Two root layouts are understood, chosen per split:

* PaddleClas list files: ``root/train_list.txt`` with lines
  ``relative/path.jpg <label>`` (space- or tab-separated, paths relative to
  ``root``); optional ``root/labels.txt`` with one class name per line.
* Class folders: ``root/train/<class_name>/*.jpg`` and ``root/val/...``;
  labels are the sorted class folder names of ``train/``.

Datasets are indexed by sampler *keys* (see :mod:`zoo.data.sampler`) and draw
all augmentation randomness from ``np.random.default_rng((seed, epoch, index))``;
a training set with Mixup mixes each batch in its collate function
(:mod:`zoo.data.classification.mixup`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import paddle

from zoo.data.classification.mixup import MixupCollate, check_mixup_alpha
from zoo.data.classification.transforms import ClassificationTransform
from zoo.data.images import read_image_rgb

__all__ = ["ClassificationData", "ClassificationDataset"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
SPLITS = ("train", "val")
LINE_FORMAT = "'<path> <integer label>'"


def parse_list_file(list_path: Path, num_classes: int | None = None) -> tuple[list[str], np.ndarray]:
    """Parse a PaddleClas list file into (relative paths, int64 labels).

    The label is the last whitespace-separated token, so paths may contain
    spaces.  Blank lines are skipped.  Errors name file, line number and line.
    """
    paths, labels = [], []
    with open(list_path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.strip()
            if not line:
                continue
            parts = line.rsplit(None, 1)
            try:
                if len(parts) != 2:
                    raise ValueError
                label = int(parts[1])
            except ValueError:
                raise ValueError(
                    f"{list_path}:{lineno}: malformed line {line!r}; expected {LINE_FORMAT}"
                ) from None
            if label < 0 or (num_classes is not None and label >= num_classes):
                bound = num_classes if num_classes is not None else "num_classes"
                raise ValueError(
                    f"{list_path}:{lineno}: label {label} out of range [0, {bound}) in line "
                    f"{line!r}; expected {LINE_FORMAT} with 0 <= label < {bound}"
                )
            paths.append(parts[0].strip())
            labels.append(label)
    return paths, np.asarray(labels, dtype=np.int64)


def scan_class_folder(split_dir: Path) -> list[str]:
    """Sorted names of the class sub-folders of ``split_dir``."""
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def scan_images(split_dir: Path, class_names: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """List ``split_dir/<class>/<image>`` files (sorted) with labels from ``class_names``."""
    index = {name: i for i, name in enumerate(class_names)}
    paths, labels = [], []
    for name in scan_class_folder(split_dir):
        if name not in index:
            raise ValueError(
                f"class folder {split_dir / name} is not one of the {len(class_names)} "
                f"training classes"
            )
        files = sorted(
            e.name for e in os.scandir(split_dir / name)
            if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS)
        )
        paths += [f"{split_dir.name}/{name}/{fname}" for fname in files]
        labels += [index[name]] * len(files)
    return paths, np.asarray(labels, dtype=np.int64)


class ClassificationDataset(paddle.io.Dataset):
    """Map-style dataset of (image file, label) addressed by sampler keys.

    ``dataset[key]`` decodes ``index = key % N`` and ``epoch = key // N`` and
    returns ``{"image": float32 [3,H,W], "label": int64 scalar}``. With ``mixup_alpha`` the item
    also carries its ``key`` and :attr:`collate_fn` mixes each batch (``mix_label``, ``mix_lam``).
    """

    def __init__(self, root: Path, paths: Sequence[str], labels: np.ndarray, transform, seed: int, name: str = "",
                 mixup_alpha: float | None = None):
        super().__init__()
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.root = Path(root)
        # Fixed-width bytes array instead of a list of str: no per-item Python
        # objects, so forked DataLoader workers do not copy the list page by page.
        self.paths = np.array([os.fsencode(p) for p in paths], dtype=np.bytes_)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.seed = int(seed)
        self.name = name
        self.mixup_alpha = check_mixup_alpha(mixup_alpha)
        if self.mixup_alpha is not None:  # build_loader batches with a dataset's collate_fn
            self.collate_fn = MixupCollate(self.mixup_alpha, self.seed, len(self.labels))

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, index: int) -> Path:
        """Absolute path of sample ``index``."""
        return self.root / os.fsdecode(self.paths[index])

    def __getitem__(self, key):
        key = int(key)
        n = len(self.labels)
        if n == 0 or key < 0:
            raise IndexError(f"{self.name or 'dataset'}: invalid key {key} for {n} samples")
        epoch, index = divmod(key, n)
        path = self.path(index)
        try:
            img = read_image_rgb(path)
        except (OSError, ValueError) as e:
            # Re-raise the same type with the sample's coordinates added.
            raise type(e)(f"{e} (dataset {self.name!r}, index {index}, key {key})") from None
        rng = np.random.default_rng((self.seed, epoch, index))
        item = {"image": self.transform(img, rng), "label": self.labels[index]}
        if self.mixup_alpha is not None:
            item["key"] = np.array(key, np.int64)
        return item

    def __repr__(self) -> str:
        mix = f", mixup_alpha={self.mixup_alpha}" if self.mixup_alpha is not None else ""
        return f"ClassificationDataset({self.name!r}, root={self.root}, n={len(self)}, {self.transform!r}{mix})"


class ClassificationData:
    """Factory for train/val :class:`ClassificationDataset` objects from one root.

    ``num_classes`` is taken from the argument, else ``root/labels.txt``, else
    the class folders, else ``1 + max label`` over the list files.

    ``crop_sampler``: the training crop box, ``torchvision`` (default: log-uniform aspect, ten
    tries, centred fallback) or ``paddleclas`` (PaddleClas's ``RandCropImage``: uniform aspect,
    area capped so the box fits). ``mixup_alpha``: Mixup of the training batches with
    ``lam ~ Beta(alpha, alpha)`` as PaddleClas's ``MixupOperator``; null = off (default).
    """

    def __init__(
        self,
        root,
        train_list: str = "train_list.txt",
        val_list: str = "val_list.txt",
        image_size: int = 224,
        resize_size: int = 256,
        mean: Sequence[float] = (0.485, 0.456, 0.406),
        std: Sequence[float] = (0.229, 0.224, 0.225),
        num_classes: int | None = None,
        train_aug: bool = True,
        train_crop_scale: Sequence[float] = (0.08, 1.0),
        crop_sampler: str = "torchvision",
        mixup_alpha: float | None = None,
    ):
        self.root = Path(root).expanduser()
        self.list_files = {"train": train_list, "val": val_list}
        self.image_size, self.resize_size = int(image_size), int(resize_size)
        self.mean, self.std = tuple(mean), tuple(std)
        self.train_aug = bool(train_aug)
        self.train_crop_scale = tuple(train_crop_scale)
        self.crop_sampler = crop_sampler
        self.mixup_alpha = check_mixup_alpha(mixup_alpha)
        if num_classes is not None and num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self._num_classes = num_classes
        self._class_names: list[str] | None = None
        self._cache: dict[str, tuple[list[str], np.ndarray]] = {}
        # Fail early on bad transform settings rather than at the first batch.
        self._transform(train=True)

    def prepare(self) -> None:
        """Hook for subclasses that must create ``root`` before it is read."""

    def _transform(self, train: bool) -> ClassificationTransform:
        return ClassificationTransform(
            train, self.image_size, self.resize_size, self.mean, self.std, crop_scale=self.train_crop_scale,
            crop_sampler=self.crop_sampler,
        )

    def _check_root(self) -> None:
        self.prepare()
        if not self.root.is_dir():
            raise FileNotFoundError(f"data.root does not exist or is not a directory: {self.root}")

    def _source(self, split: str) -> tuple[str, Path]:
        """Which layout serves ``split``: ("list", list file) or ("folders", dir)."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self._check_root()
        list_path = self.root / self.list_files[split]
        if list_path.is_file():
            return "list", list_path
        if (self.root / split).is_dir():
            return "folders", self.root / split
        raise FileNotFoundError(
            f"data.root {self.root}: no {split} data found; looked for a PaddleClas list file "
            f"{list_path} (lines {LINE_FORMAT}) or class folders {self.root / split}/<class_name>/*.jpg"
        )

    @property
    def class_names(self) -> list[str] | None:
        """Class names from ``labels.txt`` or the class folders, if available."""
        if self._class_names is None:
            self._check_root()
            labels_txt = self.root / "labels.txt"
            if labels_txt.is_file():
                lines = labels_txt.read_text(encoding="utf-8").splitlines()
                self._class_names = [ln.strip() for ln in lines if ln.strip()]
            else:
                for split in SPLITS:
                    if (self.root / split).is_dir() and not (self.root / self.list_files[split]).is_file():
                        self._class_names = scan_class_folder(self.root / split)
                        break
        return self._class_names

    @property
    def num_classes(self) -> int:
        """Number of classes (see class docstring for where it comes from)."""
        if self._num_classes is None:
            names = self.class_names
            if names is not None:
                self._num_classes = len(names)
            else:
                found = [self._samples(s)[1] for s in SPLITS if self._has_split(s)]
                top = max((int(lab.max()) for lab in found if len(lab)), default=-1)
                if top < 0:
                    raise ValueError(f"data.root {self.root}: cannot infer num_classes from empty lists")
                self._num_classes = top + 1
        return self._num_classes

    def _has_split(self, split: str) -> bool:
        try:
            self._source(split)
        except FileNotFoundError:
            return False
        return True

    def _samples(self, split: str) -> tuple[list[str], np.ndarray]:
        if split not in self._cache:
            kind, where = self._source(split)
            if kind == "list":
                # Range-check only when the class count is known independently.
                known = self._num_classes if self._num_classes is not None else (
                    len(self.class_names) if self.class_names is not None else None
                )
                self._cache[split] = parse_list_file(where, known)
            else:
                self._cache[split] = scan_images(where, self.class_names or scan_class_folder(where))
        return self._cache[split]

    def build(self, split: str, seed: int) -> ClassificationDataset:
        """Build the dataset for ``split`` ("train" or "val"); ``seed`` drives augmentation."""
        paths, labels = self._samples(split)
        n_cls = self.num_classes
        if len(labels) and int(labels.max()) >= n_cls:
            # Folder layout with an explicit, too small num_classes.
            raise ValueError(f"data.root {self.root}: {split} has labels >= num_classes={n_cls}")
        transform = self._transform(train=split == "train" and self.train_aug)
        return ClassificationDataset(self.root, paths, labels, transform, seed, name=f"{self.root.name}/{split}",
                                     mixup_alpha=self.mixup_alpha if split == "train" else None)
