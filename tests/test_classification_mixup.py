"""PaddleClas's classification recipe pieces (issue 37.2 / 37.7): Mixup of whole batches with the
smoothed soft-target loss, and the RandCropImage crop sampler (data.builder.crop_sampler=paddleclas).

References are computed here by hand with NumPy from the definitions (Zhang et al. 2018; PaddleClas's
MixupOperator, CELoss with epsilon, RandCropImage), not with the code under test.
"""
from __future__ import annotations

import json
import math

import _entry
import numpy as np
import paddle
import pytest
import yaml
from conftest import ROOT, TINY, compose, run_tool

from zoo.data import ClassificationData, TrainBatchSampler, build_loader
from zoo.data.classification.mixup import MIXUP_STREAM, MixupCollate, mixup_batch
from zoo.data.transforms import paddleclas_crop_box, random_resized_crop_box
from zoo.engine.run import train
from zoo.tasks.classification import ClassificationTask

RATIO = (3 / 4, 4 / 3)


def _list_root(root, n, size):
    """A PaddleClas list-file root of ``n`` random images of ``size`` (h, w), labels i % 3."""
    import cv2

    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for i in range(n):
        assert cv2.imwrite(str(root / f"i{i}.png"), rng.integers(0, 256, (*size, 3), dtype=np.uint8))
    (root / "train_list.txt").write_text("".join(f"i{i}.png {i % 3}\n" for i in range(n)))
    (root / "val_list.txt").write_text("i0.png 0\n")
    return root


# ----------------------------------------------------------------- RandCropImage sampler
@pytest.mark.parametrize("height,width", [(375, 500), (500, 375), (224, 224), (100, 1000), (1000, 100), (32, 32)])
def test_paddleclas_crops_fit_and_keep_upstreams_aspect_and_area_bounds(height, width):
    """20,000 draws per image shape: every box lies inside the image (also for shapes torchvision's
    sampler gives up on), its sides are consistent with an aspect in [3/4, 4/3] after truncation, and its
    area fraction lies in [0.08, 1] capped at the largest fraction a box of that aspect can have."""
    rng = np.random.default_rng(37)
    boxes = np.array([paddleclas_crop_box(height, width, rng) for _ in range(20000)])
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
    assert (h >= 1).all() and (w >= 1).all()
    # w = floor(sqrt(A r)), h = floor(sqrt(A / r)) for some drawn r: r lies in [w / (h + 1), (w + 1) / h].
    assert (w / (h + 1) <= RATIO[1] + 1e-9).all() and ((w + 1) / h >= RATIO[0] - 1e-9).all()
    # The largest area fraction a box of aspect r can have inside the image, over the allowed r.
    rs = np.append(np.linspace(*RATIO, 10001), np.clip(width / height, *RATIO))
    fits = np.minimum((width / height) / rs, (height / width) * rs)
    frac = h * w / (height * width)
    assert frac.max() <= min(1.0, fits.max()) + 1e-9
    # At least 0.08 of the area (or what fits) before truncation: (w + 1)(h + 1) > drawn fraction x area.
    assert ((w + 1) * (h + 1) >= min(0.08, fits.min()) * height * width).all()
    # Positions are spread, not a centred fallback.
    if height * width > 1024:
        assert len(np.unique(top * width + left)) > 1000


def test_paddleclas_aspect_is_uniform_not_log_uniform():
    """On a large square image (truncation and the area cap negligible) the mean aspect w / h is
    that of U(3/4, 4/3), 1.0417; torchvision's log-uniform aspect has mean 1.0138."""
    def mean_aspect(sampler):
        rng = np.random.default_rng(0)
        boxes = np.array([sampler(4000, 4000, rng, (0.08, 0.5), RATIO) for _ in range(20000)])
        return float(np.mean(boxes[:, 3] / boxes[:, 2]))

    uniform = (RATIO[0] + RATIO[1]) / 2
    log_uniform = (RATIO[1] - RATIO[0]) / math.log(RATIO[1] / RATIO[0])
    assert mean_aspect(paddleclas_crop_box) == pytest.approx(uniform, abs=0.004)
    assert mean_aspect(random_resized_crop_box) == pytest.approx(log_uniform, abs=0.004)


