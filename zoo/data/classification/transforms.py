"""The classification train / eval pipeline (random resized crop + flip; resize + centre crop).

Every random decision comes from the generator passed in (zoo/data/transforms.py). The crop box is
torchvision's sampler by default, or PaddleClas's ``RandCropImage`` (``crop_sampler="paddleclas"``).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from zoo.data.transforms import CROP_SAMPLERS, center_crop, normalize_chw, random_hflip, random_resized_crop, resize_short

__all__ = ["ClassificationTransform"]


class ClassificationTransform:
    """The train or eval pipeline as one picklable callable ``(img, rng) -> CHW``.

    ``train=True``: random resized crop to ``image_size`` (box from ``crop_sampler``, a name of
    :data:`~zoo.data.transforms.CROP_SAMPLERS`) + horizontal flip.
    ``train=False``: resize short side to ``resize_size`` + centre crop
    ``image_size``.  Both end with :func:`normalize_chw`.
    """

    def __init__(
        self,
        train: bool,
        image_size: int,
        resize_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        crop_scale: Sequence[float] = (0.08, 1.0),
        crop_ratio: Sequence[float] = (3 / 4, 4 / 3),
        crop_sampler: str = "torchvision",
    ):
        if image_size <= 0 or resize_size < image_size:
            raise ValueError(
                f"need 0 < image_size <= resize_size, got image_size={image_size}, "
                f"resize_size={resize_size}"
            )
        if not (0 < crop_scale[0] <= crop_scale[1] <= 1):
            raise ValueError(f"crop_scale must satisfy 0 < lo <= hi <= 1, got {tuple(crop_scale)}")
        if crop_sampler not in CROP_SAMPLERS:
            raise ValueError(f"data.builder.crop_sampler: expected one of {', '.join(CROP_SAMPLERS)}, "
                             f"got {crop_sampler!r}")
        self.train = train
        self.image_size = int(image_size)
        self.resize_size = int(resize_size)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.crop_scale = tuple(float(s) for s in crop_scale)
        self.crop_ratio = tuple(float(r) for r in crop_ratio)
        self.crop_sampler = crop_sampler

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Apply the pipeline to an HWC uint8 RGB image."""
        if self.train:
            img = random_resized_crop(img, self.image_size, rng, self.crop_scale, self.crop_ratio,
                                      self.crop_sampler)
            img = random_hflip(img, rng)
        else:
            img = center_crop(resize_short(img, self.resize_size), self.image_size)
        return normalize_chw(img, self.mean, self.std)

    def __repr__(self) -> str:
        kind = "train" if self.train else "eval"
        return (
            f"ClassificationTransform({kind}, image_size={self.image_size}, "
            f"resize_size={self.resize_size}, crop_scale={self.crop_scale}, crop_sampler={self.crop_sampler})"
        )
