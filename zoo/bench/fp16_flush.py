"""Cost of the fp16 flush (zoo/amp/emulation.py ``FP16_FLUSH``) per emulated training step:
``python -m zoo.bench.fp16_flush`` alternates the flush and a no-op in its place, three times in one
process, on db_det's forward + backward under emulated fp16 O1 (batch 4 of 160x160), and prints the
ratio of each pair (alternated, because this machine drifts by 10-30 % between moments)."""
from __future__ import annotations

import time

import paddle

from zoo.amp import emulation as emu


def main(rounds: int = 3, steps: int = 4) -> dict:
    import zoo

    paddle.seed(0)
    model = zoo.create_model("db_det")
    model.train()
    x = paddle.randn([4, 3, 160, 160])
    real = emu._flush_tiny

    def step():
        with emu.Emulation("O1", "float16")():
            out = model(x)
            loss = sum(v.mean() for v in (out.values() if isinstance(out, dict) else [out]))
        loss.backward()
        model.clear_gradients()

    step()  # warm-up
    times: dict[str, list] = {"without": [], "with": []}
    try:
        for _ in range(rounds):
            for name in ("without", "with"):
                emu._flush_tiny = (lambda t: t) if name == "without" else real
                t0 = time.perf_counter()
                for _ in range(steps):
                    step()
                times[name].append(time.perf_counter() - t0)
    finally:
        emu._flush_tiny = real
    pairs = [w / o for w, o in zip(times["with"], times["without"])]
    print(f"with / without the flush, per pair: {', '.join(f'{r:.3f}' for r in pairs)}; "
          f"sum ratio {sum(times['with']) / sum(times['without']):.3f}")
    return {"pairs": pairs, "times": times}


if __name__ == "__main__":
    main()
