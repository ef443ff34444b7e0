"""What a run started from, as digests in summary.json, so the report can check instead of assume.

- Pairing (issue 12 item 1): two runs with one seed under different precisions are a *pair* only
  when they start from the same initial weights, see the same first batches (sample ids and the
  augmented tensors: augmentation draws from ``(seed, epoch, index)``) and the same generator
  states. :func:`pairing_digests` hashes all three.
- Comparability (item 4): library versions, the data set's version and a digest of the config
  without the keys a precision may change (:data:`CONFIG_DIGEST_EXCLUDES`).
"""
from __future__ import annotations

import hashlib
import platform
import re
from pathlib import Path

import numpy as np
import paddle
from omegaconf import DictConfig, OmegaConf

from zoo.data import TrainBatchSampler, build_loader
from zoo.engine import checkpoint as ckpt
from zoo.utils import distributed as dist

DIGEST_BATCHES = 3  # first batches hashed for the pairing check
# Config keys left out of config_digest: the precision itself and the seed (what a parity sweep
# varies), the run name built from them, the keys recipes/<model>/<amp>.yaml set (the batch size
# is still compared, through the report's group key) and settings that do not change results.
CONFIG_DIGEST_EXCLUDES = ("amp", "seed", "run_name", "model.batch_size", "optim.base_batch_size",
                          "optim.optimizer.multi_precision", "trainer.resume", "trainer.progress",
                          "trainer.num_workers", "trainer.draw_samples", "trainer.predict_memory",
                          # DB's recipes set fp32 (issue 39); an fp32 run's "both" evaluates in FP32 too
                          "trainer.eval_precision",
                          # where a run is tracked (logger=mlflow, ...) is not what it trains
                          "logger")


def library_versions() -> dict[str, str]:
    """Versions of what decides the numbers: python, paddle, numpy, opencv."""
    import cv2

    return {"python": platform.python_version(), "paddle": paddle.__version__,
            "numpy": np.__version__, "opencv": cv2.__version__}


def config_digest(cfg: DictConfig) -> str:
    """sha256 of the resolved config without :data:`CONFIG_DIGEST_EXCLUDES` (sorted YAML)."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    for key in CONFIG_DIGEST_EXCLUDES:
        *parents, last = key.split(".")
        node = plain
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    text = OmegaConf.to_yaml(OmegaConf.create(plain), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def dataset_version(dataset) -> str:
    """The data set's folder name: for the embedded sets it holds the generator version tag and every
    generation parameter (``synthetic_shapes-v1-...``); for real sets it names the folder read."""
    where = getattr(dataset, "root", None) or getattr(dataset, "source", None)
    return Path(str(where)).name if where else "unknown"


def _update(h, value, name: str = "") -> None:
    """Feed a batch (tensor, array, number, dict or list of them) into the hash, names and shapes too."""
    if isinstance(value, dict):
        for k in sorted(value):
            _update(h, value[k], f"{name}/{k}")
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _update(h, v, f"{name}/{i}")
        return
    arr = np.ascontiguousarray(value.numpy() if isinstance(value, paddle.Tensor) else np.asarray(value))
    h.update(f"{name}:{arr.dtype}:{arr.shape}".encode())
    h.update(arr.tobytes())


def rng_digest() -> str:
    """sha256 of the python, numpy and paddle generator states (paddle's printed state holds a
    pointer, which is dropped)."""
    state = ckpt.rng_state()
    text = repr(state["python"]) + repr(state["numpy"][0]) + state["numpy"][1].tobytes().hex()
    text += re.sub(r"0x[0-9a-fA-F]+", "", " ".join(str(s) for s in state["paddle"]))
    return hashlib.sha256(text.encode()).hexdigest()


def first_batches_digest(train_set, batch_size: int, seed: int, batches: int = DIGEST_BATCHES) -> dict:
    """Digests of the sample keys and of the loaded (augmented) tensors of the first ``batches``
    training batches, drawn through the trainer's own sampler and loader. Generator states are
    restored afterwards, so training starts exactly as it would have without this check."""
    saved = ckpt.rng_state()
    sampler = TrainBatchSampler(len(train_set), batch_size, seed, dist.rank(), dist.world_size(),
                                drop_last=True, stop_step=batches)  # no prefetch past them
    ids, data = hashlib.sha256(), hashlib.sha256()
    keys = iter(sampler)
    for _, batch in zip(range(batches), build_loader(train_set, sampler, 0)):
        ids.update(np.asarray(next(keys), np.int64).tobytes())
        _update(data, batch)
    ckpt.set_rng_state(saved)
    return {"sample_ids": ids.hexdigest(), "batches": data.hexdigest(), "batches_hashed": batches}


def pairing_digests(model, train_set, batch_size: int, seed: int) -> dict:
    """What a run with this seed starts from: initial weights, first batches, generator states.

    Call with the freshly built model (before O2 decoration and before a resume loads weights),
    after seeding, when the generators are in the state training starts with.
    """
    out = {"init_weights": dist.parameter_digest(model)}
    out.update(first_batches_digest(train_set, batch_size, seed))
    out["rng_state"] = rng_digest()
    return out
