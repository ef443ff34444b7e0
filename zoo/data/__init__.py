"""Image-classification data: datasets, deterministic transforms, samplers."""

from .cache import cache_dir
from .classification import ClassificationData, ClassificationDataset
from .sampler import EvalBatchSampler, TrainBatchSampler, build_loader
from .synthetic_shapes import SyntheticShapesData

__all__ = [
    "ClassificationData",
    "ClassificationDataset",
    "EvalBatchSampler",
    "SyntheticShapesData",
    "TrainBatchSampler",
    "build_loader",
    "cache_dir",
]
