"""Shared start-up for the Hydra entry points: import path, resolvers, clean user errors.

Importing it also silences two of Paddle's warnings that say nothing about the user's run:
"No ccache found" (every ``import paddle`` gives it; it concerns compiling C++ extensions, which no
tool does) and BatchNorm's "When training, we now always track global mean and variance" (every
train-mode forward of every BatchNorm gives it; it describes Paddle's behaviour since 2.0, not a
problem). It also makes Hydra's own composition errors
(``amp=O3``, ``trainer.max_stepz=3``) one ``error:`` line with exit status 2, as the zoo's are.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import sys
import warnings
from pathlib import Path


def quiet_paddle_warnings() -> None:
    """Ignore the two Paddle warnings above: each exact message, nothing broader."""
    # Before anything imports paddle: its cpp_extension module warns at import when ccache is missing.
    warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
    # paddle/nn/layer/norm.py, _BatchNormBase.forward: that one message from that one module.
    warnings.filterwarnings("ignore", message=r"When training, we now always track global mean and variance\.$",
                            category=UserWarning, module=r"paddle\.nn\.layer\.norm$")


quiet_paddle_warnings()

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(ROOT / "configs")
if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

from omegaconf import OmegaConf  # noqa: E402

from zoo.engine.from_run import evaluated_run_name, value_from_run  # noqa: E402
from zoo.engine.runinfo import run_stamp  # noqa: E402

OmegaConf.register_new_resolver("run_stamp", run_stamp, replace=True)
# ${from_run:KEY,FALLBACK,SOURCE...}: KEY of the run a tool is given (eval.yaml / export.yaml name their folder by it)
OmegaConf.register_new_resolver("from_run", value_from_run, replace=True)
# ${evaluated_run_name:FALLBACK,SOURCE...}: eval.yaml's folder name, the run's in the precision evaluated
OmegaConf.register_new_resolver("evaluated_run_name", evaluated_run_name, replace=True)


def config_of_run(cfg, alias: str, config_name: str):
    """tools/eval.py and tools/export.py: given ``run=`` (or the older ``alias``), the run's saved
    config with this command line's overrides on top (:func:`zoo.engine.from_run.with_run_config`);
    the notes (an old key, which config was read) go to stderr."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    from zoo.engine.from_run import with_run_config

    overrides = list(HydraConfig.get().overrides.task)
    merged, notes = with_run_config(cfg, overrides, lambda o: compose(config_name=config_name, overrides=o),
                                    alias, CONFIG_DIR)
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    return merged

HYDRA_GRAMMAR = "https://hydra.cc/docs/1.2/advanced/override_grammar/basic"


def hydra_error_line(err: BaseException) -> str | None:
    """One line for an error of Hydra's composition (a bad override), or None for other errors.

    ``amp=O3`` -> ``amp=O3: no such choice; valid: O1, O2, ...``; ``trainer.max_stepz=3`` ->
    ``trainer.max_stepz: no such key (did you mean trainer.max_steps?); ...``; a syntax error names
    the override; any other composition error is its message on one line.
    """
    import difflib

    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    if isinstance(err, MissingConfigException) and err.options and err.missing_cfg_file \
            and "/" in err.missing_cfg_file:
        group, choice = err.missing_cfg_file.rsplit("/", 1)
        return f"{group}={choice}: no such choice; valid: {', '.join(err.options)}"
    if isinstance(err, OverrideParseException):
        lines = [x.strip() for x in err.message.splitlines() if x.strip() and not x.startswith("See http")]
        reason = lines[-1] if lines else "cannot be parsed"
        return f"{err.override}: cannot parse this override ({reason}); grammar: {HYDRA_GRAMMAR}"
    if not isinstance(err, ConfigCompositionException):
        return None
    text = str(err)
    if text.startswith("You must specify 'family'"):  # a model config that selects no family
        choices = text.split("Available options:")[-1].split() if "Available options:" in text else []
        return ("family: the model's config selects no family; add '- override /family: <name>' at the end "
                "of the defaults list of configs/model/<model>.yaml (families: "
                f"{', '.join(choices) or 'configs/family/'}; docs/architecture.md, where to add a model)")
    unknown = re.match(r"Could not override '([^']+)'\.\s*To append to your config use \+(\S+)", text)
    cause = err.__cause__
    if unknown and cause is not None and getattr(cause, "full_key", None):
        key, override = unknown.group(1), unknown.group(2)
        parent = getattr(cause, "parent_node", None)
        names = [str(k) for k in parent.keys() if k != "hydra"] if parent is not None else []
        missing = str(cause.full_key)
        prefix = missing.rsplit(".", 1)[0] + "." if "." in missing else ""
        near = difflib.get_close_matches(missing.rsplit(".", 1)[-1], names, n=1)
        hint = f" (did you mean {prefix}{near[0]}?)" if near else ""
        return f"{key}: no such key{hint}; a new key needs a +: +{override}"
    lines = [x.strip() for x in text.split("\nConfig search path:")[0].splitlines() if x.strip()]
    return " ".join(lines) if lines else None


