"""Post-processing of raw model outputs into task results (boxes, polygons) and their drawings."""
from zoo.postprocess.db_postprocess import DBPostProcess
from zoo.postprocess.draw import draw_boxes, draw_detections
from zoo.postprocess.nms import batch_multiclass_nms, multiclass_nms

__all__ = ["DBPostProcess", "batch_multiclass_nms", "draw_boxes", "draw_detections", "multiclass_nms"]
