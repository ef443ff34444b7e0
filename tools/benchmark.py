"""Training throughput benchmarks.

    python tools/benchmark.py --steps 30 --warmup 5 model=resnet18            # engine vs bare loop
    python tools/benchmark.py --against fp32 --steps 20 model=db_det amp=O1  # AMP step time vs FP32
    python tools/benchmark.py --against eager --steps 10 model=resnet18      # trainer.compile vs eager

``--against bare`` (default): the zoo's training loop against a bare Paddle loop.

Both loops train the same model (same seed) on the same dataset with the same optimizer, batch size
and worker count; the bare loop is a paddle.io.DataLoader, forward, cross-entropy, backward, step,
clear_grad and reading the loss, nothing else. Throughput is images per wall-clock second over the
steps after the warm-up, data loading included.

``--against fp32``: the engine with the configured ``amp`` against the same run with ``amp=fp32``;
on a CPU that measures the cost of emulation. ``--against eager``: the engine with
``trainer.compile=true`` (paddle.jit.to_static around autocast + forward + loss) against the same run
with ``trainer.compile=false``; the warm-up steps absorb the tracing. All comparisons alternate the two
runs in one process and report the ratio of medians. Everything after the flags is a Hydra override
of configs/train.yaml.

``--pipeline``: the input pipeline alone, ms per image per stage and images/s per core, medians over
``--passes`` passes over the first ``--images`` training images (pin it: ``taskset -c 1`` with
OMP_NUM_THREADS=1). DB only: ``--against paddleocr PATH`` also runs PaddleOCR's own det_mv3_db train
transforms from the source tree PATH on the same images, alternating pass by pass, and prints the
ratio (PaddleOCR's requirements must be importable by $AMPZOO_PADDLEOCR_PYTHON, default this python;
otherwise the comparison is skipped, saying why)::

    taskset -c 1 env OMP_NUM_THREADS=1 python tools/benchmark.py --pipeline model=db_det \
        data.builder.image_size=[720,1280] data.builder.crop_size=640 --against paddleocr ~/PaddleOCR

``--train-against paddleocr PATH``: whole training runs, the zoo's ``tools/train.py model=db_det
amp=fp32 trainer.final_eval=false trainer.max_steps=N`` against PaddleOCR's own ``tools/train.py``
(det_mv3_db.yml with the zoo's crop and batch) on the same synthetic_text images, ``--steps N``,
alternating the two commands ``--repeats`` times, OMP_NUM_THREADS=1, training img/s after
``--warmup`` steps and whole-command wall time (zoo/bench/paddleocr_train.py says how)::

    AMPZOO_PADDLEOCR_PYTHON=/tmp/pocr_venv/bin/python python tools/benchmark.py --train-against \
        paddleocr /tmp/paddleocr_src --steps 16 --warmup 2 --repeats 2

Both PaddleOCR comparisons take ``model=ppocrv5_mobile_det`` among the overrides: then against
PaddleOCR's ``configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml`` (its transforms; its training, from
scratch on both sides, the parameter counts checked equal).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import _entry
import numpy as np
import paddle
import paddle.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from zoo.engine.metrics_log import read_metrics
from zoo.engine.run import build_data, seed_everything, train


def bare_loop(cfg, steps: int, warmup: int) -> float:
    """Images/s of a minimal hand-written loop on the configured model and data."""
    import zoo

    seed_everything(cfg.seed)
    train_set, _, _ = build_data(cfg)
    model = zoo.create_model(cfg.model.name, num_classes=cfg.data.num_classes)
    # The optimizer class and arguments of the config, with a plain float LR.
    opt = instantiate(cfg.optim.optimizer)(learning_rate=cfg.optim.lr, parameters=model.parameters())
    loader = paddle.io.DataLoader(train_set, batch_size=cfg.model.batch_size, shuffle=True,
                                  drop_last=True, num_workers=cfg.trainer.num_workers)
    stamps = []
    model.train()
    while len(stamps) <= warmup + steps:
        for batch in loader:
            loss = F.cross_entropy(model(batch["image"]), batch["label"].reshape([-1]))
            loss.backward()
            opt.step()
            opt.clear_grad()
            float(loss)
            stamps.append(time.perf_counter())
            if len(stamps) > warmup + steps:
                break
    return steps * cfg.model.batch_size / (stamps[warmup + steps] - stamps[warmup])


def engine_loop(cfg, steps: int, warmup: int) -> float:
    """Images/s of the zoo's Trainer over the same steps (from its per-step metrics log)."""
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, tmp, announce_folder=False)  # the folder is deleted: do not print it
        recs = read_metrics(Path(tmp) / "metrics.jsonl", "train")
    t = {r["step"]: r["time"] for r in recs}
    return steps * cfg.model.batch_size / (t[warmup + steps + 1] - t[warmup + 1])


