"""Export for deployment: ``python tools/export.py run=outputs/<run>/<stamp>``.

The run folder's config.yaml is the config, with the command line on top, as for tools/eval.py;
``weights=`` is the older name of ``run=``; without either, ``model=`` and its own initialisation.

DB and ResNet: ``inference.json`` + ``inference.pdiparams`` and the ``inference.yml`` PaddleOCR/PaddleX
predictors read. PP-YOLOE: PaddleDetection's deploy layout, ``model.json`` + ``model.pdiparams`` +
``infer_cfg.yml`` with NMS in the graph (``export.layout=paddlex``: ``inference.*`` + ``inference.yml``).
Also ``export.json`` (what was exported from what, in which precision) and, when paddle2onnx is
installed, the ONNX file; weights fp32 unless ``export.precision=fp16|bf16``. Into ``export.out_dir``
(default: the Hydra run folder's ``inference/``). Options: configs/export.yaml.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import _entry  # noqa: F401  (sets sys.path and resolvers before Hydra runs)
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=_entry.CONFIG_DIR, config_name="export")
def main(cfg: DictConfig) -> None:
    from zoo.export import export_from_config  # ExportError is a ValueError: one "error:" line, exit 2
    from zoo.export.precision_check import PrecisionRefused
    from zoo.export.precision_report import check_lines

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    cfg = _entry.run_or_exit(_entry.config_of_run, cfg, "weights", "export")
    out_dir = cfg.export.out_dir or run_dir / "inference"
    try:
        record = _entry.run_or_exit(export_from_config, cfg, out_dir, print, run_dir)
    except PrecisionRefused as refused:  # the check ran and said no: status 1, as a failed test
        _entry.announce_error(refused)
        sys.exit(1)
    print(json.dumps(record, indent=2))
    for line in check_lines(record.get("precision_check")):
        print(line)
    print(f"exported to {Path(out_dir).resolve()}")


if __name__ == "__main__":
    main()
