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
    from zoo.engine.checkpoint import CheckpointError
    from zoo.engine.run import ConfigError
    from zoo.models import UnknownModelError
    return (ConfigError, AmpConfigError, AmpUnsupportedError, CheckpointError, UnknownModelError,
            NumericsGuardStop, FileNotFoundError, ValueError)


def fail(err: BaseException) -> None:
    """Print ``error: ...`` (full traceback with HYDRA_FULL_ERROR=1) and exit 2."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    print(f"error: {err}", file=sys.stderr, flush=True)
    sys.exit(2)
