"""Image classification data: PaddleClas list files or class folders (configs/data/imagenet.yaml)."""
from zoo.data.classification.dataset import ClassificationData, ClassificationDataset
from zoo.data.classification.transforms import ClassificationTransform

__all__ = ["ClassificationData", "ClassificationDataset", "ClassificationTransform"]
