"""CopyPaste for DB training (PP-OCRv4/v5 det, ``ppocr/data/imaug/copy_paste.py``): text instances of a
second training image (the donor) pasted onto the image, before the flip/rotate/resize and the crop.

What upstream does, and this module with it:

* the donor is another sample of the training set, drawn at random (it may be the image itself);
* ``k = max(1, min(int(ratio * n), 30))`` instances, ``n`` the donor's boxes counting the ignored
  ones, drawn without replacement from its *cared* (not ``###``) quads; none when it has none;
* each quad is rectified to an upright patch (perspective warp, width the longer of its top and
  bottom edges, height the longer of its sides, replicated border); a patch at least 1.5 times as tall
  as wide is turned a quarter (counter-clockwise) to lie along its text;
* the patch is rotated by a whole number of degrees drawn from [0, 360), the canvas grown to hold it
  (nearest-neighbour, the corners outside the patch left out of the paste), and pasted with its
  top-left at a uniformly drawn pixel where it fits; with ``limit_paste`` the place must leave the
  bounding box of every box already on the image (the pasted ones too) untouched, 50 draws at most,
  else the instance is dropped; a patch larger than the image is dropped;
* the pasted instance's quad (the rotated patch outline) joins the labels as cared text, and all
  quads are clipped to the image.

Written for this zoo (no upstream code): draws come from the item's ``numpy.random.Generator``
(upstream mixes Python's ``random`` and NumPy's global state), the rotation is ``cv2.warpAffine``
rather than PIL's, and coordinates follow the pixel-centre convention of the other transforms
(:mod:`zoo.data.text_det.transforms`), so the quad outlines exactly the pixels pasted.
"""
from __future__ import annotations

import math

import cv2
import numpy as np

__all__ = ["CopyPaste", "paste_patch", "rectify_quad", "rotated_patch"]

MAX_OBJECTS = 30       # upstream's cap on instances per image
PLACE_TRIES = 50       # upstream's tries for a free place with limit_paste
TALL_RATIO = 1.5       # upstream's quarter turn of a tall crop


