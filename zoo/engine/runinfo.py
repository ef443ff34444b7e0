"""Facts about a run that go into summary.json, and the run-folder time stamp."""
from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import os
import resource
import subprocess
import sys
from pathlib import Path

import paddle

from zoo.utils.fileio import with_filename
from zoo.utils.progress import write_line

_REPO = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def git_revision() -> str:
    """Commit of the zoo's source tree, with ``-dirty`` when it has local changes; ``unknown`` outside git.

    Read once per process, at the first call (a run calls it before training): the code a process
    runs is the code it imported, so a commit made while a run or a ``-m`` sweep is going must not
    relabel it with the later revision."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def peak_memory_mb() -> tuple[float, str]:
    """Peak memory and what it measures: device memory on a GPU, the process's peak RSS on a CPU."""
    if paddle.device.get_device().startswith("gpu"):
        return paddle.device.cuda.max_memory_allocated() / 2**20, "gpu_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, "host_rss"


_STAMP: str | None = None  # one stamp per process: every job of a Hydra -m sweep shares it


def run_stamp() -> str:
    """Time stamp for the run folder, equal on every rank of one launch and every job of one sweep.

    Hydra resolves ``hydra.sweep.dir`` again for each job of a ``-m`` sweep, so an uncached resolver
    gives each job its own folder; the stamp is computed once per process and reused. (Hydra's own
    ``${now:}`` is registered with a cache that each job's config inherits, which is why it does not
    drift; this resolver also names distributed launches by the launcher's start time.)
    Ranks start at slightly different times; under ``paddle.distributed.launch`` they share the
    launcher as parent, so its start time names the folder. ``AMPZOO_RUN_STAMP`` overrides.
    """
    global _STAMP
    if os.environ.get("AMPZOO_RUN_STAMP"):
        return os.environ["AMPZOO_RUN_STAMP"]
    if _STAMP is None:
        _STAMP = _launch_time().strftime("%Y-%m-%d_%H-%M-%S")
    return _STAMP


def _launch_time() -> _dt.datetime:
    when = _dt.datetime.now()
    if "PADDLE_TRAINER_ID" in os.environ:
        try:
            start_ticks = int(Path(f"/proc/{os.getppid()}/stat").read_text().rsplit(")", 1)[1].split()[19])
            boot = float(next(line for line in Path("/proc/stat").read_text().splitlines()
                              if line.startswith("btime")).split()[1])
            when = _dt.datetime.fromtimestamp(boot + start_ticks / os.sysconf("SC_CLK_TCK"))
        except (OSError, ValueError, IndexError, StopIteration):
            pass
    return when


def announce(message: str, stream=None, level: int = logging.INFO) -> None:
    """Print ``message`` as it is (stdout by default) and put it in the log files too.

    The console's plain lines (the precision line, the result, ``error: ...``, the interruption
    line) would otherwise be missing from the run's ``train.log``, which only the logging handlers
    write; the console handler is skipped so the line is not shown twice.
    """
    write_line(message, stream or sys.stdout)  # a progress bar on the console is cleared first
    record = logging.LogRecord("ampzoo", level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def write_json(path: Path, obj: dict) -> None:
    """Write JSON through a temp file and rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise with_filename(e, path) from e
