"""A/B of two configurations of the zoo's DB train pipeline, passes alternated in one run.

Each arm is a child process that builds the training set from the common overrides plus its own,
calls ``process_init`` as the loader does (e.g. ``data.builder.keep_freed_memory``, a per-process
setting that cannot be undone within a process, hence two processes), warms up, then times one
pass over the first IMAGES images per request (``zoo.bench.pipeline.db_pass``). The parent
alternates them ABBA..., so drift in machine load hits both alike, and prints the medians per
stage and the median of the per-pass ratios A/B (with their range). Pin it with taskset::

    OMP_NUM_THREADS=1 taskset -c 1 python tools/pipeline_ab.py --passes 8 --images 200 \\
        --a data.builder.keep_freed_memory=true --b data.builder.keep_freed_memory=false \\
        model=db_det data.builder.image_size=[720,1280] data.builder.crop_size=640 \\
        data.builder.num_train=200 data.builder.num_val=1 data.builder.max_instances=34 data.builder.max_polys=200
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import _entry  # noqa: F401  (import path, resolvers)


def child(images: int, overrides: list[str]) -> None:
    from hydra import compose, initialize_config_dir

    from zoo.bench import pipeline as pb
    from zoo.engine.run import build_data

    with initialize_config_dir(config_dir=_entry.CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    ds, _, _ = build_data(cfg)
    n = min(images, len(ds))
    ds.process_init()
    pb.db_pass(ds, n, 10**6)  # warm-up (an epoch no timed pass uses)
    print(json.dumps({"images": n}), flush=True)
    for line in sys.stdin:
        print(json.dumps(pb.db_pass(ds, n, int(line))), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--a", type=str.split, required=True, metavar="'OVERRIDES'", help="arm A's own overrides, "
                    "one argument (quoted, space-separated)")
    ap.add_argument("--b", type=str.split, required=True, metavar="'OVERRIDES'", help="arm B's own overrides")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="common Hydra overrides, e.g. model=db_det")
    args = ap.parse_args()
    if args.child:
        return child(args.images, args.overrides)
    import numpy as np

    kids = [subprocess.Popen([sys.executable, __file__, "--child", "--images", str(args.images), "--a", "",
                              "--b", "", *args.overrides, *arm], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True) for arm in (args.a, args.b)]
    hello = [kid.stdout.readline() for kid in kids]
    if not all(h.strip() for h in hello):
        sys.exit("pipeline_ab: an arm failed to start (its error is above)")
    n = json.loads(hello[0])["images"]
    res: list[list[dict]] = [[], []]
    for p in range(args.passes):
        for i in (0, 1) if p % 2 == 0 else (1, 0):
            kids[i].stdin.write(f"{p}\n")
            kids[i].stdin.flush()
            res[i].append(json.loads(kids[i].stdout.readline()))
    for kid in kids:
        kid.stdin.close()
        kid.wait()
    print(f"A: {' '.join(args.a)}\nB: {' '.join(args.b)}\n{'stage':<12} {'A ms':>7} {'B ms':>7} {'A/B':>6}  "
          f"(medians of {args.passes} passes of {n} images; A/B: median of per-pass ratios)")
    for s in [*res[0][0], "total"]:
        ta, tb = ([sum(r.values()) if s == "total" else r[s] for r in arm] for arm in res)
        ratio = np.array(ta) / np.array(tb)
        print(f"{s:<12} {np.median(ta) * 1e3 / n:7.2f} {np.median(tb) * 1e3 / n:7.2f} {np.median(ratio):6.2f}  "
              f"passes {ratio.min():.2f}-{ratio.max():.2f}")


if __name__ == "__main__":
    main()
