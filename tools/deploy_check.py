"""Check a deployed model: ``python tools/deploy_check.py model_dir=<dir> images=<folder> precision=fp16,bf16``.

Any Paddle inference model (PaddleOCR, PaddleDetection, PaddleClas, PaddleX, or tools/export.py) is run
op by op in FP32 and in emulated fp16 / bf16 deployment on your images; the predictions are compared
without labels. Per precision one verdict line (what share of the FP32 predictions is lost, with its
CI), the worst ops by program name, a keep-list when one is needed; ``deploy_report.json``, plots and
the keep-list files in the run folder. Exit 0 when every precision is equivalent (with or without a
keep-list), 1 when one is refused, 2 on bad input. Options: configs/deploy_check.yaml.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import _entry  # noqa: F401  (sets sys.path and resolvers before Hydra runs)
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

_COMMA_KEYS = ("precision", "images")


def _quote_commas(argv: list[str]) -> list[str]:
    """``precision=fp16,bf16`` and ``images=a.jpg,b.jpg`` as one value each: Hydra reads an unquoted
    comma as a sweep and refuses it without --multirun."""
    out = []
    for arg in argv:
        m = re.fullmatch(r"(\+?)(" + "|".join(_COMMA_KEYS) + r")=([^'\"\[].*,.*)", arg)
        out.append(f"{m.group(1)}{m.group(2)}='{m.group(3)}'" if m else arg)
    return out


def _compose(overrides: list[str]):
    """configs/eval.yaml with ``overrides`` (labels.data / labels.model): Hydra's compose API inside this app."""
    return hydra.compose(config_name="eval", overrides=overrides)


@hydra.main(version_base="1.3", config_path=_entry.CONFIG_DIR, config_name="deploy_check")
def main(cfg: DictConfig) -> None:
    from zoo.deploy.run import DeployRefused, run_deploy_check

    out_dir = Path(cfg.out_dir) if cfg.out_dir else Path(HydraConfig.get().runtime.output_dir)
    try:
        _entry.run_or_exit(run_deploy_check, cfg, out_dir, print, _compose)
    except DeployRefused as refused:  # the check ran and said no: status 1, as a failed test
        _entry.announce_error(refused)
        sys.exit(1)


if __name__ == "__main__":
    sys.argv[1:] = _quote_commas(sys.argv[1:])
    main()
