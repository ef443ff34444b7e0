"""Tests for zoo.data: samplers, readers, transforms, synthetic dataset, loader."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from zoo.data import (
    ClassificationData,
    EvalBatchSampler,
    SyntheticShapesData,
    TrainBatchSampler,
    build_loader,
)
from zoo.data.classification.transforms import ClassificationTransform
from zoo.data.synthetic import shapes as synthetic_shapes
from zoo.data.transforms import random_resized_crop_box
from zoo.utils.cache import cache_dir


@pytest.fixture(autouse=True)
def _ampzoo_home(tmp_path, monkeypatch):
    """Never write to the real home directory."""
    monkeypatch.setenv("AMPZOO_HOME", str(tmp_path / "ampzoo_home"))


def _write_images(root: Path, rels, size=(40, 48)):
    rng = np.random.default_rng(0)
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(root / rel), rng.integers(0, 256, (*size, 3), dtype=np.uint8))


@pytest.fixture
def list_root(tmp_path):
    """PaddleClas layout with 6 train and 3 val images over 3 classes."""
    root = tmp_path / "lists"
    train = [f"imgs/train_{i}.png" for i in range(6)]
    val = [f"imgs/val_{i}.png" for i in range(3)]
    _write_images(root, train + val)
    (root / "train_list.txt").write_text("".join(f"{p} {i % 3}\n" for i, p in enumerate(train)))
    # Tab-separated and a blank line are both accepted.
    (root / "val_list.txt").write_text("".join(f"{p}\t{i}\n" for i, p in enumerate(val)) + "\n")
    return root


def _stream(sampler, n):
    it = iter(sampler)
    return [next(it) for _ in range(n)]


# ----------------------------------------------------------------- cache
def test_cache_dir_env_order(monkeypatch, tmp_path):
    assert cache_dir("datasets", "x") == tmp_path / "ampzoo_home" / "datasets" / "x"
    monkeypatch.delenv("AMPZOO_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("datasets") == tmp_path / "xdg" / "ampzoo" / "datasets"
    with pytest.raises(ValueError):
        cache_dir("..", "etc")


# ----------------------------------------------------------------- samplers
def test_train_sampler_epoch_permutations():
    s = TrainBatchSampler(10, 3, seed=5)
    assert s.steps_per_epoch == len(s) == 3
    batches = _stream(s, 6)
    assert all(len(b) == 3 for b in batches)
    perm0 = np.random.default_rng((5, 0)).permutation(10)
    perm1 = np.random.default_rng((5, 1)).permutation(10)
    assert [k for b in batches[:3] for k in b] == perm0[:9].tolist()
    assert [k for b in batches[3:] for k in b] == (perm1[:9] + 10).tolist()  # keys carry the epoch
    assert _stream(TrainBatchSampler(10, 3, seed=5), 6) == batches
    assert _stream(TrainBatchSampler(10, 3, seed=6), 6) != batches
    assert TrainBatchSampler(10, 3, seed=5, drop_last=False).steps_per_epoch == 4


@pytest.mark.parametrize("world_size,rank,drop_last", [(1, 0, True), (3, 2, True), (2, 1, False)])
def test_train_sampler_start_step_equals_slicing(world_size, rank, drop_last):
    kw = dict(num_samples=11, batch_size=2, seed=3, rank=rank, world_size=world_size, drop_last=drop_last)
    full = _stream(TrainBatchSampler(**kw), 40)
    for start in (0, 1, 4, 5, 13, 27):
        assert _stream(TrainBatchSampler(start_step=start, **kw), 6) == full[start : start + 6]


def test_train_sampler_ranks_padded_by_wrapping():
    n, ws = 10, 3
    per_rank = [TrainBatchSampler(n, 2, seed=1, rank=r, world_size=ws) for r in range(ws)]
    assert {s.steps_per_epoch for s in per_rank} == {2}  # ceil(10/3)=4 per rank
    idx = np.concatenate([s.epoch_indices(0) for s in per_rank])
    perm = np.random.default_rng((1, 0)).permutation(n)
    assert sorted(idx.tolist()) == sorted(perm.tolist() + perm[:2].tolist())
    assert per_rank[0].epoch_indices(0).tolist() == perm[[0, 3, 6, 9]].tolist()
    assert per_rank[1].epoch_indices(0)[-1] == perm[0]  # wrapped padding


def test_train_sampler_errors():
    with pytest.raises(ValueError, match="batch_size must be positive"):
        TrainBatchSampler(10, 0, seed=0)
    with pytest.raises(ValueError, match="0 steps per epoch.*batch_size=8"):
        TrainBatchSampler(10, 8, seed=0, world_size=2)
    with pytest.raises(ValueError, match="rank"):
        TrainBatchSampler(10, 2, seed=0, rank=2, world_size=2)


def test_eval_sampler_ranks_disjoint_and_covering():
    ws, n = 3, 10
    per_rank = [list(EvalBatchSampler(n, 2, rank=r, world_size=ws)) for r in range(ws)]
    assert per_rank[0] == [[0, 3], [6, 9]]
    flat = [i for batches in per_rank for b in batches for i in b]
    assert sorted(flat) == list(range(n)) and len(flat) == n
    assert len(EvalBatchSampler(n, 2, rank=1, world_size=ws)) == 2
    assert list(EvalBatchSampler(5, 2)) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="batch_size"):
        EvalBatchSampler(5, 0)


# ----------------------------------------------------------------- transforms
def test_transforms_shapes_and_fallback():
    img = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    for train in (True, False):
        out = ClassificationTransform(train, 24, 30, mean, std)(img, np.random.default_rng(1))
        assert out.shape == (3, 24, 24) and out.dtype == np.float32 and out.flags.c_contiguous
    # A very wide image cannot fit any sampled box of ratio <= 4/3: centre fallback.
    _, left, h, w = random_resized_crop_box(10, 1000, np.random.default_rng(0), scale=(0.9, 1.0))
    assert (h, w) == (10, 13) and left == (1000 - 13) // 2
    flat = np.full((4, 4, 3), 255, np.uint8)
    out = ClassificationTransform(False, 4, 4, mean, std)(flat, None)
    np.testing.assert_allclose(out, 2.0)
    with pytest.raises(ValueError, match="resize_size"):
        ClassificationTransform(False, 32, 16, mean, std)


# ----------------------------------------------------------------- list reader
def test_list_layout_keys_and_augmentation_determinism(list_root):
    data = ClassificationData(list_root, image_size=16, resize_size=20)
    assert data.num_classes == 3  # 1 + max label
    train = data.build("train", seed=7)
    n = len(train)
    assert n == 6
    item = train[2]
    assert item["image"].shape == (3, 16, 16) and item["image"].dtype == np.float32
    assert item["label"].dtype == np.int64 and int(item["label"]) == 2
    a = train[3 * n + 4]
    for key in (0, n + 1, 5):  # history must not matter
        train[key]
    np.testing.assert_array_equal(train[3 * n + 4]["image"], a["image"])
    fresh = ClassificationData(list_root, image_size=16, resize_size=20).build("train", seed=7)
    np.testing.assert_array_equal(fresh[3 * n + 4]["image"], a["image"])
    assert not np.array_equal(train[4 * n + 4]["image"], a["image"])  # other epoch
    assert not np.array_equal(data.build("train", seed=8)[3 * n + 4]["image"], a["image"])
    val = data.build("val", seed=7)
    assert [int(val[i]["label"]) for i in range(3)] == [0, 1, 2]
    np.testing.assert_array_equal(val[1]["image"], val[len(val) + 1]["image"])
    # train_aug=False: train uses the deterministic eval transform.
    plain = ClassificationData(list_root, image_size=16, resize_size=20, train_aug=False).build("train", 0)
    np.testing.assert_array_equal(plain[0]["image"], plain[n]["image"])


def test_list_malformed_line(list_root):
    (list_root / "train_list.txt").write_text("imgs/train_0.png 0\nimgs/train_1.png\n")
    with pytest.raises(ValueError) as e:
        ClassificationData(list_root).build("train", 0)
    msg = str(e.value)
    assert "train_list.txt:2" in msg and "'imgs/train_1.png'" in msg and "<path> <integer label>" in msg
    (list_root / "train_list.txt").write_text("imgs/train_0.png zero\n")
    with pytest.raises(ValueError, match=r"train_list.txt:1: malformed line 'imgs/train_0.png zero'"):
        ClassificationData(list_root).build("train", 0)


def test_list_label_out_of_range(list_root):
    with pytest.raises(ValueError, match=r"train_list.txt:3: label 2 out of range \[0, 2\)"):
        ClassificationData(list_root, num_classes=2).build("train", 0)
    (list_root / "labels.txt").write_text("a\nb\n")  # num_classes from labels.txt
    with pytest.raises(ValueError, match=r"train_list.txt:3: .*'imgs/train_2.png 2'"):
        ClassificationData(list_root).build("train", 0)
    (list_root / "val_list.txt").write_text("imgs/val_0.png -1\n")
    with pytest.raises(ValueError, match=r"val_list.txt:1: label -1 out of range"):
        ClassificationData(list_root, num_classes=3).build("val", 0)


def test_missing_root_and_unknown_layout(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=f"data.root.*{missing}"):
        ClassificationData(missing).build("train", 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as e:
        ClassificationData(tmp_path / "empty").build("val", 0)
    assert "val_list.txt" in str(e.value) and "class folders" in str(e.value)
    assert str(tmp_path / "empty" / "val") in str(e.value)


def test_missing_and_corrupt_images(list_root):
    os.remove(list_root / "imgs/train_1.png")
    (list_root / "imgs/train_2.png").write_bytes(b"this is not a png")
    train = ClassificationData(list_root, image_size=16, resize_size=20).build("train", 0)
    with pytest.raises(FileNotFoundError, match=r"imgs/train_1.png.*index 1, key 7"):
        train[7]
    with pytest.raises(ValueError, match=r"cannot decode.*imgs/train_2.png.*key 2"):
        train[2]
    (list_root / "imgs/train_2.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"imgs/train_2.png"):
        train[2]


# ----------------------------------------------------------------- class folders
def test_class_folder_layout(tmp_path):
    root = tmp_path / "folders"
    _write_images(root, ["train/dog/b.png", "train/dog/a.jpg", "train/cat/x.png", "val/dog/v.png",
                         "val/cat/w.png"])
    (root / "train/dog/notes.txt").write_text("ignored: not an image")
    data = ClassificationData(root, image_size=16, resize_size=16)
    assert data.num_classes == 2 and data.class_names == ["cat", "dog"]
    train = data.build("train", 0)
    assert [os.fsdecode(p) for p in train.paths] == ["train/cat/x.png", "train/dog/a.jpg", "train/dog/b.png"]
    assert train.labels.tolist() == [0, 1, 1]
    assert data.build("val", 0).labels.tolist() == [0, 1]
    _write_images(root, ["val/bird/z.png"])
    with pytest.raises(ValueError, match="bird"):
        ClassificationData(root).build("val", 0)


# ----------------------------------------------------------------- synthetic
def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_synthetic_generation_deterministic(tmp_path):
    kw = dict(num_train=20, num_val=10, image_size=16, seed=3)
    a = SyntheticShapesData(root=tmp_path / "a", **kw)
    b = SyntheticShapesData(root=tmp_path / "b", **kw)
    train = a.build("train", 0)
    b.build("val", 0)
    assert a.root.name == b.root.name and "v1" in a.root.name and "seed3" in a.root.name
    files_a, files_b = _tree_bytes(a.root), _tree_bytes(b.root)
    assert files_a == files_b and len(files_a) == 33  # 30 PNGs + 3 text files
    assert len(train) == 20 and a.num_classes == 10 and len(a.class_names) == 10
    assert train[0]["image"].shape == (3, 16, 16)
    assert sorted(train.labels.tolist()) == sorted(list(range(10)) * 2)
    other = SyntheticShapesData(root=tmp_path / "a", **{**kw, "seed": 4})
    assert other.root != a.root and other.root.parent == a.root.parent
    assert SyntheticShapesData(num_train=20, num_val=10).root.is_relative_to(cache_dir("datasets"))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_synthetic_generation_atomic(tmp_path, monkeypatch):
    data = SyntheticShapesData(num_train=20, num_val=10, image_size=16, root=tmp_path)
    name = data.root.name
    # Leftover of a killed run on this host, and one of another host (left alone).
    stale = tmp_path / f"{name}.tmp-{socket.gethostname()}-{_dead_pid()}"
    foreign = tmp_path / f"{name}.tmp-otherhost-1"
    for leftover in (stale, foreign):
        leftover.mkdir()
        (leftover / "train_list.txt").write_text("garbage\n")
    assert len(data.build("train", 0)) == 20
    assert not stale.exists() and foreign.exists()

    # A run that dies mid-way publishes nothing and cleans up its temp folder.
    calls = []

    def flaky(rng, label, size):
        calls.append(label)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(rng, label, size)

    real = synthetic_shapes.render_shape_image
    monkeypatch.setattr(synthetic_shapes, "render_shape_image", flaky)
    fresh = SyntheticShapesData(num_train=20, num_val=10, image_size=16, seed=1, root=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        fresh.build("train", 0)
    assert not fresh.root.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, foreign.name])
    assert len(fresh.build("val", 0)) == 10


# ----------------------------------------------------------------- DataLoader
@pytest.mark.parametrize("num_workers", [0, 1])
def test_dataloader_integration(tmp_path, num_workers):
    data = SyntheticShapesData(num_train=20, num_val=10, image_size=16, root=tmp_path)
    train = data.build("train", 0)
    loader = build_loader(train, TrainBatchSampler(len(train), 8, seed=0), num_workers=num_workers)
    assert len(loader) == 2
    batches = []
    for batch in loader:  # infinite: runs past the 2-step epoch
        batches.append(batch)
        if len(batches) == 3:
            break
    images, labels = batches[2]["image"], batches[2]["label"]
    assert list(images.shape) == [8, 3, 16, 16] and list(labels.shape) == [8]
    assert str(images.dtype).endswith("float32") and str(labels.dtype).endswith("int64")
    keys = _stream(TrainBatchSampler(len(train), 8, seed=0), 3)[2]
    np.testing.assert_array_equal(images.numpy(), np.stack([train[k]["image"] for k in keys]))
    val = data.build("val", 0)
    seen = [int(x) for b in build_loader(val, EvalBatchSampler(len(val), 4)) for x in b["label"].numpy()]
    assert seen == val.labels.tolist()
