"""UTF-8 decoding of label and annotation files, with an error a user can act on.

Python's own ``'utf-8' codec can't decode byte 0xd6 in position 42`` names neither the file nor
the line, and its position counts from an internal read chunk, not from the file. Label files
from Chinese tools are often GBK: the message here names the file, the line (the file's bytes
split on ``b"\\n"``, 1-based), the byte offset from the start of the file, and the fix. A UTF-8
BOM (Windows editors write one) is accepted, as ``utf-8-sig`` does.
"""
from __future__ import annotations

from collections.abc import Iterator

__all__ = ["BOM", "decode_utf8", "utf8_error", "utf8_lines"]
BOM = b"\xef\xbb\xbf"


def utf8_error(path, data: bytes, err: UnicodeDecodeError, base: int = 0, line: int | None = None) -> ValueError:
    """The error for ``err`` met decoding ``data``, which starts at byte ``base`` of ``path``.

    Without ``line``, the line is counted in ``data`` (which then starts a line: the file after its BOM).
    """
    offset = base + err.start
    if line is None:
        line = data.count(b"\n", 0, err.start) + 1
    bad = " ".join(f"0x{b:02x}" for b in data[err.start:err.end])
    return ValueError(f"{path}:{line}: not UTF-8 text (byte {bad} at byte offset {offset} of the file); "
                      f"re-encode the file to UTF-8, e.g. for GBK text: iconv -f GBK -t UTF-8 {path} > "
                      f"{path}.utf8 and use that")


def decode_utf8(path, data: bytes) -> str:
    """All of ``data`` (the bytes of ``path``) as text, a leading BOM dropped; errors as :func:`utf8_error`."""
    skip = len(BOM) if data.startswith(BOM) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise utf8_error(path, data[skip:], e, base=skip) from None


def utf8_lines(path) -> Iterator[tuple[int, str | ValueError]]:
    """``(line number, text or error)`` per line of ``path``, split on ``b"\\n"``, ``\\r\\n`` kept off.

    An undecodable line gives its :func:`utf8_error` instead of text, so a caller can stop at it or
    skip it and go on; a BOM at the start of the file is dropped.
    """
    with open(path, "rb") as f:
        data = f.read()
    start = len(BOM) if data.startswith(BOM) else 0
    for lineno, raw in enumerate(data[start:].split(b"\n"), start=1):
        try:
            yield lineno, raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            yield lineno, utf8_error(path, raw, e, base=start, line=lineno)
        start += len(raw) + 1
