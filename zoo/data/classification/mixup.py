"""Mixup (Zhang et al. 2018, arXiv:1710.09412) as PaddleClas applies it: to a whole batch, in the loader.

PaddleClas's ``MixupOperator`` runs in the DataLoader's collate function, so each card mixes its own
batch: one ``lam ~ Beta(alpha, alpha)`` per batch, the batch paired with a random permutation of
itself, images ``lam * x + (1 - lam) * x[perm]`` and target ``lam * onehot(y) + (1 - lam) *
onehot(y[perm])``. Here the batch carries ``label`` (y), ``mix_label`` (y[perm]) and ``mix_lam``
(lam per image); :class:`~zoo.tasks.classification.ClassificationTask` builds the soft target,
smooths it and takes the cross-entropy as PaddleClas's ``CELoss`` does.

The batch's generator is seeded with ``(seed, epoch, index of its first sample, MIXUP_STREAM)``: a
function of the batch alone, like every other random draw of the data (zoo/data/sampler.py), so what
a batch looks like does not depend on the number of loader workers or on where a run resumed.
"""
from __future__ import annotations

import numpy as np

from zoo.utils.checks import POSITIVE, check

__all__ = ["MIXUP_ALPHA", "MixupCollate", "check_mixup_alpha", "mixup_batch"]

# Keeps the batch's generator apart from its first sample's (seed, epoch, index) one; non-zero,
# since numpy's SeedSequence pads a shorter entropy tuple with zeros.
MIXUP_STREAM = 0x6D6978
MIXUP_ALPHA = POSITIVE.but(nullable=True, note="null = no Mixup")


def check_mixup_alpha(alpha):
    """``data.builder.mixup_alpha`` checked: null (off) or a finite number > 0; returned as float/None."""
    check("data.builder.mixup_alpha", alpha, MIXUP_ALPHA)
    return None if alpha is None else float(alpha)


def mixup_batch(images: np.ndarray, labels: np.ndarray, alpha: float, rng: np.random.Generator):
    """Mix a batch with a permutation of itself.

    Returns ``(mixed images, partner labels, lam, perm)``: ``perm`` is drawn first, then
    ``lam ~ Beta(alpha, alpha)`` (PaddleClas's order); images keep their dtype.
    """
    perm = rng.permutation(len(labels))
    lam = float(rng.beta(alpha, alpha))
    mixed = (lam * images + (1.0 - lam) * images[perm]).astype(images.dtype, copy=False)
    return mixed, np.asarray(labels)[perm], lam, perm


class MixupCollate:
    """Collate function of a training :class:`~zoo.data.classification.ClassificationDataset` with
    Mixup: stacks the items, then mixes the batch (see the module docstring).

    Items carry their sampler ``key`` (``epoch * num_samples + index``), which names the batch's
    generator and is dropped from the batch.
    """

    def __init__(self, alpha: float, seed: int, num_samples: int):
        self.alpha = check_mixup_alpha(alpha)
        if self.alpha is None:
            raise ValueError("MixupCollate needs data.builder.mixup_alpha > 0")
        self.seed, self.num_samples = int(seed), int(num_samples)

    def batch_rng(self, first_key: int) -> np.random.Generator:
        """The generator of the batch whose first sample has sampler key ``first_key``."""
        epoch, index = divmod(int(first_key), self.num_samples)
        return np.random.default_rng((self.seed, epoch, index, MIXUP_STREAM))

    def __call__(self, items: list[dict]) -> dict:
        out = {k: np.stack([np.asarray(it[k]) for it in items]) for k in items[0] if k != "key"}
        rng = self.batch_rng(int(items[0]["key"]))
        out["image"], out["mix_label"], lam, _ = mixup_batch(out["image"], out["label"], self.alpha, rng)
        out["mix_lam"] = np.full(len(items), lam, np.float32)
        return out

    def __repr__(self) -> str:
        return f"MixupCollate(alpha={self.alpha})"
