"""Train a zoo model: ``python tools/train.py model=resnet18 amp=O1``.

Composes configs/train.yaml, prints the precision line, trains, evaluates, and leaves config.yaml,
metrics.jsonl, checkpoints/ and summary.json in the Hydra run folder. ``--cfg job`` prints the
composed config; ``-m`` sweeps (``-m amp=fp32,O1 seed=0,1,2``).
"""
from __future__ import annotations

import _entry  # noqa: F401  (sets sys.path and resolvers before Hydra runs)
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


def _predict_memory(cfg: DictConfig, effective: str, batch: int) -> dict:
    """The memory planner's keys for summary.json (trainer.predict_memory); imported only when asked."""
    from zoo.diagnostics.memory import summary_prediction

    return summary_prediction(cfg, effective, batch)


@hydra.main(version_base="1.3", config_path=_entry.CONFIG_DIR, config_name="train")
def main(cfg: DictConfig) -> float:
    from zoo.engine.run import train

    from zoo.diagnostics.nonfinite_step import locate_and_describe
    from zoo.tracking.context import hydra_context

    summary = _entry.run_or_exit(
        lambda c, out: train(c, out, predict_memory=_predict_memory, locate_nonfinite=locate_and_describe,
                             command_line=list(HydraConfig.get().overrides.task),
                             tracking_context=hydra_context(HydraConfig.get())),
        cfg, HydraConfig.get().runtime.output_dir)
    return summary["primary_metric"]["value"]


if __name__ == "__main__":
    main()
    # Under the launcher, a completed run's ranks leave without C++ teardown (it can crash rank 0).
    from zoo.utils.distributed import exit_after_run

    exit_after_run()