def test_paddleclas_crop_area_is_uniform_in_the_scale_range():
    """The area fraction is U(0.08, 1) where every aspect fits (a square image: cap 3/4 at the extremes
    of the aspect range, so use a range below it): mean 0.29 for U(0.08, 0.5)."""
    rng = np.random.default_rng(1)
    boxes = np.array([paddleclas_crop_box(3000, 3000, rng, (0.08, 0.5)) for _ in range(20000)])
    frac = boxes[:, 2] * boxes[:, 3] / 3000 ** 2
    assert frac.min() >= 0.079 and frac.max() <= 0.5
    assert float(frac.mean()) == pytest.approx(0.29, abs=0.005)


def test_crop_sampler_reaches_the_training_transform(tmp_path):
    root = _list_root(tmp_path / "d", 4, (60, 90))
    a = ClassificationData(root, image_size=16, resize_size=20, crop_sampler="paddleclas").build("train", 3)
    b = ClassificationData(root, image_size=16, resize_size=20).build("train", 3)
    assert a.transform.crop_sampler == "paddleclas" and b.transform.crop_sampler == "torchvision"
    assert not np.array_equal(a[5]["image"], b[5]["image"])
    np.testing.assert_array_equal(a[5]["image"], a[5]["image"])


# ----------------------------------------------------------------- Mixup
def _items(n=6, k=5, seed=0, first_key=13):
    rng = np.random.default_rng(seed)
    return [{"image": rng.normal(size=(3, 4, 4)).astype(np.float32), "label": np.array(rng.integers(k), np.int64),
             "key": np.array(first_key + i, np.int64)} for i in range(n)]


