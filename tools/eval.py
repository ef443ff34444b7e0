"""Evaluate a run: ``python tools/eval.py run=outputs/<run>/<stamp>``.

The run folder's config.yaml is the config (model, data, amp, ... as trained), with the command
line's overrides on top (``amp=O1``, ``data.root=...``); a weights file from elsewhere takes the
config groups from the command line as training does. Only the validation split is read. Writes the
metrics as JSON (``eval.json`` in its Hydra run folder, and at ``output=PATH`` if given).
``checkpoint=`` is the older name of ``run=``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import _entry  # noqa: F401  (sets sys.path and resolvers before Hydra runs)
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=_entry.CONFIG_DIR, config_name="eval")
def main(cfg: DictConfig) -> None:
    from zoo.engine.evaluate_run import evaluate_checkpoint

    cfg = _entry.run_or_exit(_entry.config_of_run, cfg, "checkpoint", "eval")
    result = _entry.run_or_exit(evaluate_checkpoint, cfg, HydraConfig.get().runtime.output_dir)
    print(json.dumps(result["metrics"], indent=2))
    written = [Path(HydraConfig.get().runtime.output_dir) / "eval.json"]
    written += [Path(cfg.output)] if cfg.get("output") else []
    print(f"evaluation written to {', '.join(map(str, written))}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
