"""The safetensors format in NumPy: read and write without pickle and without the ``safetensors`` package.

Layout (https://github.com/huggingface/safetensors, README "Format"): 8 bytes little-endian unsigned
header size N; N bytes of UTF-8 JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``
plus an optional ``"__metadata__"`` map of strings; then the raw little-endian tensor bytes, with
offsets relative to the end of the header. Writers pad the header with spaces to a multiple of 8
and lay tensors out back to back; readers here require the offsets to tile the data exactly.

NumPy has no bfloat16: BF16 tensors are read as float32 (exact; ``bf16="uint16"`` gives the raw
bits) and written from paddle bfloat16 tensors (whose ``.numpy()`` is uint16 bits).
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from zoo.utils.fileio import atomic_write

__all__ = ["SafetensorsError", "load_file", "read_metadata", "save_file"]

# safetensors dtype -> little-endian numpy dtype (BF16 is stored as its 16 raw bits).
_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
_FROM_NUMPY = {np.dtype(v).newbyteorder("<"): k for k, v in _DTYPES.items() if k != "BF16"}
_MAX_HEADER = 100 * 1024 * 1024  # as the reference implementation


class SafetensorsError(ValueError):
    """A malformed or unsupported safetensors file or value; the message names the file and tensor."""


def _as_array(name: str, value) -> tuple[np.ndarray, str]:
    """A little-endian contiguous array and its safetensors dtype for one value."""
    dtype_name = str(getattr(value, "dtype", ""))
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # a paddle Tensor
        array = np.asarray(value.numpy())
        if "bfloat16" in dtype_name:
            return np.asarray(array.view("<u2"), order="C"), "BF16"
    else:
        array = np.asarray(value)
        if array.dtype.name == "bfloat16":  # ml_dtypes arrays: keep the raw bits
            return np.asarray(array, order="C").view("<u2"), "BF16"
    code = _FROM_NUMPY.get(array.dtype.newbyteorder("<")) if array.dtype.kind in "biuf" else None
    if code is None:
        raise SafetensorsError(f"tensor '{name}': dtype {array.dtype} cannot be stored in safetensors "
                               f"(supported: {', '.join(_DTYPES)})")
    return np.asarray(array, dtype=np.dtype(_DTYPES[code]), order="C"), code  # 0-d stays 0-d


def save_file(tensors: Mapping, path: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``{name: array or paddle Tensor}`` to ``path`` atomically (temp file + rename)."""
    path = Path(path)
    arrays = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError(f"{path}: tensor name {name!r} is not allowed")
        arrays[name] = _as_array(name, value)
    header: dict = {}
    if metadata:
        bad = [k for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise SafetensorsError(f"{path}: __metadata__ must map strings to strings; bad keys {bad}")
        header["__metadata__"] = dict(metadata)
    # Largest items first, then by name: every tensor starts at a multiple of its item size.
    order = sorted(arrays, key=lambda n: (-arrays[n][0].dtype.itemsize, n))
    offset = 0
    for name in order:
        array, code = arrays[name]
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for name in order:
                f.write(arrays[name][0].tobytes())

    return atomic_write(path, write)


def _read_header(path: Path, f, file_size: int) -> tuple[dict, int]:
    raw = f.read(8)
    if len(raw) < 8:
        raise SafetensorsError(f"{path}: too short for a safetensors file ({file_size} bytes)")
    (size,) = struct.unpack("<Q", raw)
    if size > min(_MAX_HEADER, file_size - 8):
        raise SafetensorsError(f"{path}: header size {size} exceeds the file ({file_size} bytes): "
                               f"not a safetensors file, or truncated")
    try:
        header = json.loads(f.read(size).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not UTF-8 JSON ({e})") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header must be a JSON object, got {type(header).__name__}")
    return header, 8 + size


def _check_entry(path: Path, name: str, entry) -> tuple[str, tuple[int, ...], int, int]:
    where = f"{path}: tensor '{name}'"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise SafetensorsError(f"{where}: expected an object with dtype, shape and data_offsets, got {entry!r}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in _DTYPES:
        raise SafetensorsError(f"{where}: unsupported dtype {dtype!r} (supported: {', '.join(_DTYPES)})")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise SafetensorsError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise SafetensorsError(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
    nbytes = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise SafetensorsError(f"{where}: data_offsets {offsets} span {offsets[1] - offsets[0]} bytes but "
                               f"{dtype} {shape} needs {nbytes}")
    return dtype, tuple(shape), offsets[0], offsets[1]


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``__metadata__`` map of a safetensors file (empty if it has none)."""
    path = Path(path)
    with open(path, "rb") as f:
        header, _ = _read_header(path, f, path.stat().st_size)
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise SafetensorsError(f"{path}: __metadata__ must be an object, got {type(meta).__name__}")
    return meta


def load_file(path: str | os.PathLike, bf16: str = "float32") -> dict[str, np.ndarray]:
    """Read every tensor of a safetensors file into NumPy arrays (native byte order, writable).

    ``bf16="float32"`` widens BF16 exactly; ``bf16="uint16"`` returns its raw bits.
    """
    if bf16 not in ("float32", "uint16"):
        raise ValueError(f"bf16 must be 'float32' or 'uint16', got {bf16!r}")
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        header, start = _read_header(path, f, size)
        data = bytearray(f.read())
    entries = {k: _check_entry(path, k, v) for k, v in header.items() if k != "__metadata__"}
    spans = sorted((begin, end, name) for name, (_, _, begin, end) in entries.items())
    cursor = 0
    for begin, end, name in spans:
        if begin != cursor:
            raise SafetensorsError(f"{path}: tensor '{name}' starts at byte {begin} of the data, expected "
                                   f"{cursor} (overlapping tensors or a gap)")
        cursor = end
    if cursor != len(data):
        raise SafetensorsError(f"{path}: tensors cover {cursor} bytes but the file holds {len(data)} after the "
                               f"{start}-byte header (truncated or trailing bytes)")
    out = {}
    for name, (dtype, shape, begin, end) in entries.items():
        array = np.frombuffer(data, dtype=_DTYPES[dtype], count=math.prod(shape), offset=begin).reshape(shape)
        if dtype == "BF16" and bf16 == "float32":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        out[name] = array.astype(array.dtype.newbyteorder("="), copy=False)
    return out
