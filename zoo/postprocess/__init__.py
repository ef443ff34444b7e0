"""Post-processing of raw model outputs into task results (boxes, polygons) and their drawings."""
from zoo.postprocess.db_postprocess import DBPostProcess
from zoo.postprocess.draw import draw_detections

__all__ = ["DBPostProcess", "draw_detections"]
