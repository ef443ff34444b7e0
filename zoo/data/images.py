"""Reading image files, and checking them before they are trusted: truncation, decodability, size against the annotation.

OpenCV decodes a JPEG cut short with only a "Premature end of JPEG file" warning and returns an
image whose lower part is grey, so a decode that succeeds proves little. A complete JPEG ends with
the EOI marker ``FF D9`` and a complete PNG with its ``IEND`` chunk; those ends are checked here.
"""
from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

__all__ = ["ImageDecodeError", "ImageFileError", "decode_image", "image_size", "read_image_bgr", "read_image_rgb",
           "truncation_problem", "verify_image_file"]

_JPEG_SOI, _JPEG_EOI = b"\xff\xd8", b"\xff\xd9"
_PNG_SIG, _PNG_IEND = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"
_TAIL = 64  # bytes read from the end of a file to find its end marker
_EXIF_TRANSPOSED = (5, 6, 7, 8)  # orientations that swap width and height when applied


class ImageDecodeError(ValueError):
    """An image file exists but cannot be decoded (or is cut short)."""


class ImageFileError(OSError, ValueError):
    """An image that a label file or annotation lists is missing, cut short or undecodable; the
    message names the label line (or annotation) and the file.

    It is bad input, not a fault of the machine: the tools print it as one ``error:`` line and exit
    2 (tools/_entry.py). It is an OSError, as such file problems were raised before, and a
    ValueError, as every other bad-data error is (the same pairing as ``io.UnsupportedOperation``).
    """


def truncation_problem(head: bytes, tail: bytes) -> str | None:
    """Why a JPEG/PNG whose first and last bytes are ``head``/``tail`` is incomplete, else None.

    Trailing NUL padding (some cameras and copy tools add it) after the end marker is allowed.
    """
    end = tail.rstrip(b"\x00")
    if head.startswith(_JPEG_SOI) and not end.endswith(_JPEG_EOI):
        return "JPEG file is truncated (no end-of-image marker FF D9 at its end)"
    if head.startswith(_PNG_SIG) and not end.endswith(_PNG_IEND):
        return "PNG file is truncated (no IEND chunk at its end)"
    return None


def decode_image(data: bytes, path: str | os.PathLike, flags: int = cv2.IMREAD_COLOR) -> np.ndarray:
    """Decode ``data`` (the bytes of ``path``) to an HWC uint8 BGR array; refuses truncated files.

    ``flags`` may ask for a reduced decode (``cv2.IMREAD_REDUCED_COLOR_2/4/8``)."""
    problem = truncation_problem(data[:8], data[-_TAIL:]) if data else "file is empty"
    if problem:
        raise ImageDecodeError(f"cannot decode image file {path}: {problem}")
    img = _decoded(lambda f: cv2.imdecode(np.frombuffer(data, np.uint8), f), flags, path)
    if img is None:
        raise ImageDecodeError(f"cannot decode image file (corrupt or unsupported format): {path}")
    return img


# Full-size flag of each reduced decode flag.
_FULL_FLAG = {**dict.fromkeys((cv2.IMREAD_REDUCED_COLOR_2, cv2.IMREAD_REDUCED_COLOR_4, cv2.IMREAD_REDUCED_COLOR_8),
                             cv2.IMREAD_COLOR),
              **dict.fromkeys((cv2.IMREAD_REDUCED_GRAYSCALE_2, cv2.IMREAD_REDUCED_GRAYSCALE_4,
                               cv2.IMREAD_REDUCED_GRAYSCALE_8), cv2.IMREAD_GRAYSCALE)}


def _decoded(decode, flags: int, path) -> np.ndarray | None:
    """``decode(flags)`` (cv2.imread or cv2.imdecode); None if OpenCV cannot decode the data.

    Only JPEG is decoded reduced by the codec itself; other formats (PNG, ...) are decoded in full and
    then shrunk with ``cv2.resize``, which fails an assertion (``inv_scale_x > 0``) when a side is
    below the reduction (a 1x1 PNG at 1/8). Such an image is small anyway: it is decoded at full size
    instead, so callers see the size differ from the reduced one they asked for.
    """
    try:
        return decode(flags)
    except cv2.error:
        if flags not in _FULL_FLAG:
            raise ImageDecodeError(f"cannot decode image file (OpenCV refuses its data): {path}") from None
    try:
        return decode(_FULL_FLAG[flags])
    except cv2.error:
        raise ImageDecodeError(f"cannot decode image file (OpenCV refuses its data): {path}") from None


def image_size(path: str | os.PathLike, data: bytes | None = None) -> tuple[int, int]:
    """(height, width) of the image as :func:`decode_image` returns it, read from the header only
    (of ``data``, the file's bytes, when given).

    OpenCV applies the EXIF orientation, so an orientation that transposes swaps the two.
    """
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data) if data is not None else path) as im:
            w, h = im.size
            orientation = im.getexif().get(0x0112, 1) if im.format == "JPEG" else 1
    except Exception as e:  # PIL raises many types for unreadable headers
        raise ImageDecodeError(f"cannot read image header of {path}: {type(e).__name__}: {e}") from None
    return (w, h) if orientation in _EXIF_TRANSPOSED else (h, w)


def verify_image_file(path: str | os.PathLike, expected_hw: tuple[int, int] | None = None,
                      decode: bool = False) -> None:
    """Check that ``path`` exists, is complete and (optionally) has size ``expected_hw`` (h, w).

    ``decode=True`` also decodes a reduced (1/8) image, which reads the whole file and catches
    corrupt data inside it (a non-JPEG under 8 px a side is decoded in full, see :func:`_decoded`);
    otherwise only the header and the last bytes are read (cheap enough for COCO's 118k images).
    Raises FileNotFoundError or :class:`ImageDecodeError` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        f.seek(max(size - _TAIL, 0))
        tail = f.read()
    problem = truncation_problem(head, tail) if size else "file is empty"
    if problem:
        raise ImageDecodeError(f"cannot decode image file {path}: {problem}")
    if decode and _decoded(lambda f: cv2.imread(str(path), f), cv2.IMREAD_REDUCED_GRAYSCALE_8, path) is None:
        raise ImageDecodeError(f"cannot decode image file (corrupt or unsupported format): {path}")
    if expected_hw is not None:
        hw = image_size(path)
        if hw != tuple(int(v) for v in expected_hw):
            raise ImageDecodeError(f"image file {path} is {hw[1]}x{hw[0]} (w x h) but its annotation says "
                                   f"{int(expected_hw[1])}x{int(expected_hw[0])}")


def read_image_rgb(path: str | os.PathLike) -> np.ndarray:
    """Read an image file as an HWC uint8 RGB array; errors name the file (truncated files included)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {path}") from None
    # imdecode (rather than imread) distinguishes unreadable from undecodable
    # and copes with any path encoding.
    return cv2.cvtColor(decode_image(data, path), cv2.COLOR_BGR2RGB)


def read_image_bgr(path: str | os.PathLike) -> np.ndarray:
    """Read an image file as OpenCV decodes it, HWC uint8 BGR (no colour conversion); errors as
    :func:`read_image_rgb`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"image file not found: {path}") from None
    return decode_image(data, path)
