"""Image noise of paired AMP-vs-FP32 differences: ``python tools/split_noise.py RUN_OR_MULTIRUN_DIR [...]``.

The report's paired test holds the validation images fixed. This evaluates every paired run's final
weights again (its own precision and config; a run whose metric does not reproduce is refused) and
resamples the images, one set of draws for all runs, with the pairs fixed: the interval of the mean
paired difference over those draws says how much of it is the choice of images; added to the paired
test's seed-to-seed standard error it gives a verdict covering both. ``--out FILE`` writes the
numbers as JSON. Exit status: 0 every comparison equivalent with the image noise added, 1 some not,
2 usage/input error.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _entry  # puts the repo on sys.path; shared error reporting


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="run folders, summary.json files or multirun folders")
    parser.add_argument("--resamples", type=int, default=1000,
                        help="bootstrap draws over the images (default 1000; mAP at most 200)")
    parser.add_argument("--delta", type=float, default=None,
                        help="equivalence margin in percentage points (default: configs/report.yaml)")
    parser.add_argument("--out", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    if args.resamples < 10:
        parser.error(f"--resamples: expected at least 10, got {args.resamples}")

    from zoo.report import ReportInputError
    from zoo.report.split_noise import lines, split_noise

    try:
        entries = split_noise(args.inputs, Path(_entry.CONFIG_DIR) / "report.yaml", args.resamples, delta=args.delta,
                              progress=lambda msg: print(msg, file=sys.stderr, flush=True))
        if not entries:
            raise ReportInputError("no AMP-vs-FP32 comparison with two or more paired seeds in "
                                   + ", ".join(args.inputs))
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(entries, indent=2, default=str) + "\n")
    except (ReportInputError, OSError) as err:
        return _entry.report_error(err)
    print("\n".join(lines(entries)), flush=True)
    return 0 if all(e["with_image_noise"]["verdict"] == "equivalent" for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
