"""Image-classification data: datasets, deterministic transforms, samplers."""

from zoo.utils.cache import cache_dir
from zoo.data.classification import ClassificationData, ClassificationDataset
from zoo.data.coco import COCODetData, COCODetDataset, load_coco_instances
from zoo.data.loader import SampleLoadError
from zoo.data.sampler import EvalBatchSampler, TrainBatchSampler, build_loader
from zoo.data.synthetic_detection import SyntheticShapesDetData
from zoo.data.synthetic_shapes import SyntheticShapesData

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
