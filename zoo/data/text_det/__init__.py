"""Text detection data in PaddleOCR's label format (configs/data/icdar2015.yaml): labels, DB targets
(shrink and border maps), augmentations and crops."""
from zoo.data.text_det.dataset import TextDetData, TextDetDataset

__all__ = ["TextDetData", "TextDetDataset"]
