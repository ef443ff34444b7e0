"""The user's images: which files ``images=`` names, and reading one as the upstream clients do.

PaddleOCR (``tools/infer/predict_det.py``, ``ppocr/utils/utility.py`` ``check_and_read``) and
PaddleDetection (``deploy/python/preprocess.py`` ``decode_image``) decode with OpenCV into BGR uint8;
each client's own colour conversion happens later, in the preprocessing (zoo/deploy/preprocess.py).
``cv2.imread`` returns None on an unreadable file, so a bad image is caught here, by name, and not
as a shape error deep in a model run.
"""
from __future__ import annotations

import glob
from pathlib import Path

import cv2
import numpy as np

from zoo.deploy.errors import DeployError

__all__ = ["IMAGE_EXTS", "list_images", "read_image"]

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
_GLOB_CHARS = set("*?[")


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTS


def list_images(spec: str) -> list[Path]:
    """The images ``spec`` names: a folder (its images, sorted, not recursive), a glob pattern, or a
    comma-separated list of files. Every listed file is read once here, so an unreadable one fails
    now, by name; an empty result or a missing path raises :class:`DeployError`."""
    spec = str(spec).strip()
    if not spec:
        raise DeployError("images=: expected a folder, a glob or a comma-separated list of image files, got ''")
    if "," in spec and not Path(spec).exists():
        paths = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            path = Path(part)
            if not path.is_file():
                raise DeployError(f"images=: {part}: no such file (expected an image file in the comma-separated list)")
            paths.append(path)
        what = "in the comma-separated list"
    elif _GLOB_CHARS & set(spec) and not Path(spec).exists():
        paths = sorted(Path(p) for p in glob.glob(spec) if _is_image(Path(p)))
        what = f"matching the pattern (extensions {', '.join(IMAGE_EXTS)})"
    else:
        root = Path(spec)
        if root.is_dir():
            paths = sorted(p for p in root.iterdir() if _is_image(p))
            what = f"in the folder (extensions {', '.join(IMAGE_EXTS)}, not recursive)"
        elif root.is_file():
            paths = [root]
            what = ""
        else:
            raise DeployError(f"images={spec}: no such file or folder (expected a folder, a glob or a "
                              "comma-separated list of image files)")
    if not paths:
        raise DeployError(f"images={spec}: no images {what}")
    for path in paths:
        read_image(path)
    return paths


def read_image(path) -> np.ndarray:
    """``path`` as BGR uint8 [H, W, 3]: grey is repeated to three channels, an alpha channel dropped
    (as ``cv2.imread``'s default IMREAD_COLOR does), 16-bit images scaled to 8 bits."""
    path = Path(path)
    if not path.is_file():
        raise DeployError(f"{path}: no such image file")
    # imdecode of the bytes, not imread: imread mis-reads non-ASCII paths on some platforms
    data = np.fromfile(str(path), dtype=np.uint8)
    image = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    if image is None or image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
        raise DeployError(f"{path}: OpenCV cannot read it as an image (expected a readable "
                          f"{'/'.join(e[1:] for e in IMAGE_EXTS)} file)")
    return np.ascontiguousarray(image, dtype=np.uint8)