def pipeline_benchmark(args, overrides: list[str]) -> dict:
    """``--pipeline``: stage timings of the configured training pipeline (see the module doc)."""
    from zoo.bench import pipeline as pipeline_bench

    with initialize_config_dir(config_dir=_entry.CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    train_set, _, _ = build_data(cfg)
    return pipeline_bench.run(cfg, train_set, args.images, args.passes, args.against, args.workers)


def train_against_benchmark(args) -> dict:
    """``--train-against paddleocr PATH``: see zoo/bench/paddleocr_train.py."""
    from zoo.bench import paddleocr_train as paddleocr_train_bench
    from zoo.bench import pipeline as pipeline_bench

    work = args.work or Path(tempfile.mkdtemp(prefix="ampzoo_pocr_train_"))
    return paddleocr_train_bench.run(_entry.CONFIG_DIR, Path(__file__).resolve().parent / "train.py",
                                     Path(args.train_against[1]), pipeline_bench.default_python(),
                                     work, args.overrides, args.steps, args.warmup, args.repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per loop")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repeats of both loops")
    ap.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    ap.add_argument("--against", nargs="+", default=["bare"], metavar="WHAT",
                    help="bare (a bare Paddle loop) | fp32 (AMP against FP32) | eager (trainer.compile=true "
                         "against false) | with --pipeline: "
                         "paddleocr PATH_TO_PADDLEOCR_SOURCE")
    ap.add_argument("--pipeline", action="store_true", help="time the input pipeline alone, per stage")
    ap.add_argument("--images", type=int, default=200, help="--pipeline: training images per pass")
    ap.add_argument("--passes", type=int, default=5, help="--pipeline: timed passes (alternated)")
    ap.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[],
                    help="--pipeline: also the loader's images/s with these trainer.num_workers, e.g. 0,1,2")
    ap.add_argument("--train-against", nargs="+", default=None, metavar="WHAT",
                    help="paddleocr PATH_TO_PADDLEOCR_SOURCE: db_det (or model=ppocrv5_mobile_det) training "
                         "img/s against PaddleOCR's tools/train.py (--steps, --warmup, --repeats; "
                         "$AMPZOO_PADDLEOCR_PYTHON)")
    ap.add_argument("--work", type=Path, default=None,
                    help="--train-against: folder for the data lists, config, logs (default a new temp folder)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=resnet18")
    args = ap.parse_args()
    # nargs="+" also swallows the Hydra overrides written after --against paddleocr PATH
    args.overrides = [a for a in args.against if "=" in a] + args.overrides
    args.against = [a for a in args.against if "=" not in a]
    if args.train_against is not None:
        args.overrides = [a for a in args.train_against if "=" in a] + args.overrides
        args.train_against = [a for a in args.train_against if "=" not in a]
        if len(args.train_against) != 2 or args.train_against[0] != "paddleocr":
            ap.error("--train-against: expected paddleocr PATH_TO_PADDLEOCR_SOURCE")
        if args.pipeline or args.against != ["bare"]:
            ap.error("--train-against runs alone (not with --pipeline or --against)")
        from zoo.bench.paddleocr_train import split_model

        try:
            split_model(args.overrides)
        except ValueError as e:
            ap.error(str(e))
        if not (Path(args.train_against[1]).expanduser() / "tools" / "train.py").is_file():
            ap.error(f"--train-against paddleocr: {args.train_against[1]} is not a PaddleOCR source tree "
                     "(no tools/train.py)")
        result = train_against_benchmark(args)
        if args.out:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        return
    if args.pipeline:
        if args.against == ["bare"]:
            args.against = []
        if args.against and (args.against[0] != "paddleocr" or len(args.against) != 2):
            ap.error("--pipeline compares only with: --against paddleocr PATH_TO_PADDLEOCR_SOURCE")
        result = pipeline_benchmark(args, args.overrides)
        if args.out:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        return
    if len(args.against) != 1 or args.against[0] not in ("bare", "fp32", "eager"):
        ap.error(f"--against: expected bare, fp32 or eager (paddleocr PATH needs --pipeline), got "
                 f"{' '.join(args.against)}")
    args.against = args.against[0]
    over = ["trainer.log_every=1", "trainer.eval_every=0", "trainer.progress=false",
            f"trainer.max_steps={args.warmup + args.steps + 1}", "trainer.ckpt_every=1000000",
            "optim.optimizer.multi_precision=false", "trainer.eval_precision=train",
            "trainer.final_eval=false",  # timing runs: the evaluation after the last step is not timed anyway
            *args.overrides]
    if args.against == "eager":  # last, so the two arms differ in trainer.compile whatever was passed
        over = [*over, "trainer.compile=true"]
    reference = {"fp32": ["amp=fp32"], "eager": ["trainer.compile=false"]}.get(args.against, [])
    with initialize_config_dir(config_dir=_entry.CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=over)
        ref_cfg = compose(config_name="train", overrides=[*over, *reference])
    a_runs, b_runs = [], []
    for _ in range(args.repeats):  # alternate, so drift in machine load hits both alike
        if args.against == "bare":
            b_runs.append(bare_loop(cfg, args.steps, args.warmup))
        else:
            b_runs.append(engine_loop(ref_cfg, args.steps, args.warmup))
        a_runs.append(engine_loop(cfg, args.steps, args.warmup))
    a, b = float(np.median(a_runs)), float(np.median(b_runs))
    result = {"model": cfg.model.name, "data": cfg.data.name, "batch_size": cfg.model.batch_size,
              "amp": cfg.amp.name, "against": args.against, "steps": args.steps, "warmup": args.warmup,
              "repeats": args.repeats, "compiled": bool(cfg.trainer.compile), "images_per_s": a,
              "reference_images_per_s": b, "runs": a_runs,
              "reference_runs": b_runs, "device": paddle.device.get_device(),
              "paddle_version": paddle.__version__}
    if args.against == "bare":
        result["ratio"] = a / b
        print(f"{cfg.model.name} batch {cfg.model.batch_size}: engine {a:.1f} img/s, bare loop {b:.1f} img/s, "
              f"ratio {result['ratio']:.3f} (median of {args.repeats}, {args.steps} steps after "
              f"{args.warmup} warm-up)")
    elif args.against == "eager":
        result["step_time_ratio"] = b / a
        print(f"{cfg.model.name} batch {cfg.model.batch_size} amp={cfg.amp.name}: compiled {a:.2f} img/s, eager "
              f"{b:.2f} img/s, compiled/eager step time ratio {result['step_time_ratio']:.3f} (median of "
              f"{args.repeats}, {args.steps} steps after {args.warmup} warm-up)")
    else:
        result["step_time_ratio"] = b / a
        print(f"{cfg.model.name} batch {cfg.model.batch_size}: amp={cfg.amp.name} {a:.2f} img/s, fp32 {b:.2f} img/s, "
              f"step time ratio {result['step_time_ratio']:.3f} (median of {args.repeats}, {args.steps} steps "
              f"after {args.warmup} warm-up)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")

if __name__ == "__main__":
    main()
