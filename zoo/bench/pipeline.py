"""Input-pipeline benchmark: ms per image per stage, images/s per core (``tools/benchmark.py --pipeline``).

The zoo's DB train pipeline is timed stage by stage exactly as :class:`TextDetDataset` runs it
(the transform's ``clock`` hook). With ``paddleocr=PATH`` PaddleOCR's own train transforms, built
from its ``configs/det/det_mv3_db.yml`` (``configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml`` for
``model=ppocrv5_mobile_det``: CopyPaste first, timed as "copy_paste" on both sides, the second
image's read included) by its ``create_operators``, run on the same images in a
worker process (:mod:`zoo.bench._paddleocr_pipeline_worker`), alternating with the zoo pass by
pass so drift in machine load hits both alike; the ratio is of medians over the passes.
PaddleOCR is not a dependency: when its source or its requirements (albumentations, ...) are
missing the comparison is skipped with the reason.

Other pipelines (COCO, image lists) report read+decode and the whole item (decode included).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from zoo.data.images import read_image_rgb
from zoo.data.loader import build_loader
from zoo.data.sampler import TrainBatchSampler
from zoo.data.text_det.dataset import TextDetDataset

__all__ = ["DB_STAGES", "PaddleOCRWorker", "db_pass", "generic_pass", "loader_images_per_s", "run", "summarize"]

DB_STAGES = ("read_decode", "augment", "crop", "border_map", "shrink_map", "normalize")
WORKER = Path(__file__).with_name("_paddleocr_pipeline_worker.py")


class _Clock:
    """Accumulates the time since the previous mark under each stage name."""

    def __init__(self, totals: dict):
        self.totals, self.t = totals, time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.totals[stage] = self.totals.get(stage, 0.0) + now - self.t
        self.t = now


def db_pass(ds: TextDetDataset, n: int, epoch: int = 0, indices=None) -> dict:
    """Seconds per stage over images ``indices`` (default ``0..n-1``) of a train :class:`TextDetDataset`."""
    totals: dict = {}
    for index in range(n) if indices is None else indices:
        ds.train_item(index, epoch, clock=_Clock(totals))  # exactly what the loader runs
    stages = (DB_STAGES[0], "copy_paste", *DB_STAGES[1:]) if "copy_paste" in totals else DB_STAGES
    return {s: totals.get(s, 0.0) for s in stages}


def _path_of(ds, index: int) -> str:
    return str(ds.path(index)) if hasattr(ds, "path") else os.fsdecode(ds.files[index])


def generic_pass(ds, n: int) -> dict:
    """Seconds of read+decode alone and of whole items (decode included), images ``0..n-1``."""
    totals = {"read_decode": 0.0, "whole_item": 0.0}
    for index in range(n):
        t0 = time.perf_counter()
        read_image_rgb(_path_of(ds, index))
        t1 = time.perf_counter()
        ds[index]
        totals["read_decode"] += t1 - t0
        totals["whole_item"] += time.perf_counter() - t1
    return totals


def summarize(passes: list[dict], n: int) -> dict:
    """Median over passes of ms per image, per stage and in total."""
    stages = list(passes[0])
    out = {s: float(np.median([p[s] for p in passes])) * 1e3 / n for s in stages}
    total_key = "whole_item" if "whole_item" in out else None
    out["total"] = out[total_key] if total_key else float(np.median([sum(p.values()) for p in passes])) * 1e3 / n
    return out


class PaddleOCRWorker:
    """PaddleOCR's DB train transforms of ``config`` (a path in its source tree) in a child process;
    ``run()`` times one pass."""

    def __init__(self, source: Path, python: str, label_file: Path, root: Path, n: int, crop: int, seed: int,
                 config: str = "configs/det/det_mv3_db.yml"):
        self.proc = None
        self.reason = None
        if not (Path(source) / "ppocr" / "data" / "imaug" / "__init__.py").is_file():
            self.reason = f"{source} is not a PaddleOCR source tree (no ppocr/data/imaug/)"
            return
        if not (Path(source) / config).is_file():
            self.reason = f"{source} has no {config}"
            return
        cmd = [python, str(WORKER), str(source), str(label_file), str(root), str(n), str(crop), str(seed), str(config)]
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        hello = self._reply()
        if hello is None or "error" in hello:
            self.reason = (hello or {}).get("error") or self._stderr_tail()
            self.close()
            return
        self.usable = hello["usable"]  # indices of the images PaddleOCR can use (some boxes)

    def _reply(self):
        line = self.proc.stdout.readline()
        return json.loads(line) if line.strip() else None

    def _stderr_tail(self) -> str:
        self.proc.wait(timeout=30)
        tail = self.proc.stderr.read().strip().splitlines()
        return tail[-1] if tail else f"worker exited with status {self.proc.returncode}"

    @property
    def ok(self) -> bool:
        return self.proc is not None and self.reason is None

    def run(self) -> dict:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        reply = self._reply()
        if reply is None or "error" in reply:
            raise RuntimeError(f"PaddleOCR pipeline worker failed: {(reply or {}).get('error') or self._stderr_tail()}")
        return reply

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.proc = None if self.reason is None else self.proc


def loader_images_per_s(ds, batch_size: int, num_workers: int, steps: int, warmup: int = 2) -> float:
    """Images/s the training loader delivers with ``num_workers`` (no model), after ``warmup`` batches."""

    sampler = TrainBatchSampler(len(ds), batch_size, seed=0, stop_step=warmup + steps)
    it = iter(build_loader(ds, sampler, num_workers))
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(it)
    return steps * batch_size / (time.perf_counter() - t0)


def paddleocr_config(model: str) -> Path:
    """PaddleOCR's config whose train transforms ``model``'s are compared with (det_mv3_db's for a
    DB model without one of its own)."""
    from zoo.bench.paddleocr_train import UPSTREAM_CONFIGS

    return UPSTREAM_CONFIGS.get(model, UPSTREAM_CONFIGS["db_det"])


def default_python() -> str:
    """The interpreter for PaddleOCR's side: $AMPZOO_PADDLEOCR_PYTHON, else this one."""
    return os.environ.get("AMPZOO_PADDLEOCR_PYTHON") or sys.executable


