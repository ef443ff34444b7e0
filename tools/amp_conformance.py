"""Check the CPU emulation against Paddle's compiled AMP rule on one training forward.

    python tools/amp_conformance.py model=db_det amp=O2
    python tools/amp_conformance.py model=ppyoloe_tiny amp=bf16_O1 --json out.json

Everything after the flags is a Hydra override of configs/train.yaml (the same groups as
training). Prints one row per (op, Paddle's dtype, the emulation's dtype) with the number of calls
and their share of activations, then the parameters each side keeps in low precision. Exit status
0 when every difference is in zoo/diagnostics/conformance_allow.yaml (with its reason), 1 otherwise, 2 for
bad input. See zoo/diagnostics/conformance.py for how Paddle's rule is observed on a CPU.
"""
from __future__ import annotations

import os
import sys

if "amp_utils=6" not in os.environ.get("GLOG_vmodule", ""):  # glog reads it when paddle loads
    from importlib import util as _u  # noqa: F401  (keeps this block import-free otherwise)
    env = dict(os.environ, GLOG_vmodule="amp_utils=6", GLOG_logtostderr="1")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)

import argparse  # noqa: E402
import json  # noqa: E402

import _entry  # noqa: E402


def _load(overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=_entry.CONFIG_DIR, version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def _batch(cfg):
    from zoo.diagnostics.probe import train_batches

    return train_batches(cfg, 1)[0]


def check(cfg) -> tuple[object, str]:
    """Run both traces for the composed config; returns (Report, table text)."""
    from zoo.amp.emulation import Emulation
    from zoo.diagnostics import conformance as conf
    from zoo.engine.run import build, build_amp, seed_everything

    amp = build_amp(cfg)
    if not amp.enabled:
        raise ValueError(f"amp={cfg.amp.name}: conformance compares a low-precision level; pick "
                         "O1, O2, bf16_O1 or bf16_O2")
    batch = _batch(cfg)
    task = build(cfg.model.task, "model.task")

    def fresh_model():
        seed_everything(cfg.seed)
        model = build(cfg.model.net, "model.net")
        model.train()
        return model

    def forward(model):
        return task.losses(model, batch)

    emulation = Emulation(amp.level, amp.dtype, amp.white, amp.black, **amp.emulation_options)
    p_calls, p_low = conf.paddle_trace(fresh_model(), forward, amp.level, amp.dtype, amp.white, amp.black)
    e_calls, e_low = conf.emulation_trace(fresh_model(), forward, emulation)
    stored_low = (p_low if not amp.master_grad else 0, e_low if not amp.master_grad else 0)
    rep = conf.compare(p_calls, e_calls, conf.load_allow_list(), stored_low)
    head = (f"model={cfg.model.name} amp={cfg.amp.name} ({amp.dtype} {amp.level}, black list "
            f"{amp.black or '[]'}, master_grad {amp.master_grad}); one training forward of a "
            f"batch of {cfg.model.batch_size}")
    return rep, head + "\n" + conf.format_table(rep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the rows to this file")
    args, overrides = ap.parse_known_args(argv)
    try:
        cfg = _load(overrides)
        rep, text = check(cfg)
    except _entry.user_errors() as err:
        return _entry.report_error(err)
    print(text, flush=True)
    if args.json:
        rows = [dict(zip(("op", "paddle", "emulation", "calls", "activation_share", "allowed"), r))
                for r in rep.rows]
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "calls": rep.calls, "disagreements": rep.disagreements,
                       "unexplained": rep.unexplained, "low_params": list(rep.low_params)}, f, indent=1)
    return 0 if rep.unexplained == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
