"""Task objects: what a model family computes for training (loss dict), evaluation and export.
Every task satisfies the contract of :class:`~zoo.tasks.base.Task`."""
from zoo.tasks.base import Task
from zoo.tasks.classification import ClassificationTask, ClassifierProbs
from zoo.tasks.object_detection import PPYOLOEDeploy, PPYOLOETask
from zoo.tasks.text_detection import DBProbabilityMap, DBTask

__all__ = ["ClassificationTask", "ClassifierProbs", "DBProbabilityMap", "DBTask", "PPYOLOEDeploy", "PPYOLOETask",
           "Task"]
