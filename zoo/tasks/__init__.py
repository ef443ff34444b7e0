"""Task objects: what a model family computes for training (loss dict) and evaluation."""
from zoo.tasks.classification import ClassificationTask
from zoo.tasks.object_detection import PPYOLOETask
from zoo.tasks.text_detection import DBTask

__all__ = ["ClassificationTask", "DBTask", "PPYOLOETask"]
