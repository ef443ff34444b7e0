"""Image-classification data: datasets, deterministic transforms, samplers."""

from .cache import cache_dir
from .classification import ClassificationData, ClassificationDataset
from .coco import COCODetData, COCODetDataset, load_coco_instances
from .loader import SampleLoadError
from .sampler import EvalBatchSampler, TrainBatchSampler, build_loader
from .synthetic_detection import SyntheticShapesDetData
from .synthetic_shapes import SyntheticShapesData

__all__ = [
    "ClassificationData",
    "ClassificationDataset",
    "COCODetData",
    "COCODetDataset",
    "EvalBatchSampler",
    "SampleLoadError",
    "SyntheticShapesData",
    "SyntheticShapesDetData",
    "TrainBatchSampler",
    "build_loader",
    "cache_dir",
    "load_coco_instances",
]
