"""Data, one sub-package per family, as configs/data/ has one file per data set:

- :mod:`zoo.data.classification`: PaddleClas list files / class folders (imagenet.yaml);
- :mod:`zoo.data.text_det`: PaddleOCR text-detection labels, DB targets and transforms (icdar2015.yaml);
- :mod:`zoo.data.coco`: COCO json detection data and box transforms (coco.yaml);
- :mod:`zoo.data.synthetic`: the embedded generated sets (synthetic_*.yaml);

and what they share: image reading and checks (:mod:`zoo.data.images`), deterministic transforms
(:mod:`zoo.data.transforms`), the guarded loader (:mod:`zoo.data.loader`) and the samplers
(:mod:`zoo.data.sampler`).
"""
from zoo.data.classification import ClassificationData, ClassificationDataset
from zoo.data.coco import COCODetData, COCODetDataset, load_coco_instances
from zoo.data.images import ImageFileError
from zoo.data.loader import SampleLoadError
from zoo.data.sampler import EvalBatchSampler, TrainBatchSampler, build_loader
from zoo.data.synthetic import SyntheticShapesData, SyntheticShapesDetData, SyntheticTextData
from zoo.data.text_det import TextDetData, TextDetDataset

__all__ = [
    "ClassificationData",
    "ClassificationDataset",
    "COCODetData",
    "COCODetDataset",
    "EvalBatchSampler",
    "ImageFileError",
    "SampleLoadError",
    "SyntheticShapesData",
    "SyntheticShapesDetData",
    "SyntheticTextData",
    "TextDetData",
    "TextDetDataset",
    "TrainBatchSampler",
    "build_loader",
    "load_coco_instances",
]
