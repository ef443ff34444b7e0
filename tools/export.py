"""Export for deployment: ``python tools/export.py model=db_det weights=outputs/<run>/<stamp>``.

DB and ResNet: ``inference.json`` + ``inference.pdiparams`` and the ``inference.yml`` PaddleOCR/PaddleX
predictors read. PP-YOLOE: PaddleDetection's deploy layout, ``model.json`` + ``model.pdiparams`` +
``infer_cfg.yml`` with NMS in the graph (``export.layout=paddlex``: ``inference.*`` + ``inference.yml``).
Also ``export.json`` (what was exported from what, in which precision) and, when paddle2onnx is
installed, the ONNX file; weights fp32 unless ``export.precision=fp16|bf16``. Into ``export.out_dir``
(default: the Hydra run folder's ``inference/``). Options: configs/export.yaml.
"""
from __future__ import annotations

import json
from pathlib import Path

import _entry  # noqa: F401  (sets sys.path and resolvers before Hydra runs)
import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path=_entry.CONFIG_DIR, config_name="export")
def main(cfg: DictConfig) -> None:
    from zoo.export import export_from_config  # ExportError is a ValueError: one "error:" line, exit 2

    out_dir = cfg.export.out_dir or Path(HydraConfig.get().runtime.output_dir) / "inference"
    record = _entry.run_or_exit(export_from_config, cfg, out_dir)
    print(json.dumps(record, indent=2))
    print(f"exported to {Path(out_dir).resolve()}")


if __name__ == "__main__":
    main()
