"""A ``paddle.io.DataLoader`` whose loading errors end the run instead of hanging it.

Paddle's single-process loader reads batches in a thread; when a sample raises there the thread
dies and the main thread waits for ever on the batch queue (Ctrl-C cannot interrupt it). Worker
processes fare little better: the main thread gets ``SystemError: Blocking queue is killed``
without the cause. So the dataset and collate function are wrapped: an exception while loading
becomes a small "error batch" that travels the normal way, and the iterator raises
:class:`SampleLoadError` with the original message (which names the file) in the main thread.
"""
from __future__ import annotations

import functools
import os

import numpy as np

__all__ = ["SampleLoadError", "build_loader"]

_ERROR_KEY = "__ampzoo_load_error__"


class SampleLoadError(RuntimeError):
    """A sample could not be loaded during training or evaluation; the message names the file."""


class _Failure:
    """Stands in for an item whose loading raised (lives only inside the loading process)."""

    def __init__(self, message: str):
        self.message = message


def _describe(err: BaseException) -> str:
    msg = str(err)
    return msg if isinstance(err, (OSError, ValueError)) and msg else f"{type(err).__name__}: {msg}"


class _GuardedDataset:
    """``dataset[key]``, with an exception turned into a :class:`_Failure`."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        try:
            return self.dataset[key]
        except Exception as e:  # noqa: BLE001  (any loading error must reach the main thread)
            msg = _describe(e)
            return _Failure(msg if f"key {int(key)}" in msg else f"{msg} (sample key {int(key)})")


def _non_numeric(batch, key: str = "batch"):
    """``(field, dtype)`` of the first array Paddle could not turn into a tensor, else None.

    The conversion happens in Paddle's loader thread after collation, where a failure would
    again kill the thread and leave the main thread waiting.
    """
    if isinstance(batch, dict):
        return next((r for k, v in batch.items() if (r := _non_numeric(v, str(k))) is not None), None)
    if isinstance(batch, (list, tuple)):
        return next((r for i, v in enumerate(batch) if (r := _non_numeric(v, f"{key}[{i}]")) is not None), None)
    if isinstance(batch, np.ndarray) and batch.dtype.kind not in "biuf":
        return key, str(batch.dtype)
    return None


class _GuardedCollate:
    """The dataset's collate function; a failed item or collate error becomes an error batch."""

    def __init__(self, collate_fn):
        self.collate_fn = collate_fn

    def __call__(self, items):
        failed = next((it for it in items if isinstance(it, _Failure)), None)
        if failed is None:
            try:
                batch = self.collate_fn(items)
                bad = _non_numeric(batch)
                if bad is None:
                    return batch
                failed = _Failure(f"cannot batch samples: field {bad[0]!r} has dtype {bad[1]} (only numbers "
                                  "and booleans become tensors)")
            except Exception as e:  # noqa: BLE001
                failed = _Failure(f"cannot batch samples: {_describe(e)}")
        return {_ERROR_KEY: np.frombuffer(failed.message.encode("utf-8", "replace"), np.uint8).copy()}


def normalize_batch_image(image, mean, std):
    """``(image / 255 - mean) / std`` of a uint8 ``[B,C,H,W]`` tensor, on the tensor's device."""
    import paddle

    c = image.shape[1]
    std64 = np.asarray(std, np.float64)
    scale = paddle.to_tensor((1.0 / (255.0 * std64)).astype(np.float32).reshape(1, c, 1, 1), place=image.place)
    shift = paddle.to_tensor((np.asarray(mean, np.float64) / std64).astype(np.float32).reshape(1, c, 1, 1),
                             place=image.place)
    return image.astype("float32") * scale - shift


