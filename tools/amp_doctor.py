"""Predict where fp16 or bf16 will overflow, underflow or flush, from a few steps, before a long run.

    python tools/amp_doctor.py model=db_det amp=O2 amp.custom_black_list=[]
    python tools/amp_doctor.py model=ppyoloe_s amp=O2 doctor.steps=3 doctor.out=outputs/doc

Everything is a Hydra override of configs/doctor.yaml (configs/train.yaml plus ``doctor.*``): the
same groups and recipes as training. Measures the configured steps in FP32 op by op, predicts with
the emulation's op rule, repeats the steps emulated to check, and writes doctor.json, doctor.png and
index.html into doctor.out (default outputs/doctor/<model>_<amp>). Exit status 0 when the verdict is
OK, 1 when it is risky or will fail, 2 for bad input. See zoo/diagnostics/doctor.py and zoo/diagnostics/prescribe.py.

    python tools/amp_doctor.py model=db_det amp=O1 --memory --gpu-memory 80GB

--memory predicts instead the peak GPU memory of a training step per precision (fp32, O1, O2,
bf16_O1, bf16_O2, each with its recipe) and the largest batch that fits --gpu-memory (an amount,
80GB = 81920 MiB, or a card: V100-16GB, V100-32GB, A100-40GB, A100-80GB, H100-80GB, H200-141GB;
default A100-80GB) with --headroom (default 0.1) to spare; writes memory.json and memory.png into
the same folder. --cpu-check adds two real FP32 steps on this CPU at the configured batch and half of
it (fresh processes; the second step's peak of live tensors, read from Paddle's host allocator)
beside the prediction. Exit status 0, 2 for bad input. See zoo/diagnostics/memory.py and docs/doctor.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

import _entry


def _flags(args: list[str]) -> tuple[dict, list[str]]:
    """``--memory``, ``--gpu-memory X``, ``--headroom H`` (also as ``--flag=value``) out of ``args``;
    the rest are Hydra overrides."""
    flags, rest, it = {}, [], iter(args)
    for a in it:
        name, eq, value = a.partition("=")
        if name in ("--memory", "--cpu-check"):
            flags[name[2:].replace("-", "_")] = True
        elif name in ("--gpu-memory", "--headroom"):
            value = value if eq else next(it, None)
            if value is None:
                raise ValueError(f"{name}: expected a value")
            flags[name[2:].replace("-", "_")] = value
        else:
            rest.append(a)
    if not flags.get("memory") and len(flags):
        raise ValueError(f"--{next(iter(flags)).replace('_', '-')}: only with --memory")
    return flags, rest


def _memory(flags: dict, overrides: list[str], compose) -> int:
    from zoo.diagnostics.memory import plan, write

    try:
        headroom = float(flags.get("headroom", 0.1))
    except ValueError:
        raise ValueError(f"--headroom: {flags['headroom']!r}: expected a number such as 0.1") from None
    base = [o for o in overrides if not o.startswith("amp=")]
    cfg = compose(overrides)
    result = plan(lambda prec: compose([*base, f"amp={prec}"]), card=flags.get("gpu_memory"), headroom=headroom,
                  cpu_check=bool(flags.get("cpu_check")))
    out = Path(cfg.doctor.out or f"outputs/doctor/{cfg.model.name}_{cfg.amp.name}")
    print(write(result, out), flush=True)
    return 0


def main(argv=None) -> int:
    from hydra import compose, initialize_config_dir

    overrides = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in overrides):
        print(__doc__)
        return 0
    try:
        flags, overrides = _flags(overrides)
        with initialize_config_dir(config_dir=_entry.CONFIG_DIR, version_base="1.3"):
            if flags.get("memory"):
                return _memory(flags, overrides, lambda o: compose(config_name="doctor", overrides=o))
            cfg = compose(config_name="doctor", overrides=overrides)
        from zoo.diagnostics.doctor import examine
        from zoo.diagnostics.doctor_report import write

        result = examine(cfg)
        out = Path(cfg.doctor.out or f"outputs/doctor/{cfg.model.name}_{cfg.amp.name}")
        text = write(result, out, int(cfg.doctor.get("top", 15)))
    except _entry.user_errors() as err:
        return _entry.report_error(err)
    except Exception as err:  # noqa: BLE001  (Hydra's override/compose errors: one line, status 2)
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException
        if isinstance(err, (OmegaConfBaseException, HydraException)):
            return _entry.report_error(err)
        raise
    print(text, flush=True)
    return 0 if result["verdict"] == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())
