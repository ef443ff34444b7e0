"""data.builder.keep_freed_memory (issue 15): glibc keeps freed memory in the processes that load DB
items (zoo/data/text_det/memory.py), applied by the loader in each worker or in the main process."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import ROOT
from test_text_det_data import _write_root

from zoo.data.text_det import memory
from zoo.data.text_det.dataset import TextDetData

MiB = 1 << 20


class _FakeLibc:
    def __init__(self, result=1):
        self.calls, self.result = [], result

    def mallopt(self, param, value):
        self.calls.append((param.value, value.value))
        return self.result


@pytest.fixture
def fake_libc(monkeypatch):
    libc = _FakeLibc()
    monkeypatch.setattr(memory, "_libc", lambda: libc)
    monkeypatch.setattr(memory, "_applied", {})
    return libc


@pytest.mark.parametrize("value, nbytes", [(True, 256 * MiB), (False, 0), (None, 0), (64 * MiB, 64 * MiB)])
def test_values(value, nbytes):
    assert memory.check_keep_freed_memory(value) == nbytes


@pytest.mark.parametrize("bad", ["yes", "256MB", 1.5, -1, 0, 1000, 2**31, [1]])
def test_bad_values_name_the_key(bad, tmp_path):
    with pytest.raises(ValueError, match=r"data\.builder\.keep_freed_memory: expected true.*got"):
        memory.check_keep_freed_memory(bad)
    with pytest.raises(ValueError, match=r"data\.builder\.keep_freed_memory"):  # before the data is read
        TextDetData(tmp_path / "not-there", keep_freed_memory=bad)


def test_loader_sets_both_thresholds_in_the_loading_process(tmp_path, fake_libc):
    from zoo.data.sampler import TrainBatchSampler, build_loader

    data = _write_root(tmp_path, n=4)
    ds = data.build("train", 0)
    assert ds.keep_freed_bytes == 256 * MiB  # the default
    next(iter(build_loader(ds, TrainBatchSampler(4, batch_size=2, seed=0), 0)))
    assert fake_libc.calls == [(memory.M_TRIM_THRESHOLD, 256 * MiB), (memory.M_MMAP_THRESHOLD, 256 * MiB)]
    build_loader(ds, TrainBatchSampler(4, batch_size=2, seed=0), 0)
    assert len(fake_libc.calls) == 2  # once per process


def test_off_and_byte_count(tmp_path, fake_libc):
    root = tmp_path / "r"
    _write_root(root)
    kw = dict(train_label="train.txt", val_label="val.txt", crop_size=32, eval_size=(48, 64), max_polys=4)
    TextDetData(root, keep_freed_memory=False, **kw).build("train", 0).process_init()
    assert fake_libc.calls == []
    TextDetData(root, keep_freed_memory=32 * MiB, **kw).build("val", 0).process_init()
    assert fake_libc.calls == [(memory.M_TRIM_THRESHOLD, 32 * MiB), (memory.M_MMAP_THRESHOLD, 32 * MiB)]


def test_without_glibc_or_refused(monkeypatch, caplog):
    monkeypatch.setattr(memory, "_applied", {})
    monkeypatch.setattr(memory, "_libc", lambda: None)
    with caplog.at_level(logging.DEBUG, logger="zoo.data.text_det.memory"):
        assert memory.keep_freed_memory(64 * MiB) is False
    assert "not glibc" in caplog.text
    monkeypatch.setattr(memory, "_applied", {})
    monkeypatch.setattr(memory, "_libc", lambda: _FakeLibc(result=0))
    with caplog.at_level(logging.WARNING, logger="zoo.data.text_det.memory"):
        assert memory.keep_freed_memory(64 * MiB) is False
    assert "refused mallopt(M_TRIM_THRESHOLD" in caplog.text and "refused mallopt(M_MMAP_THRESHOLD" in caplog.text


class _RecordingDataset:
    """Items are the pid that made them; ``process_init`` records the pid it ran in."""

    def __init__(self, path):
        self.path = path

    def __len__(self):
        return 4

    def __getitem__(self, key):
        return {"pid": np.array(os.getpid(), np.int64)}

    def process_init(self):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def test_each_worker_runs_process_init_at_its_start(tmp_path):
    from zoo.data.sampler import TrainBatchSampler, build_loader

    log = tmp_path / "pids.txt"
    loader = build_loader(_RecordingDataset(log), TrainBatchSampler(4, batch_size=2, seed=0, stop_step=4), 2)
    item_pids = {int(p) for batch in loader for p in batch["pid"].numpy().reshape(-1)}
    init_pids = [int(p) for p in log.read_text().split()]
    assert item_pids <= set(init_pids) and len(init_pids) == 2 and os.getpid() not in init_pids


SCRIPT = """
import ctypes, sys
import numpy as np
from zoo.data.text_det import memory
from zoo.data.synthetic.text import SyntheticTextData

data = SyntheticTextData(num_train=12, num_val=1, image_size=[360, 640], crop_size=320, max_instances=12,
                         root=sys.argv[1], keep_freed_memory=False)
off = data.build("train", 0)
on = SyntheticTextData(num_train=12, num_val=1, image_size=[360, 640], crop_size=320, max_instances=12,
                       root=sys.argv[1]).build("train", 0)
keys = range(36)  # 3 epochs: different draws each
off.process_init()
before = [off[k] for k in keys]
assert memory.keep_freed_memory(on.keep_freed_bytes) is True  # the real mallopt
on.process_init()
after = [on[k] for k in keys]
for k, a, b in zip(keys, before, after):
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), (k, name)
print("identical", len(before))
"""


@pytest.mark.skipif(memory._libc() is None, reason="needs glibc")
def test_items_bit_identical_with_the_option(tmp_path):
    """Reused (non-zeroed) memory must not change a map: an np.empty read before written would."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), str(tmp_path)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "identical 36" in r.stdout