def run(cfg, train_set, images: int, passes: int, against: list, workers: list) -> dict:
    """Time ``passes`` passes over the first ``images`` training images (alternating with PaddleOCR's
    transforms when ``against`` is ``["paddleocr", PATH]``), print the table, return the figures."""
    import cv2

    n = min(images, len(train_set))
    db = isinstance(train_set, TextDetDataset)
    worker, skipped = None, None
    if against and against[0] == "paddleocr":
        if not db:
            skipped = "the PaddleOCR comparison is for DB (text detection) data only"
        else:
            worker = PaddleOCRWorker(Path(against[1]).expanduser(), default_python(), train_set.label_file,
                                     train_set.root, n, train_set.transform.crop_size, cfg.seed,
                                     paddleocr_config(cfg.model.name).as_posix())
            if not worker.ok:
                skipped, worker = worker.reason, None
    indices = worker.usable if worker else None  # both sides time the same images
    if indices is not None:
        n = len(indices)
    timed_pass = (lambda p: db_pass(train_set, n, p, indices)) if db else (lambda p: generic_pass(train_set, n))
    if hasattr(train_set, "process_init"):
        train_set.process_init()  # as the loader does in the process that loads (data.builder.keep_freed_memory)
    timed_pass(passes)  # warm-up: file cache, imports, allocator
    if worker:
        worker.run()
    ours, theirs = [], []
    for p in range(passes):  # alternate, so drift in machine load hits both alike
        ours.append(timed_pass(p))
        if worker:
            theirs.append(worker.run())
    if worker:
        worker.close()
    loader = {}
    for rep in range(passes if workers else 0):  # alternate worker counts, median later
        for w in workers:
            loader.setdefault(w, []).append(loader_images_per_s(train_set, cfg.model.batch_size, w,
                                                                  max(1, n // cfg.model.batch_size)))
    zoo_ms = summarize(ours, n)
    result = {"pipeline": "db_train" if db else type(train_set).__name__, "model": cfg.model.name,
              "paddleocr_config": paddleocr_config(cfg.model.name).as_posix() if worker else None,
              "data": cfg.data.name, "images": n, "passes": passes,
              "crop_size": getattr(getattr(train_set, "transform", None), "crop_size", None),
              "zoo_ms_per_image": zoo_ms, "zoo_images_per_s_per_core": 1e3 / zoo_ms["total"],
              "cv2_threads": cv2.getNumThreads(),
              "keep_freed_memory_bytes": getattr(train_set, "keep_freed_bytes", None),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    stages = list(zoo_ms)
    print(f"{result['pipeline']} pipeline, {n} images of data={cfg.data.name}"
          f"{', crop ' + str(result['crop_size']) if result['crop_size'] else ''}, median of {passes} passes"
          f"{', keep_freed_memory ' + str(result['keep_freed_memory_bytes']) if db else ''}")
    if worker:
        ref_ms = summarize(theirs, n)
        result.update(paddleocr_ms_per_image=ref_ms, paddleocr_images_per_s_per_core=1e3 / ref_ms["total"],
                      ratio=zoo_ms["total"] / ref_ms["total"],
                      pass_ratios=[sum(a.values()) / sum(b.values()) for a, b in zip(ours, theirs)])
        print(f"{'stage':<12} {'zoo ms':>8} {'PaddleOCR ms':>13} {'ratio':>7}")
        for s in stages:
            print(f"{s:<12} {zoo_ms[s]:8.2f} {ref_ms.get(s, float('nan')):13.2f} "
                  f"{zoo_ms[s] / ref_ms[s] if ref_ms.get(s) else float('nan'):7.2f}")
        print(f"images/s per core: zoo {result['zoo_images_per_s_per_core']:.1f}, PaddleOCR "
              f"{result['paddleocr_images_per_s_per_core']:.1f}; zoo/PaddleOCR time ratio {result['ratio']:.3f}")
    else:
        for s in stages:
            print(f"{s:<12} {zoo_ms[s]:8.2f} ms")
        print(f"images/s per core: {result['zoo_images_per_s_per_core']:.1f}")
        if skipped:
            result["paddleocr_skipped"] = skipped
            print(f"PaddleOCR comparison skipped: {skipped}")
    if loader:
        result["loader_images_per_s"] = {str(w): float(np.median(v)) for w, v in loader.items()}
        print(f"loader (batch {cfg.model.batch_size}, no model), images/s: " + ", ".join(
            f"num_workers={w}: {np.median(v):.1f}" for w, v in loader.items()))
    return result
