"""Sweep: ``python tools/sweep.py [--jobs 2] [--dir multirun/NAME] -- key=a,b seed=0,1,2 ...``.

Expands comma lists like ``tools/train.py -m`` (cartesian product, seed varying slowest so that
every precision of a seed finishes together) and runs the jobs ``--jobs`` at a time, each with
``--threads`` threads (default 1: Paddle's CPU step is fastest single-threaded, so two jobs on a
2-core machine), each in ``<dir>/<key=value_key=value...>`` with its log in ``<dir>/logs``. Run the same
command again to continue: completed jobs are skipped, interrupted ones resume from their
checkpoint. A failed job does not stop the others; it is named at the end with its log.
Then ``python tools/report.py <dir>`` (the last line says so, or, when no job of the sweep has
completed, that nothing completed).
Exit status: 0 every job completed, 1 some failed, 2 bad command line, 130 / 143 stopped by Ctrl-C /
SIGTERM (the running jobs checkpoint first).
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import _entry  # noqa: F401  (puts the repo on sys.path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="jobs at a time (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="threads per job (OMP_NUM_THREADS, default 1)")
    parser.add_argument("--dir", default=None, help="sweep folder (default multirun/<time stamp>)")
    parser.add_argument("--dry-run", action="store_true", help="list the jobs and their commands only")
    parser.add_argument("overrides", nargs="*", help="train.py overrides; key=a,b,c sweeps a key")
    args = parser.parse_args(argv)

    from zoo.engine.sweep import SweepError, run_sweep

    folder = args.dir or f"multirun/{dt.datetime.now():%Y-%m-%d_%H-%M-%S}"
    try:
        return run_sweep(Path(__file__).resolve().parent / "train.py", args.overrides, folder, args.jobs,
                         args.threads, args.dry_run)
    except SweepError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
