"""Evaluation metrics, written as summable statistics where possible."""
from zoo.metrics.classification import accuracy_from_counts, topk_correct

__all__ = ["accuracy_from_counts", "topk_correct"]
