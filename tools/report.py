"""AMP parity report: ``python tools/report.py RUN_OR_MULTIRUN_DIR [...] [--out DIR] [--delta X]``.

``--model-cards MODEL_CARDS.md --section NAME`` also rewrites that file's measured section NAME
(between ``<!-- measured:NAME -->`` markers) from the same runs, so the cards cannot drift, and
copies its equivalence figure to docs/parity/NAME.png beside that file, linked from the section.

Compares each AMP precision with FP32 on the primary metric (paired TOST over seeds whose start
digests agree, else Welch TOST), prints the Markdown table and writes report.md, report.json, PNGs
and index.html to --out (default <first input>/report). Runs of different git revisions, library
versions, data sets or configs are refused unless --allow-mixed.
Exit status: 0 every AMP group equivalent, 1 some not (or none left to judge), 2 usage/input error.

``--runs-table`` instead writes one row per run, with no comparison (zoo/report/runs_table.py): its
precision, any non-finite evaluation outputs, its metrics, wall time and revision; with
``--model-cards`` it rewrites that section (the quick-run tables). Exit status 0, 2 on input error.

``--against-published`` instead compares each run with the upstream figure its config's ``published``
block states (zoo/report/published.py): measured vs published, the difference and whether it is within
the stated tolerance. Exit status 0 all within, 1 some outside, 2 input error.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _entry  # puts the repo on sys.path; shared error reporting

MARGINS = Path(_entry.CONFIG_DIR) / "report.yaml"  # the equivalence margins per metric


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="*", help="run folders, summary.json files or multirun folders")
    parser.add_argument("--out", default=None, help="report folder (default: <first input>/report)")
    parser.add_argument("--delta", type=float, default=None,
                        help="equivalence margin in percentage points (default: configs/report.yaml)")
    parser.add_argument("--alpha", type=float, default=0.05, help="test level (90%% CI at 0.05)")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="compare runs whose git revision, library versions, data-set version or "
                             "config (other than amp and seed) differ; the report lists the differences")
    parser.add_argument("--model-cards", default=None, metavar="FILE",
                        help="also rewrite the measured section --section of this file (MODEL_CARDS.md)")
    parser.add_argument("--section", default=None, help="name of the <!-- measured:NAME --> section")
    parser.add_argument("--finished-only", action="store_true",
                        help="leave out run folders without summary.json yet (a sweep still running), each named "
                             "in the report's notes; without it they stop the report")
    parser.add_argument("--against-published", action="store_true",
                        help="compare each run with the published figure of its config (no parity report)")
    parser.add_argument("--published-tables", action="store_true",
                        help="rewrite the <!-- published:FAMILY --> tables of --model-cards from the experiments' "
                             "published blocks (no runs: inputs not given)")
    parser.add_argument("--runs-table", action="store_true",
                        help="one row per run (precision, non-finite outputs, metrics, time, revision), no comparison")
    args = parser.parse_args(argv)  # argparse itself exits 2 on usage errors
    if args.published_tables:
        if not args.model_cards or args.inputs:
            parser.error("--published-tables takes --model-cards FILE and no run folders")
        return _published_tables(Path(args.model_cards))
    if not args.inputs:
        parser.error("the following arguments are required: inputs")
    if args.against_published:
        from zoo.report.published import PublishedInputError, against_published
        try:
            code, text, _ = against_published(args.inputs)
        except (PublishedInputError, OSError) as err:
            return _entry.report_error(err)
        print(text, end="", flush=True)
        return code

    from zoo.report import ReportInputError, make_report, report_dir
    from zoo.report.cards import copy_figures, update_section

    if bool(args.model_cards) != bool(args.section):
        parser.error("--model-cards and --section go together")
    if args.runs_table:
        from zoo.report.runs_table import runs_table
        try:
            md, revisions = runs_table(args.inputs)
            if args.model_cards:
                command = "python tools/report.py " + " ".join(argv if argv is not None else sys.argv[1:])
                update_section(args.model_cards, args.section, md, command, revisions=revisions)
        except (ReportInputError, OSError) as err:
            return _entry.report_error(err)
        print(md, end="", flush=True)
        return 0
    try:
        code, md = make_report(args.inputs, MARGINS, args.out, args.delta, args.alpha, args.allow_mixed,
                               args.finished_only)
        if args.model_cards:
            command = "python tools/report.py " + " ".join(argv if argv is not None else sys.argv[1:])
            out = report_dir(args.inputs, args.out)
            written = json.loads((out / "report.json").read_text())  # this report's, not stale ones
            figures = [out / name for name in written["images"] if name.endswith("_equivalence.png")]
            links = copy_figures(args.model_cards, args.section, figures)
            update_section(args.model_cards, args.section, md, command, links, written.get("revisions"))
    except (ReportInputError, OSError) as err:
        return _entry.report_error(err)
    print(md, end="", flush=True)
    out = report_dir(args.inputs, args.out)
    print(f"report written to {out} (report.md, report.json, index.html, plots)", file=sys.stderr, flush=True)
    from zoo.tracking.report import log_report  # a sweep tracked with logger=mlflow: its parent run gets the verdict

    for run_id in log_report(args.inputs, out, lambda said: print(said, file=sys.stderr, flush=True)):
        print(f"report logged to the sweep's MLflow run {run_id}", file=sys.stderr, flush=True)
    return code


def composed_experiments() -> list[dict]:
    """Every experiment config with a ``published`` block, composed as tools/train.py would."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    out = []
    with initialize_config_dir(config_dir=_entry.CONFIG_DIR, version_base="1.3"):
        for path in sorted((Path(_entry.CONFIG_DIR) / "experiment").glob("*.yaml")):
            cfg = compose("train", overrides=[f"experiment={path.stem}"])
            if cfg.get("published") is None:
                continue
            plain = OmegaConf.to_container(cfg, resolve=False)
            out.append({"experiment": path.stem, "family": {"name": cfg.family.name},
                        "model": {"name": cfg.model.name}, "data": {"name": cfg.data.name},
                        "published": plain["published"]})
    return out


def _published_tables(cards: Path) -> int:
    from zoo.report.published import PublishedInputError, published_tables, rewrite_tables

    try:
        written = rewrite_tables(cards, published_tables(composed_experiments()),
                                 f"python tools/report.py --published-tables --model-cards {cards.name}")
    except (PublishedInputError, OSError) as err:
        return _entry.report_error(err)
    print(f"{cards}: rewrote the published tables of {', '.join(written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
