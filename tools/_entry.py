"""Shared start-up for the Hydra entry points: import path, resolvers, clean user errors."""
from __future__ import annotations

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
    from zoo.data import SampleLoadError
    from zoo.engine.checkpoint import CheckpointError
    from zoo.engine.run import ConfigError
    from zoo.models import UnknownModelError
    return (ConfigError, AmpConfigError, AmpUnsupportedError, CheckpointError, UnknownModelError,
            NumericsGuardStop, SampleLoadError, FileNotFoundError, ValueError)


def report_error(err: BaseException) -> int:
    """Print ``error: ...`` and return exit status 2 (re-raise for a traceback with HYDRA_FULL_ERROR=1)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    print(f"error: {err}", file=sys.stderr, flush=True)
    return 2


def run_or_exit(fn, *args):
    """``fn(*args)``; an input error (see :func:`user_errors`) becomes one ``error:`` line and exit 2."""
    try:
        return fn(*args)
    except user_errors() as err:
        sys.exit(report_error(err))
