"""Predict where fp16 or bf16 will overflow, underflow or flush, from a few steps, before a long run.

    python tools/amp_doctor.py model=db_det amp=O2 amp.custom_black_list=[]
    python tools/amp_doctor.py model=ppyoloe_s amp=O2 doctor.steps=3 doctor.out=outputs/doc

Everything is a Hydra override of configs/doctor.yaml (configs/train.yaml plus ``doctor.*``): the
same groups and recipes as training. Measures the configured steps in FP32 op by op, predicts with
the emulation's op rule, repeats the steps emulated to check, and writes doctor.json, doctor.png and
index.html into doctor.out (default outputs/doctor/<model>_<amp>). Exit status 0 when the verdict is
OK, 1 when it is risky or will fail, 2 for bad input. See zoo/diagnostics/doctor.py and zoo/diagnostics/prescribe.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import _entry


def main(argv=None) -> int:
    from hydra import compose, initialize_config_dir

    overrides = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in overrides):
        print(__doc__)
        return 0
    try:
        with initialize_config_dir(config_dir=_entry.CONFIG_DIR, version_base="1.3"):
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