def rectify_quad(img: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """The quad's content as an upright patch: width = the longer of its top and bottom edges, height =
    the longer of its left and right edges (truncated to whole pixels, at least 1), replicated border;
    turned a quarter counter-clockwise when at least 1.5 times as tall as wide."""
    q = np.asarray(quad, np.float64).reshape(4, 2)
    w = max(1, int(max(np.linalg.norm(q[0] - q[1]), np.linalg.norm(q[2] - q[3]))))
    h = max(1, int(max(np.linalg.norm(q[0] - q[3]), np.linalg.norm(q[1] - q[2]))))
    # the quad's outline onto the patch's outer pixel edges (centres -0.5 .. w-0.5)
    corners = np.array([[-0.5, -0.5], [w - 0.5, -0.5], [w - 0.5, h - 0.5], [-0.5, h - 0.5]])
    m = cv2.getPerspectiveTransform(q.astype(np.float32), corners.astype(np.float32))
    patch = cv2.warpPerspective(img, m, (w, h), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE)
    if h / w >= TALL_RATIO:
        patch = np.ascontiguousarray(np.rot90(patch))
    return patch


def rotated_patch(patch: np.ndarray, angle: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(image, mask, quad)``: ``patch`` rotated counter-clockwise by ``angle`` degrees on a canvas grown
    to hold it (nearest neighbour), the mask of its pixels, and its outline in the canvas."""
    h, w = patch.shape[:2]
    # pixel-edge corners about the patch centre, in centre coordinates
    corners = np.array([[-0.5, -0.5], [w - 0.5, -0.5], [w - 0.5, h - 0.5], [-0.5, h - 0.5]])
    m = cv2.getRotationMatrix2D(((w - 1) / 2, (h - 1) / 2), float(angle), 1.0)
    turned = corners @ m[:, :2].T + m[:, 2]
    lo = np.floor(turned.min(0) + 0.5)  # the canvas starts at the first pixel edge the patch reaches
    m[:, 2] -= lo
    turned -= lo
    # pixels 0..n-1 end at edge n - 0.5, which must reach the last edge of the patch
    cw, ch = (max(1, int(math.ceil(v + 0.5 - 1e-6))) for v in turned.max(0))
    image = cv2.warpAffine(patch, m, (cw, ch), flags=cv2.INTER_NEAREST, borderMode=cv2.BORDER_CONSTANT)
    mask = cv2.warpAffine(np.ones((h, w), np.uint8), m, (cw, ch), flags=cv2.INTER_NEAREST,
                          borderMode=cv2.BORDER_CONSTANT).astype(bool)
    return image, mask, turned


def paste_patch(img: np.ndarray, patch: np.ndarray, mask: np.ndarray, x: int, y: int) -> None:
    """Write ``patch`` where ``mask`` is set into ``img`` with its top-left pixel at (x, y), in place."""
    h, w = mask.shape
    region = img[y:y + h, x:x + w]
    region[mask] = patch[mask]


def _box_clear(quad: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    """No box with bounding-box corners ``lo``/``hi`` [N, 2] reaches the bounding box of ``quad``
    (upstream's bounding-box test)."""
    q_lo, q_hi = quad.min(0), quad.max(0)
    return bool(np.all((hi < q_lo).any(1) | (lo > q_hi).any(1)))


class CopyPaste:
    """Paste text instances of a donor image (``data.builder.copy_paste``; see the module docstring).

    Args:
        objects_paste_ratio: share of the donor's boxes to paste (upstream's default 0.2).
        limit_paste: only where no existing box's bounding box is touched (upstream's default True).
    """

    def __init__(self, objects_paste_ratio: float = 0.2, limit_paste: bool = True):
        if not 0 <= float(objects_paste_ratio) <= 1:
            raise ValueError(f"data.builder.copy_paste.objects_paste_ratio: expected 0..1, got {objects_paste_ratio}")
        self.ratio, self.limit_paste = float(objects_paste_ratio), bool(limit_paste)

    def __call__(self, img: np.ndarray, polys: np.ndarray, ignore: np.ndarray, donor: tuple,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(image, polys [K+k,4,2], ignore [K+k])`` with up to k instances of ``donor`` = (image, polys,
        ignore) pasted onto a copy of ``img``."""
        d_img, d_polys, d_ignore = donor
        d_polys = np.asarray(d_polys, np.float64).reshape(-1, 4, 2)
        cared = np.flatnonzero(~np.asarray(d_ignore, bool))
        k = min(max(1, min(int(self.ratio * len(d_polys)), MAX_OBJECTS)), len(cared))
        out = np.array(img, copy=True)
        boxes = np.asarray(polys, np.float64).reshape(-1, 4, 2)
        lo, hi = boxes.min(1), boxes.max(1)  # bounding boxes of what is on the image, pasted ones joining
        added = []
        for index in rng.permutation(cared)[:k]:
            patch = rectify_quad(d_img, d_polys[index])
            image, mask, quad = rotated_patch(patch, int(rng.integers(0, 360)))
            room_y, room_x = out.shape[0] - mask.shape[0], out.shape[1] - mask.shape[1]
            if room_x < 0 or room_y < 0:
                continue
            for _ in range(PLACE_TRIES if self.limit_paste else 1):
                x, y = int(rng.integers(0, room_x + 1)), int(rng.integers(0, room_y + 1))
                placed = quad + (x, y)
                if not self.limit_paste or _box_clear(placed, lo, hi):
                    break
            else:
                continue
            paste_patch(out, image, mask, x, y)
            lo, hi = np.vstack([lo, placed.min(0)]), np.vstack([hi, placed.max(0)])
            added.append(placed)
        if not added:
            return out, np.asarray(polys, np.float32).reshape(-1, 4, 2), np.asarray(ignore, bool)
        h, w = out.shape[:2]
        all_polys = np.concatenate([np.asarray(polys, np.float64).reshape(-1, 4, 2), np.stack(added)])
        all_polys[..., 0] = np.clip(all_polys[..., 0], 0, w)
        all_polys[..., 1] = np.clip(all_polys[..., 1], 0, h)
        return out, all_polys.astype(np.float32), np.concatenate([np.asarray(ignore, bool), np.zeros(len(added), bool)])

    def __repr__(self) -> str:
        return f"CopyPaste(objects_paste_ratio={self.ratio}, limit_paste={self.limit_paste})"
