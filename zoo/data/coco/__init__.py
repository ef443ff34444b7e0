"""Object detection data in COCO json format (configs/data/coco.yaml) and its box transforms."""
from zoo.data.coco.dataset import COCODetData, COCODetDataset, load_coco_instances

__all__ = ["COCODetData", "COCODetDataset", "load_coco_instances"]
