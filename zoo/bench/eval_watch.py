"""What counting non-finite values costs an evaluation (MODEL_CARDS.md, "Evaluation under AMP").

    python -m zoo.bench.eval_watch <run folder> fp32|O1 [--repeats 2]

Evaluates the run's final weights on its validation split with ``zoo.engine.evaluate.evaluate``
as it is (the :class:`~zoo.amp.nonfinite.NonFiniteWatch` inside: every layer's output under low
precision, the outputs in FP32) and with a no-op in the watch's place, alternating the two
``--repeats`` times in one process, and prints both times and their ratio (sum over sum). ``O1`` is
the emulated fp16 O1 of the run's own black list.
"""
from __future__ import annotations

import argparse
import time

import zoo.engine.evaluate as evaluation
from zoo.amp import Amp, current_device


class _NoWatch:
    def __init__(self, model, layers=True):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_batch(self, indices):
        pass

    def result(self) -> dict:
        return {"images": 0, "nonfinite_images": 0}


def measure(run: str, precision: str, repeats: int) -> dict:
    from omegaconf import OmegaConf

    from zoo.engine.from_run import resolve_weights, run_folder_of
    from zoo.engine.run import build

    folder = run_folder_of(run)
    cfg = OmegaConf.load(folder / "config.yaml")
    weights, _ = resolve_weights(str(folder), "run")
    model = build(cfg.model.net, "model.net")
    model.set_state_dict(weights)
    task, val = build(cfg.model.task, "model.task"), build(cfg.data.builder, "data").build("val", cfg.seed)
    amp = Amp() if precision == "fp32" else Amp(name="O1", enabled=True, level="O1",
                                                custom_black_list=list(cfg.amp.custom_black_list))
    amp.setup(model, None, current_device())
    real, times = evaluation.NonFiniteWatch, {"watch": [], "none": []}
    try:
        for _ in range(repeats):
            for kind in ("watch", "none"):
                evaluation.NonFiniteWatch = real if kind == "watch" else _NoWatch
                t0 = time.perf_counter()
                evaluation.evaluate(model, task, amp, val, cfg.model.eval_batch_size)
                times[kind].append(time.perf_counter() - t0)
    finally:
        evaluation.NonFiniteWatch = real
    return {"precision": amp.effective, "images": len(val), "seconds": times,
            "ratio": sum(times["watch"]) / sum(times["none"])}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("precision", choices=("fp32", "O1"))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    out = measure(args.run, args.precision, args.repeats)
    shown = {k: [round(x, 1) for x in v] for k, v in out["seconds"].items()}
    print(f"{out['precision']}, {out['images']} images: with the watch {shown['watch']} s, without "
          f"{shown['none']} s; ratio {out['ratio']:.3f}")


if __name__ == "__main__":
    main()
