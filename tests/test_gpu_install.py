"""The GPU install is one command, and docs/gpu.md's command agrees with pyproject.toml (issue 40.7).

PyPI's ``paddlepaddle-gpu`` stops at 2.6.2; Paddle 3's CUDA wheels are on Paddle's own index, so the
``gpu`` extra installs with that index added. The indexes are asked which versions they have with
``pip index versions`` (pip's finder, filtered to this interpreter's wheel tags, as ``pip install``
would resolve them). A ``pip install --dry-run --no-deps`` would answer the same but downloads the
wheel to read its metadata (paddlepaddle-gpu 2.6.2 is 759 MB), which a test must not do. Either
index unreachable: skipped with the reason.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request

import pytest
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.version import Version

GPU_DOC = ROOT / "docs" / "gpu.md"
PADDLE_INDEX = re.compile(r"https://www\.paddlepaddle\.org\.cn/packages/stable/cu\d+/")
PYPI_LAST_GPU = Version("2.6.2")  # PyPI's newest paddlepaddle-gpu (checked by the test below when online)


def _extras() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {k: [Requirement(r) for r in v] for k, v in project["optional-dependencies"].items()}


def _doc_command() -> list[str]:
    """The install command of docs/gpu.md (its first fenced line that installs the `gpu` extra)."""
    blocks = re.findall(r"```bash\n(.*?)```", GPU_DOC.read_text(), flags=re.S)
    lines = [ln.split("#")[0].split() for b in blocks for ln in b.splitlines() if "[gpu" in ln]
    assert lines, "docs/gpu.md shows no command installing the gpu extra"
    return lines[0]


def _gpu_requirement() -> Requirement:
    (req,) = [r for r in _extras()["gpu"] if r.name == "paddlepaddle-gpu"]
    return req


def test_the_docs_command_installs_an_extra_of_pyproject_with_paddles_index():
    words = _doc_command()
    assert words[:3] == ["pip", "install", "-e"]
    extras = re.fullmatch(r'"?\.\[([a-z,]+)\]"?', words[3]).group(1).split(",")
    assert "gpu" in extras and "cpu" not in extras and set(extras) <= set(_extras())
    url = words[words.index("--extra-index-url") + 1]
    assert PADDLE_INDEX.fullmatch(url), url  # an extra index: the zoo's other dependencies stay on PyPI
    named = re.findall(r"https://www\.paddlepaddle\.org\.cn/[^\s`)]*", GPU_DOC.read_text())
    assert named and all(PADDLE_INDEX.fullmatch(u) for u in named), named


def test_the_versions_named_are_in_the_ranges_stated():
    spec = _gpu_requirement().specifier
    (cpu,) = [r for r in _extras()["cpu"] if r.name == "paddlepaddle"]
    assert spec == cpu.specifier  # the two builds of one Paddle
    assert not spec.contains(PYPI_LAST_GPU)  # pip cannot settle for PyPI's 2.x (no Paddle 3 API)
    text = GPU_DOC.read_text()
    pins = re.findall(r"paddlepaddle-gpu==([0-9.]+)", text)
    assert pins and all(spec.contains(p) for p in pins), pins
    assert f"paddlepaddle-gpu{spec}" in text  # the error pip gives without the index, as the page quotes it
    assert str(PYPI_LAST_GPU) in text
    # the pyproject comment gives the docs' command word for word
    comment = " ".join(_doc_command())
    assert comment in (ROOT / "pyproject.toml").read_text()


def _unreachable(index: str) -> str | None:
    """Why ``index``'s page of paddlepaddle-gpu cannot be read from here (pip's own log, with no
    retries, says only "No matching distribution"), or None when it can."""
    request = urllib.request.Request(index.rstrip("/") + "/paddlepaddle-gpu/", headers={"User-Agent": "pip"})
    try:
        with urllib.request.urlopen(request, timeout=20):
            return None
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} {e.reason}"
    except (urllib.error.URLError, OSError) as e:
        return str(getattr(e, "reason", e))


def _index_versions(index: str) -> tuple[list[Version] | None, str]:
    """``pip index versions paddlepaddle-gpu --index-url index``: (versions, '') or (None, why not)."""
    why = _unreachable(index)
    if why is not None:
        return None, why
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "paddlepaddle-gpu", "--index-url", index,
                           "--retries", "1", "--timeout", "30", "--disable-pip-version-check"],
                          capture_output=True, text=True, timeout=300)
    found = re.search(r"Available versions: (.+)", proc.stdout)
    if found:
        return [Version(v.strip()) for v in found.group(1).split(",")], ""
    return None, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"pip exit {proc.returncode}"


def test_pypi_alone_cannot_install_the_gpu_extra():
    """Why the command carries Paddle's index: PyPI has no paddlepaddle-gpu in the extra's range."""
    versions, why = _index_versions("https://pypi.org/simple/")
    if versions is None:
        pytest.skip(f"PyPI cannot be reached from here: {why}")
    spec = _gpu_requirement().specifier
    assert max(versions) == PYPI_LAST_GPU and not list(spec.filter(versions)), (
        f"PyPI now has paddlepaddle-gpu {max(versions)}: docs/gpu.md and pyproject.toml's comment say it stops "
        f"at {PYPI_LAST_GPU}; update them (the extra index may no longer be needed)")


def test_paddles_index_resolves_the_gpu_extra():
    """What ``pip install -e ".[gpu]" --extra-index-url <docs' index>`` picks: a version in the extra's
    range, and the docs' pin among the versions offered for this interpreter."""
    url = _doc_command()[_doc_command().index("--extra-index-url") + 1]
    versions, why = _index_versions(url)
    if versions is None:
        pytest.skip(f"Paddle's index {url} cannot be reached from here: {why}")
    offered = list(_gpu_requirement().specifier.filter(versions))
    assert offered, f"{url} offers no paddlepaddle-gpu in {_gpu_requirement().specifier}: {versions}"
    pins = {Version(p) for p in re.findall(r"paddlepaddle-gpu==([0-9.]+)", GPU_DOC.read_text())}
    assert pins <= set(versions), f"docs/gpu.md names {sorted(map(str, pins))}; {url} has {versions}"
