"""Engine overhead: training throughput of tools/train.py's loop against a bare Paddle loop.

    python tools/benchmark.py --steps 30 --warmup 5 model=resnet18

Both loops train the same model (same seed) on the same dataset with the same optimizer, batch size
and worker count; the bare loop is a paddle.io.DataLoader, forward, cross-entropy, backward, step,
clear_grad and reading the loss, nothing else. Throughput is images per wall-clock second over the
steps after the warm-up, data loading included. Everything after the flags is a Hydra override of configs/train.yaml.
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
    train_set, _ = build_data(cfg)
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
        train(cfg, tmp)
        recs = read_metrics(Path(tmp) / "metrics.jsonl", "train")
    t = {r["step"]: r["time"] for r in recs}
    return steps * cfg.model.batch_size / (t[warmup + steps + 1] - t[warmup + 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per loop")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--repeats", type=int, default=2, help="alternating repeats of both loops")
    ap.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=resnet18")
    args = ap.parse_args()
    over = ["trainer.log_every=1", "trainer.eval_every=0", "trainer.progress=false",
            f"trainer.max_steps={args.warmup + args.steps + 1}", "trainer.ckpt_every=1000000",
            "sched=constant", "optim.optimizer.multi_precision=false", *args.overrides]
    with initialize_config_dir(config_dir=_entry.CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=over)
    engine, bare = [], []
    for _ in range(args.repeats):  # alternate, so drift in machine load hits both alike
        bare.append(bare_loop(cfg, args.steps, args.warmup))
        engine.append(engine_loop(cfg, args.steps, args.warmup))
    result = {"model": cfg.model.name, "data": cfg.data.name, "batch_size": cfg.model.batch_size,
              "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
              "engine_images_per_s": float(np.median(engine)), "bare_images_per_s": float(np.median(bare)),
              "engine_runs": engine, "bare_runs": bare, "device": paddle.device.get_device(),
              "paddle_version": paddle.__version__}
    result["ratio"] = result["engine_images_per_s"] / result["bare_images_per_s"]
    print(f"{cfg.model.name} batch {cfg.model.batch_size}: engine {result['engine_images_per_s']:.1f} img/s, "
          f"bare loop {result['bare_images_per_s']:.1f} img/s, ratio {result['ratio']:.3f} (median of "
          f"{args.repeats}, {args.steps} steps after {args.warmup} warm-up)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
