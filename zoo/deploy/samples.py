"""Real images to try the deploy check on, offline: photos that ship with scikit-image, and the text
lines a detector finds in them (the inputs a recogniser or a text-orientation classifier sees).

``python -m zoo.deploy.samples photos <folder>`` writes the ten photos MODEL_CARDS.md's deploy rows
use; ``python -m zoo.deploy.samples lines <det model folder> <photos folder> <folder>`` crops every
text box the FP32 detector finds (PaddleOCR's evaluation resize, 736 / min) as an axis-aligned PNG.
scikit-image is needed only here (``pip install scikit-image``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

__all__ = ["PHOTOS", "write_photos", "write_text_lines"]

# skimage.data images available without a download: two with text (a photographed page and
# handwritten formulas) and eight scenes, in colour and grey.
PHOTOS = ("text", "page", "astronaut", "coffee", "rocket", "chelsea", "coins", "camera", "stereo_motorcycle", "logo")


def write_photos(out, names=PHOTOS) -> list[Path]:
    """``<name>.png`` (BGR, uint8) per scikit-image photo into ``out``."""
    import cv2
    import skimage.data

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        im = getattr(skimage.data, name)()
        im = np.asarray(im[0] if isinstance(im, tuple) else im)
        if im.dtype != np.uint8:
            im = (255 * (im.astype(np.float64) / max(float(im.max()), 1.0))).astype(np.uint8)
        if im.ndim == 3:
            im = im[..., :3][..., ::-1]  # RGB(A) -> BGR
        path = out / f"{name}.png"
        cv2.imwrite(str(path), im)
        paths.append(path)
    return paths


def write_text_lines(det_model_dir, photos, out, limit_side_len: int = 736, limit_type: str = "min",
                     pad: int = 2) -> list[Path]:
    """Every box the FP32 text detector in ``det_model_dir`` finds on ``photos`` (a folder or glob),
    cropped axis-aligned with ``pad`` pixels, as ``<photo>_<k>.png`` in ``out``."""
    import cv2
    import paddle

    from zoo.deploy.inputs import list_images, read_image
    from zoo.deploy.interpreter import ProgramNet
    from zoo.deploy.preprocess import build_preprocess
    from zoo.deploy.preprocess_ops import DetResizeForTest
    from zoo.deploy.program import load_program
    from zoo.deploy.tasks import build_task

    program = load_program(det_model_dir)
    net = ProgramNet(program)
    net.eval()
    pre, kind, _ = build_preprocess(det_model_dir, "paddleocr_det")
    pre = pre.for_feeds(program.feeds)
    for step in pre.steps:
        if isinstance(step, DetResizeForTest):
            step.limit_side_len, step.limit_type = limit_side_len, limit_type
    task = build_task(kind, postprocess=pre.postprocess)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for photo in list_images(str(photos)):
        image = read_image(photo)
        feeds, meta = pre(image)
        with paddle.no_grad():
            outs = net(*[paddle.to_tensor(feeds[n]) for n in program.feeds])
        pred = task.predict([o.numpy() for o in outs], meta)
        h, w = image.shape[:2]
        for k, box in enumerate(pred["boxes"]):
            box = np.asarray(box, np.float64).reshape(-1, 2)
            x0, y0 = np.floor(box.min(axis=0)).astype(int) - pad
            x1, y1 = np.ceil(box.max(axis=0)).astype(int) + pad
            crop = image[max(y0, 0):min(y1, h), max(x0, 0):min(x1, w)]
            if crop.size:
                path = out / f"{Path(photo).stem}_{k}.png"
                cv2.imwrite(str(path), crop)
                paths.append(path)
    return paths


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["photos"] and len(argv) == 2:
        print(f"{len(write_photos(argv[1]))} photos in {argv[1]}")
        return 0
    if argv[:1] == ["lines"] and len(argv) == 4:
        print(f"{len(write_text_lines(*argv[1:]))} text lines in {argv[3]}")
        return 0
    print("usage: python -m zoo.deploy.samples photos <folder> | "
          "lines <det model folder> <photos folder> <folder>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