def _clean_hydra_errors() -> None:
    """Wrap Hydra's ``run_and_report`` so its composition errors become ``error: <line>``, exit 2.

    Hydra (1.3) prints them over several lines plus a hint, and exits 1; everything else it reports
    as before. ``HYDRA_FULL_ERROR=1`` keeps Hydra's own report (and its traceback)."""
    # A private function of Hydra 1.3 (pyproject pins hydra-core<1.4); if a release moves it, the
    # tools keep working with Hydra's own multi-line messages (tests/test_cli.py then fails).
    try:
        from hydra._internal import utils as hydra_utils
    except ImportError:
        return
    original = getattr(hydra_utils, "run_and_report", None)
    if original is None or getattr(original, "ampzoo", False):
        return

    def run_and_report(func):
        def composing():
            try:
                return func()
            except Exception as err:
                line = None if os.environ.get("HYDRA_FULL_ERROR") == "1" else hydra_error_line(err)
                if line is None:
                    raise
                print(f"error: {line}", file=sys.stderr, flush=True)
                raise SystemExit(2) from None
        return original(composing)

    run_and_report.ampzoo = True
    hydra_utils.run_and_report = run_and_report


_clean_hydra_errors()


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input (config, data, checkpoints): shown as one clear line, exit status 2."""
    from zoo.amp import AmpConfigError, AmpUnsupportedError
    from zoo.amp.numerics_guard import NumericsGuardStop
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

    from zoo.engine.run import NumericsFailed
    from zoo.engine.runinfo import announce
    from zoo.engine.signals import TrainingInterrupted, forget_stop, ignoring_stop_signals, last_stop

    forget_stop()
    try:
        return fn(*args)
    except NumericsFailed as none:  # summary.json is written; exit 3 so a script or sweep sees it
        announce(f"error: {none}", sys.stderr, logging.ERROR)
        sys.exit(none.exit_status)
    except KeyboardInterrupt as err:
        # A stop of the training (TrainingInterrupted), or a further signal that came while the stop
        # unwound (the trainer's handlers gone): either way the trainer's line, which names the kept
        # checkpoint and the resume command. Only a signal before training began is "outside".
        stop = err if isinstance(err, TrainingInterrupted) else last_stop()
        with ignoring_stop_signals():  # a further Ctrl-C must not cut the line or the exit short
            if stop is not None:
                announce(str(stop), sys.stderr, logging.WARNING)
            else:
                announce("interrupted (outside the training loop; the run folder keeps its last checkpoint, "
                         "if any)", sys.stderr, logging.WARNING)
                remove_failed_start()
        sys.exit(stop.exit_status if stop is not None else 130)
    except (*user_errors(), OmegaConfBaseException) as err:
        status = report_error(err)
        remove_failed_start()
        sys.exit(status)
    except OSError as err:
        if err.errno not in _ENVIRONMENT_ERRNOS:
            raise
        sys.exit(report_error(err))
