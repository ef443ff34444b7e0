"""Trust on first use, made explicit: the sha256 records of ``weights/checksums.json``.

No sha256 is published for the official files, so the first complete download of a URL is pinned:
its sha256, size, the server's validators (ETag, Last-Modified) and the date go into
``checksums.json`` and every later download and cached copy must match. A first download can be
wrong (an error page served with status 200, a mixed file), so nothing is pinned that does not
load as the weights format it claims to be; and a pin can be reset on purpose
(``tools/download.py NAME --retrust``). A sha256 published in the registry always wins over a pin.
"""
from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path

from zoo.weights.safe_pickle import load as safe_load
from zoo.weights.safetensors import read_metadata

CHECKSUMS = "checksums.json"
_TEXT_STARTS = (b"<!doctype", b"<html", b"<?xml", b"<head", b"<body", b"{", b"[")


def checksums_path(folder: Path) -> Path:
    return Path(folder) / CHECKSUMS


def read_checksums(folder: Path) -> dict:
    """``{official url: record}``; raises ValueError naming the file when it is unreadable."""
    path = checksums_path(folder)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable checksum record ({e}); fix or delete it") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of URLs, got {type(data).__name__}")
    return data


def _write(folder: Path, records: dict) -> None:
    path = checksums_path(folder)
    tmp = path.with_name(f".{CHECKSUMS}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def record(folder: Path, url: str, digest: str, file: Path, validators: dict | None = None) -> dict:
    """Pin ``url`` to ``digest`` (the file's sha256), with its size, validators and the date."""
    records = read_checksums(folder)
    entry = {"sha256": digest, "size": file.stat().st_size, "file": str(file.relative_to(folder)),
             "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "trust": "first download"}
    entry.update({k: v for k, v in (validators or {}).items() if v})
    records[url] = entry
    _write(folder, records)
    return entry


def forget(folder: Path, url: str) -> dict | None:
    """Remove the pin of ``url``; returns what was recorded (None if nothing was)."""
    records = read_checksums(folder)
    old = records.pop(url, None)
    if old is not None:
        _write(folder, records)
    return old


def describe(folder: Path, url: str) -> str:
    """Where the pin of ``url`` is and what it says, for error messages."""
    entry = read_checksums(folder).get(url) or {}
    facts = ", ".join(f"{k} {entry[k]}" for k in ("recorded", "size", "etag", "last_modified") if entry.get(k))
    return f"the entry for {url} in {checksums_path(folder)}" + (f" ({facts})" if facts else "")


def not_weights_reason(path: Path, fmt: str) -> str | None:
    """Why ``path`` is obviously not a ``fmt`` weights file (``pdparams``, ``tar``, ``safetensors``), else None.

    An error page saved under a weights name is the common case; the file is then parsed as its
    format (safe unpickler, tar index, safetensors header) so a mixed or truncated file is caught too.
    """
    with open(path, "rb") as f:
        head = f.read(512)
    # Not for safetensors: its first 8 bytes are a length, which may well start with "{" or "<".
    if fmt != "safetensors" and head.lstrip().lower().startswith(_TEXT_STARTS):
        shown = head.lstrip()[:60].decode("utf-8", "replace")
        return f"it is a text/HTML document, not a {fmt} file (starts with {shown!r})"
    try:
        if fmt == "tar":
            with tarfile.open(path) as tar:
                names = [m.name for m in tar.getmembers()]
            if not any(n.endswith(".pdparams") for n in names):
                return f"the tar holds no .pdparams file (members: {names[:5]})"
        elif fmt == "safetensors":
            read_metadata(path)
        else:
            state = safe_load(path)
            if not isinstance(state, dict):
                return f"it holds a {type(state).__name__}, not a state dict"
    except Exception as e:  # noqa: BLE001  (any parse failure means: do not trust it)
        return f"it does not parse as a {fmt} file ({type(e).__name__}: {e})"
    return None


def format_of(path: Path, declared: str | None = None) -> str:
    """The weights format of ``path``: the registry's, else from the file name."""
    if declared:
        return declared
    name = path.name.lower()
    if name.endswith(".tar") or name.endswith(".tar.gz") or name.endswith(".tgz"):
        return "tar"
    if name.endswith(".safetensors"):
        return "safetensors"
    return "pdparams"
