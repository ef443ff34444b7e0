"""Evaluation metrics, written as summable statistics where possible."""
from zoo.metrics.classification import accuracy_from_counts, topk_correct
from zoo.metrics.coco_eval import COCOMetric

__all__ = ["COCOMetric", "accuracy_from_counts", "topk_correct"]