def test_mixup_batch_matches_a_hand_computation():
    items = _items()
    out = MixupCollate(0.2, seed=5, num_samples=10)(items)
    assert set(out) == {"image", "label", "mix_label", "mix_lam"}  # the key is dropped
    # Batch generator: (seed, epoch, index of the first sample) = (5, 1, 3) for key 13 of 10 samples.
    rng = np.random.default_rng((5, 1, 3, MIXUP_STREAM))
    perm = rng.permutation(6)
    lam = rng.beta(0.2, 0.2)
    x = np.stack([it["image"] for it in items]).astype(np.float64)
    y = np.array([int(it["label"]) for it in items])
    np.testing.assert_allclose(out["image"], lam * x + (1 - lam) * x[perm], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(out["label"], y)
    np.testing.assert_array_equal(out["mix_label"], y[perm])
    np.testing.assert_allclose(out["mix_lam"], np.full(6, lam, np.float32))
    assert out["image"].dtype == np.float32 and out["mix_lam"].dtype == np.float32


def test_mixup_is_a_function_of_the_batch_and_lam_is_beta_distributed():
    collate = MixupCollate(0.2, seed=0, num_samples=1000)
    a = collate(_items(first_key=2013))
    np.testing.assert_array_equal(a["image"], collate(_items(first_key=2013))["image"])  # no hidden state
    assert a["mix_lam"][0] != collate(_items(first_key=3013))["mix_lam"][0]  # another epoch
    assert a["mix_lam"][0] != MixupCollate(0.2, seed=1, num_samples=1000)(_items(first_key=2013))["mix_lam"][0]
    # lam ~ Beta(0.2, 0.2): mean 1/2, variance ab / ((a+b)^2 (a+b+1)) = 0.1786, mostly near 0 or 1.
    x = np.zeros((4, 1), np.float32)
    lams = np.array([mixup_batch(x, np.arange(4), 0.2, np.random.default_rng((0, i)))[2] for i in range(8000)])
    assert lams.mean() == pytest.approx(0.5, abs=0.015)
    assert lams.var() == pytest.approx(0.04 / (0.16 * 1.4), abs=0.01)
    assert ((lams < 0.1) | (lams > 0.9)).mean() > 0.55


def test_mixup_batches_do_not_depend_on_the_worker_count(tmp_path):
    root = _list_root(tmp_path / "d", 12, (20, 24))
    data = ClassificationData(root, image_size=8, resize_size=10, mixup_alpha=0.2)
    assert data.build("val", 0).mixup_alpha is None  # evaluation is never mixed

    def batches(workers):
        train_set = data.build("train", 4)
        loader = build_loader(train_set, TrainBatchSampler(12, 4, seed=4, stop_step=6), workers)
        return [{k: v.numpy() for k, v in b.items()} for b in loader]

    serial, parallel = batches(0), batches(2)
    assert len(serial) == 6 and set(serial[0]) == {"image", "label", "mix_label", "mix_lam"}
    for s, p in zip(serial, parallel):
        for k in s:
            np.testing.assert_array_equal(s[k], p[k])


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_mixed_loss_matches_numpy_soft_target_cross_entropy(eps):
    """PaddleClas: target lam*onehot(y) + (1-lam)*onehot(y[perm]), smoothed to (1-eps) t + eps/K, then
    -sum(t * log_softmax(x)) averaged over the batch."""
    rng = np.random.default_rng(2)
    b, k, lam = 6, 7, 0.3
    logits = rng.normal(size=(b, k)).astype(np.float32) * 3
    y, y2 = rng.integers(k, size=b), rng.integers(k, size=b)
    batch = {"image": paddle.zeros([b, 1]), "label": paddle.to_tensor(y), "mix_label": paddle.to_tensor(y2),
             "mix_lam": paddle.full([b], lam, "float32")}
    got = float(ClassificationTask(eps).losses(lambda _: paddle.to_tensor(logits), batch)["loss"])

    x = logits.astype(np.float64)
    log_p = x - x.max(1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
    eye = np.eye(k)
    target = (1 - eps) * (lam * eye[y] + (1 - lam) * eye[y2]) + eps / k
    want = float(np.mean(-(target * log_p).sum(1)))
    assert got == pytest.approx(want, rel=1e-5)
    # The same as the old MixCELoss form lam * CE(y) + (1 - lam) * CE(y2) (the target is linear).
    ce = [np.mean(-(((1 - eps) * eye[t] + eps / k) * log_p).sum(1)) for t in (y, y2)]
    assert got == pytest.approx(lam * ce[0] + (1 - lam) * ce[1], rel=1e-5)
    # lam = 1 is the hard-label loss of the unmixed path.
    batch["mix_lam"] = paddle.ones([b], "float32")
    hard = {"image": batch["image"], "label": batch["label"]}
    task = ClassificationTask(eps)
    assert float(task.losses(lambda _: paddle.to_tensor(logits), batch)["loss"]) == pytest.approx(
        float(task.losses(lambda _: paddle.to_tensor(logits), hard)["loss"]), rel=1e-5)


# ----------------------------------------------------------------- config and a run
@pytest.mark.parametrize("value,message", [
    ("-1", "error: data.builder.mixup_alpha: expected null or a finite number > 0 (null = no Mixup), got -1"),
    ("0", "error: data.builder.mixup_alpha: expected null or a finite number > 0 (null = no Mixup), got 0"),
    ("lots", "error: data.builder.mixup_alpha: expected null or a finite number > 0 (null = no Mixup), got 'lots'"),
])
def test_bad_mixup_alpha_is_one_error_line(tmp_path, capsys, value, message):
    with pytest.raises(SystemExit) as exit_:
        _entry.run_or_exit(train, compose([*TINY, f"data.builder.mixup_alpha={value}"]), tmp_path / "run")
    err = capsys.readouterr().err
    assert (exit_.value.code, err.strip().splitlines()) == (2, [message])


def test_bad_crop_sampler_is_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        _entry.run_or_exit(train, compose([*TINY, "data.builder.crop_sampler=timm"]), tmp_path / "run")
    err = capsys.readouterr().err
    assert (exit_.value.code, err.strip().splitlines()) == (
        2, ["error: data.builder.crop_sampler: expected one of torchvision, paddleclas, got 'timm'"])


def test_tiny_run_with_mixup_and_paddleclas_crops(tmp_path):
    """4 steps of the tiny model with PaddleClas's recipe pieces on, through tools/train.py."""
    run = tmp_path / "run"
    out = run_tool(["tools/train.py", *TINY, "data.builder.mixup_alpha=0.2", "data.builder.crop_sampler=paddleclas",
                    "model.task.label_smoothing=0.1", f"hydra.run.dir={run}"], ROOT, env_extra={"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4
    builder = yaml.safe_load((run / "config.yaml").read_text())["data"]["builder"]
    assert (builder["mixup_alpha"], builder["crop_sampler"]) == (0.2, "paddleclas")
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert losses and all(math.isfinite(v) and v > 0 for v in losses)


def test_a_checkpoint_from_before_the_keys_resumes_without_changes():
    """Configs written before data.builder.crop_sampler / mixup_alpha existed trained with torchvision's
    crop and no Mixup: a resume with the new defaults is no change; with Mixup on it is one."""
    from zoo.engine.checkpoint import config_changes

    old = "data:\n  builder:\n    image_size: 32\n"
    new = "data:\n  builder:\n    image_size: 32\n    crop_sampler: torchvision\n    mixup_alpha: null\n"
    assert config_changes(old, new) == {}
    assert config_changes(old, new.replace("null", "0.2")) == {"data.builder.mixup_alpha": (None, 0.2)}
