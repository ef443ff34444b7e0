"""Shared start-up for the Hydra entry points: import path, resolvers, clean user errors."""
from __future__ import annotations

import errno
import logging
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(ROOT / "configs")
if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from zoo.engine.runinfo import run_stamp  # noqa: E402

OmegaConf.register_new_resolver("run_stamp", run_stamp, replace=True)


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input (config, data, checkpoints): shown as one clear line, exit status 2."""
    from zoo.amp import AmpConfigError, AmpUnsupportedError
    from zoo.amp.guard import NumericsGuardStop
    from zoo.data import ImageFileError, SampleLoadError
    from zoo.engine.checkpoint import CheckpointError
    from zoo.engine.run import ConfigError
    from zoo.engine.runlock import RunFolderBusy
    from zoo.models import UnknownModelError
    return (ConfigError, AmpConfigError, AmpUnsupportedError, CheckpointError, UnknownModelError,
            NumericsGuardStop, ImageFileError, SampleLoadError, RunFolderBusy, FileNotFoundError, ValueError)


def _message(err: BaseException) -> str:
    """One line for a user error: OmegaConf errors get their key in front, OSErrors their file."""
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(err, OmegaConfBaseException):
        key = getattr(err, "full_key", None)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return f"{key}: {first}" if key and not first.startswith(str(key)) else first
    if isinstance(err, OSError) and not isinstance(err, FileNotFoundError) and err.strerror:
        name = f" {err.filename}" if err.filename else ""
        return f"cannot write or read{name}: {err.strerror} [errno {errno.errorcode.get(err.errno, err.errno)}]"
    return str(err)


def announce_error(err: BaseException) -> None:
    """Print ``error: <the one-line message>`` on stderr (and into the run's log)."""
    from zoo.engine.runinfo import announce

    announce(f"error: {_message(err)}", sys.stderr, logging.ERROR)


def report_error(err: BaseException) -> int:
    """Print ``error: ...`` and return exit status 2 (re-raise for a traceback with HYDRA_FULL_ERROR=1)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    announce_error(err)
    return 2


# Errors of the machine rather than the code: a full disk, a read-only or forbidden folder.
_ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def remove_failed_start() -> None:
    """Delete the Hydra run folder of a run that failed before writing anything of its own.

    Hydra creates it (``.hydra/`` and ``<job>.log``) before the job starts; an error at start-up
    would otherwise leave an empty-looking folder per attempt under outputs/. Folders holding
    anything else are kept; emptied parents inside the working directory go too.
    """
    import shutil

    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    out = Path(HydraConfig.get().runtime.output_dir).resolve()
    if not out.is_dir():
        return
    names = [p.name for p in out.iterdir()]
    if any(n != ".hydra" and not (n.endswith(".log") and (out / n).is_file()) for n in names):
        return
    shutil.rmtree(out, ignore_errors=True)
    cwd, parent = Path.cwd().resolve(), out.parent
    while parent != cwd and cwd in parent.parents and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def run_or_exit(fn, *args):
    """``fn(*args)``; an input error (see :func:`user_errors`) becomes one ``error:`` line and exit 2.

    A full disk (or an unwritable folder) is reported the same way, naming the file. Training
    stopped by Ctrl-C or SIGTERM prints one line (where it stopped, the checkpoint, how to resume)
    and exits 130 / 143.
    """
    from omegaconf.errors import OmegaConfBaseException

    from zoo.engine.run import NoStepUpdated
    from zoo.engine.runinfo import announce
    from zoo.engine.signals import TrainingInterrupted

    try:
        return fn(*args)
    except TrainingInterrupted as stop:
        announce(str(stop), sys.stderr, logging.WARNING)
        sys.exit(stop.exit_status)
    except NoStepUpdated as none:  # summary.json is written; exit 3 so a script or sweep sees it
        announce(f"error: {none}", sys.stderr, logging.ERROR)
        sys.exit(none.exit_status)
    except KeyboardInterrupt:
        announce("interrupted (outside the training loop; the run folder keeps its last checkpoint, if any)",
                 sys.stderr, logging.WARNING)
        remove_failed_start()
        sys.exit(130)
    except (*user_errors(), OmegaConfBaseException) as err:
        status = report_error(err)
        remove_failed_start()
        sys.exit(status)
    except OSError as err:
        if err.errno not in _ENVIRONMENT_ERRNOS:
            raise
        sys.exit(report_error(err))
