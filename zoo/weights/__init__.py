"""Pretrained weights: registry of official files, verified downloads, and loading without pickle risks.

- :mod:`zoo.weights.hub`: ``registry.yaml`` lookup, resumable downloads into the cache, sha256 records;
- :mod:`zoo.weights.safe_pickle`: reads ``paddle.save`` files allowing only plain data;
- :mod:`zoo.weights.safetensors`: the safetensors format in NumPy.
"""
from __future__ import annotations

import os
from pathlib import Path

from zoo.utils.runfolder import atomic_save
from zoo.weights.hub import (
    ChecksumError,
    DownloadError,
    UnknownWeightsError,
    WeightsError,
    WeightSpec,
    download,
    get_spec,
    list_weights,
    resolve,
    weights_dir,
)
from zoo.weights.safe_pickle import PickleLoadError, UnsafePickleError
from zoo.weights.safe_pickle import load as safe_load
from zoo.weights.safetensors import SafetensorsError, load_file, save_file

__all__ = [
    "ChecksumError", "DownloadError", "PickleLoadError", "SafetensorsError", "UnknownWeightsError",
    "UnsafePickleError", "WeightSpec", "WeightsError", "download", "get_spec", "list_weights", "load_file",
    "resolve", "safe_load", "save_file", "save_state", "weights_dir",
]


def save_state(state: dict, path: str | os.PathLike) -> Path:
    """Write a state dict atomically: ``.safetensors`` in that format, anything else with ``paddle.save``."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return save_file(state, path)

    return atomic_save(state, path)