class GuardedLoader:
    """Iterates a DataLoader built on guarded dataset/collate; raises :class:`SampleLoadError`.

    ``normalize`` = ``(mean, std)``: batches' uint8 ``image`` is normalised after it arrives
    (``data.builder.normalize_on=device``).
    """

    def __init__(self, loader, normalize=None):
        self.loader = loader
        self.normalize = normalize
        self._iterator = None

    def __len__(self) -> int:
        return len(self.loader)

    def close(self) -> None:
        """Stop the iteration in progress, for a caller that leaves it before its end.

        With ``num_workers=0`` Paddle loads in a thread that keeps filling its queue, and the
        thread keeps the iterator alive, so an abandoned iteration goes on holding a queue of
        batches (db_det at batch 8: six, 33 MiB) and loading more while the caller computes, for
        the life of the process. Here the thread is told to stop, joined, and Paddle's own
        shutdown runs (it then has no thread to wait for); worker processes are ended as Paddle
        ends them. Safe to call twice, or after the end.
        """
        it, self._iterator = self._iterator, None
        if it is None:
            return
        thread = getattr(it, "_thread", None)
        if thread is not None and hasattr(it, "_exit_thread_expectedly"):
            it._exit_thread_expectedly()       # sets the done event and closes the queue
            thread.join(timeout=60)
        shutdown = getattr(it, "_try_shutdown_all", None)
        if shutdown is not None:
            shutdown()

    def __iter__(self):
        self._iterator = it = iter(self.loader)
        for batch in it:
            if isinstance(batch, dict) and _ERROR_KEY in batch:
                message = bytes(np.asarray(batch[_ERROR_KEY].numpy())).decode("utf-8", "replace")
                raise SampleLoadError(f"data loading failed: {message}")
            if self.normalize is not None and isinstance(batch, dict) and "image" in batch:
                batch["image"] = normalize_batch_image(batch["image"], *self.normalize)
            yield batch


def _die_with_parent(worker_id: int) -> None:
    """Worker start-up: ask Linux to SIGKILL this worker when the training process dies.

    Paddle's workers notice a dead parent only between batches (every 5 s); one busy with a slow
    sample (a huge image, a stuck network file system) would outlive a kill -9 of the run.
    """
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: rely on Paddle's own parent check
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


def _worker_start(dataset, worker_id: int) -> None:
    """Each worker's start: die with the parent, then the dataset's ``process_init`` (if any)."""
    _die_with_parent(worker_id)
    _process_init(dataset)


def _process_init(dataset) -> None:
    init = getattr(dataset, "process_init", None)  # e.g. TextDetDataset: keep freed memory (mallopt)
    if init is not None:
        init()


def build_loader(dataset, batch_sampler, num_workers: int = 0) -> GuardedLoader:
    """Wrap ``dataset`` and a batch sampler (:mod:`zoo.data.sampler`) in a ``paddle.io.DataLoader``.

    Batches are dicts of stacked tensors (paddle's default collate), e.g.
    ``{"image": [B,3,H,W] float32, "label": [B] int64}``; a dataset with a
    ``collate_fn`` attribute batches its own items (e.g. multi-scale resizing).
    Works with the infinite :class:`~zoo.data.sampler.TrainBatchSampler` for any ``num_workers``.
    A sample that fails to load raises :class:`SampleLoadError` naming it (never a hang).
    A dataset whose ``device_normalize`` is ``(mean, std)`` ships uint8 images, normalised here.
    A dataset's ``process_init()`` runs in each worker at its start, or here with ``num_workers=0``.
    """
    import paddle  # local import: the samplers themselves do not need paddle
    from paddle.io.dataloader.collate import default_collate_fn

    if int(num_workers) < 0:
        raise ValueError(f"trainer.num_workers: expected 0 (load in the main process) or more worker "
                         f"processes, got {num_workers}")
    collate = getattr(dataset, "collate_fn", None) or default_collate_fn
    if int(num_workers) == 0:
        _process_init(dataset)  # Paddle loads in a thread of this process
    return GuardedLoader(paddle.io.DataLoader(
        _GuardedDataset(dataset),
        batch_sampler=batch_sampler,
        num_workers=int(num_workers),
        return_list=True,
        collate_fn=_GuardedCollate(collate),
        worker_init_fn=functools.partial(_worker_start, dataset) if int(num_workers) > 0 else None,
    ), normalize=getattr(dataset, "device_normalize", None))
