"""Batch samplers that make training resumable bit-exactly and shardable.

Samplers yield lists of integer *keys* ``key = epoch * N + index``.  Datasets
decode ``index = key % N`` and ``epoch = key // N`` and seed their
augmentation with ``(seed, epoch, index)``, so what a sample looks like never
depends on worker count or iteration history.

The training stream is a pure function of ``(seed, step)``: resuming at step
``s`` with ``start_step=s`` yields exactly the batches a single uninterrupted
run would have produced from step ``s`` on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from zoo.data.loader import build_loader  # noqa: F401  (re-exported: it was defined here)

__all__ = ["EvalBatchSampler", "TrainBatchSampler", "build_loader"]


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")


class TrainBatchSampler:
    """Infinite, epoch-based, shardable batch sampler for training.

    Epoch ``e`` uses ``np.random.default_rng((seed, e)).permutation(N)``.  With
    ``world_size > 1`` the permutation is padded by wrapping around to a
    multiple of ``world_size`` and rank ``r`` takes ``perm[r::world_size]``, so
    every rank runs the same number of steps.  ``batch_size`` is per rank.
    ``start_step`` skips that many batches by computing the epoch and offset
    directly (nothing is generated and discarded).  ``stop_step`` (e.g. the
    run's ``max_steps``) ends the iteration after that many batches in all, so a
    prefetching loader does not prepare batches that no step will use.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = True,
        start_step: int = 0,
        stop_step: int | None = None,
    ):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0 (numpy SeedSequence), got {seed}")
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        _check_rank(rank, world_size)
        self.num_samples = int(num_samples)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self.start_step = int(start_step)
        if stop_step is not None and stop_step < 0:
            raise ValueError(f"stop_step must be >= 0 or None, got {stop_step}")
        self.stop_step = None if stop_step is None else int(stop_step)
        # Samples per rank per epoch after wrap-padding to a multiple of world_size.
        self.samples_per_rank = math.ceil(self.num_samples / self.world_size)
        if self.drop_last:
            steps = self.samples_per_rank // self.batch_size
        else:
            steps = math.ceil(self.samples_per_rank / self.batch_size)
        if steps == 0:
            raise ValueError(
                f"TrainBatchSampler: 0 steps per epoch: dataset has {self.num_samples} samples, "
                f"i.e. {self.samples_per_rank} per rank over world_size={self.world_size}, "
                f"fewer than one batch of batch_size={self.batch_size} (drop_last={self.drop_last}); "
                "use a smaller batch size or a larger dataset"
            )
        self._steps_per_epoch = steps

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch for this rank (equal on every rank)."""
        return self._steps_per_epoch

    def __len__(self) -> int:
        # paddle.io.DataLoader.__len__ delegates here; iteration itself is infinite.
        return self._steps_per_epoch

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """This rank's sample indices for ``epoch``, in order (before batching)."""
        perm = np.random.default_rng((self.seed, epoch)).permutation(self.num_samples)
        total = self.samples_per_rank * self.world_size
        if total != self.num_samples:
            # np.resize repeats cyclically, i.e. pads by wrapping around
            # (also correct when world_size > num_samples).
            perm = np.resize(perm, total)
        return perm[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[list[int]]:
        epoch, offset = divmod(self.start_step, self._steps_per_epoch)
        n, bs = self.num_samples, self.batch_size
        left = None if self.stop_step is None else max(self.stop_step - self.start_step, 0)
        while left is None or left > 0:
            keys = self.epoch_indices(epoch).astype(np.int64) + epoch * n
            for step in range(offset, self._steps_per_epoch):
                if left is not None:
                    if left == 0:
                        return
                    left -= 1
                yield keys[step * bs : (step + 1) * bs].tolist()
            epoch, offset = epoch + 1, 0


class EvalBatchSampler:
    """Finite, in-order, shardable batch sampler for evaluation.

    Rank ``r`` gets indices ``range(r, N, world_size)``: no padding and no
    duplicates, so the union over ranks is exactly the dataset.  Keys use
    epoch 0, i.e. ``key == index``.  The last batch may be smaller.
    """

    def __init__(self, num_samples: int, batch_size: int, rank: int = 0, world_size: int = 1):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        _check_rank(rank, world_size)
        self.num_samples = int(num_samples)
        self.batch_size = int(batch_size)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = False

    @property
    def indices(self) -> range:
        """This rank's sample indices, in order."""
        return range(self.rank, self.num_samples, self.world_size)

    def __len__(self) -> int:
        return math.ceil(len(self.indices) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        idx = self.indices
        for start in range(0, len(idx), self.batch_size):
            yield list(idx[start : start + self.batch_size])
