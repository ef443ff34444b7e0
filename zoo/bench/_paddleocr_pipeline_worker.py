"""Times PaddleOCR's own DB train transforms (run by :mod:`zoo.bench.pipeline`).

    python _paddleocr_pipeline_worker.py PADDLEOCR_SRC LABEL_FILE ROOT N CROP SEED [CONFIG]

Imports nothing from the zoo (it may run in a separate venv holding PaddleOCR's requirements).
Builds the ``Train.dataset.transforms`` of CONFIG (a path inside PADDLEOCR_SRC, default
``configs/det/det_mv3_db.yml``) with PaddleOCR's ``create_operators`` (EastRandomCropData's ``size``
set to CROP), then answers each ``run`` line on stdin with one JSON line: seconds per stage over the
first N label lines, read as PaddleOCR's SimpleDataSet reads them (file bytes into
``data["image"]``, the JSON label into ``data["label"]``). With CopyPaste among the transforms (PP-OCRv4/v5)
each item also gets ``data["ext_data"]`` as SimpleDataSet's ``get_ext_data`` makes it: a random
line of the whole list through the first two transforms (decode, label), drawn again while that
gives no boxes; that time counts as "copy_paste", as the zoo's donor image does.

One adaptation, for numpy >= 2.4 only: upstream's ``int(np.random.choice(axis, size=1))`` in
``random_crop_data.py`` raises there ("only 0-dimensional arrays can be converted"), and its
dataset would silently retry another image. The module's ``np.random.choice`` is given a wrapper
returning that one draw as a 0-d array: the same draw from the same stream, nothing else changed.
"""
from __future__ import annotations

import json
import sys
import time
import types

# DecodeImage + DetLabelEncode: read_decode; NormalizeImage + ToCHWImage (+ KeepKeys): normalize.
STAGE_OF = {"DecodeImage": "read_decode", "DetLabelEncode": "read_decode", "CopyPaste": "copy_paste",
            "IaaAugment": "augment",
            "EastRandomCropData": "crop", "MakeBorderMap": "border_map", "MakeShrinkMap": "shrink_map",
            "NormalizeImage": "normalize", "ToCHWImage": "normalize", "KeepKeys": "normalize"}


def _numpy_24_shim(module) -> None:
    import numpy as np

    def choice(a, size=None, *args, **kwargs):
        out = np.random.choice(a, size, *args, **kwargs)
        return out.reshape(()) if size == 1 else out

    rnd = types.SimpleNamespace(**{k: getattr(np.random, k) for k in dir(np.random) if not k.startswith("__")})
    rnd.choice = choice
    shim = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    shim.random = rnd
    module.np = shim


def build(src: str, crop: int, config: str = "configs/det/det_mv3_db.yml"):
    sys.path.insert(0, src)
    import ppocr.data.imaug.random_crop_data as rcd
    import yaml
    from ppocr.data.imaug import create_operators

    _numpy_24_shim(rcd)
    with open(f"{src}/{config}", encoding="utf-8") as f:
        cfg = yaml.safe_load(f)
    transforms = cfg["Train"]["dataset"]["transforms"]
    for t in transforms:
        if "EastRandomCropData" in t:
            t["EastRandomCropData"]["size"] = [crop, crop]
    return create_operators(transforms, {})


def _ext_data(ops, pool, root: str) -> list:
    """SimpleDataSet.get_ext_data: ``ext_data_num`` random lines of ``pool`` through ``ops[:2]``."""
    import numpy as np

    want = next((op.ext_data_num for op in ops if hasattr(op, "ext_data_num")), 0)
    out = []
    while len(out) < want:
        rel, label = pool[np.random.randint(len(pool))]
        with open(f"{root}/{rel}", "rb") as f:
            data = {"img_path": f"{root}/{rel}", "label": label, "image": f.read()}
        for op in ops[:2]:
            data = op(data) if data is not None else None
        if data is not None and data["polys"].shape[1] == 4:
            out.append(data)
    return out


def run_pass(ops, items, root: str, pool=None) -> dict:
    """Seconds per stage over ``items``; ``pool``: the lines CopyPaste's second image is drawn from."""
    totals: dict = {}
    ext = any(hasattr(op, "ext_data_num") for op in ops)
    for rel, label in items:
        t = time.perf_counter()
        with open(f"{root}/{rel}", "rb") as f:
            data = {"img_path": f"{root}/{rel}", "label": label, "image": f.read()}
        if ext:
            now = time.perf_counter()
            totals["read_decode"] = totals.get("read_decode", 0.0) + now - t
            data["ext_data"] = _ext_data(ops, pool or items, root)
            t = time.perf_counter()
            totals["copy_paste"] = totals.get("copy_paste", 0.0) + t - now
        for op in ops:
            data = op(data)
            if data is None:
                raise RuntimeError(f"{type(op).__name__} returned None for {rel}")
            now = time.perf_counter()
            stage = STAGE_OF.get(type(op).__name__, type(op).__name__)
            totals[stage] = totals.get(stage, 0.0) + now - t
            t = now
    return totals


def main() -> None:
    src, label_file, root, n, crop, seed = sys.argv[1:7]
    config = sys.argv[7] if len(sys.argv) > 7 else "configs/det/det_mv3_db.yml"
    try:
        ops = build(src, int(crop), config)
        import random

        import numpy as np

        with open(label_file, encoding="utf-8-sig") as f:
            pool = [tuple(line.rstrip("\r\n").split("\t", 1)) for line in f if line.strip()]
        items = pool[: int(n)]
        assert type(ops[1]).__name__ == "DetLabelEncode", [type(o).__name__ for o in ops]
        # PaddleOCR's DetLabelEncode returns None for an image without boxes (its dataset then
        # draws another image): such images are left out, and the parent leaves them out too.
        usable = [i for i, (_, label) in enumerate(items) if ops[1]({"label": label}) is not None]
        items = [items[i] for i in usable]
    except Exception as e:  # noqa: BLE001  (reported to the parent as the reason to skip)
        print(json.dumps({"error": f"cannot build PaddleOCR's transforms: {type(e).__name__}: {e}"}), flush=True)
        return
    print(json.dumps({"ready": [type(o).__name__ for o in ops], "images": len(items), "usable": usable}),
          flush=True)
    passes = 0
    for line in sys.stdin:
        if line.strip() != "run":
            continue
        np.random.seed(int(seed) + passes)
        random.seed(int(seed) + passes)
        passes += 1
        try:
            print(json.dumps(run_pass(ops, items, root, pool)), flush=True)
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
