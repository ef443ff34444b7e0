"""The embedded data sets, generated deterministically into the cache on first use, so every
command works offline: shapes (classification), shapes in COCO format (detection), text
(PaddleOCR labels)."""
from zoo.data.synthetic.shapes import SyntheticShapesData
from zoo.data.synthetic.shapes_det import SyntheticShapesDetData
from zoo.data.synthetic.text import SyntheticTextData

__all__ = ["SyntheticShapesData", "SyntheticShapesDetData", "SyntheticTextData"]
