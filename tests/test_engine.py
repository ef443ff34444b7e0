"""Training engine: run folder contract, checkpoints, exact resume, refusing to overwrite, bad values."""
from __future__ import annotations

import json

import numpy as np
import paddle
import pytest

from zoo.engine import checkpoint as ckpt
from zoo.engine.metrics_log import read_metrics
from zoo.engine.run import ConfigError, train
from zoo.engine.trainer import Trainer

SUMMARY_KEYS = {"model", "data", "seed", "requested_precision", "effective_precision", "device",
                "primary_metric", "metrics", "steps", "images_per_s", "peak_memory_mb", "wall_time_s",
                "skipped_steps", "final_loss_scale", "paddle_version", "git_revision"}


def test_run_folder_contract(tiny_cfg, tmp_path):
    summary = train(tiny_cfg("amp=O1", "amp.on_unsupported=fp32"), tmp_path)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary, default=str))
    assert SUMMARY_KEYS <= set(on_disk)
    # AMP asked for on a CPU with on_unsupported=fp32: it says what it asked and what it computed in.
    assert on_disk["requested_precision"] == "fp16-O1"
    assert on_disk["effective_precision"] == "fp32" and on_disk["device"] == "cpu"
    assert on_disk["final_loss_scale"] is None and on_disk["steps"] == 4
    assert 0.0 <= on_disk["primary_metric"]["value"] <= 1.0 and on_disk["primary_metric"]["name"] == "top1"
    train_recs = read_metrics(tmp_path / "metrics.jsonl", "train")
    assert [r["step"] for r in train_recs] == [1, 2, 3, 4]
    assert all({"loss", "lr", "loss_scale", "skipped_steps", "images_per_s"} <= set(r) for r in train_recs)
    assert read_metrics(tmp_path / "metrics.jsonl", "eval")[-1]["top1"] == on_disk["metrics"]["top1"]
    assert (tmp_path / "checkpoints" / ckpt.LAST).is_file() and (tmp_path / "checkpoints" / ckpt.BEST).is_file()
    assert "resnet_tiny" in (tmp_path / "config.yaml").read_text()


def test_checkpoint_round_trip_holds_full_state(tiny_cfg, tmp_path):
    train(tiny_cfg("trainer.ema_decay=0.9"), tmp_path)
    state = ckpt.load(tmp_path / "checkpoints" / ckpt.LAST)
    assert {"model", "optimizer", "scheduler", "amp", "ema", "step", "rng", "config"} <= set(state)
    assert state["step"] == 4 and "scaler" in state["amp"] and state["ema"]["updates"] == 4
    # The saved model weights are the ones training ended with.
    final = paddle.load(str(tmp_path / "checkpoints" / ckpt.BEST))
    assert set(final) == set(state["model"])


def test_atomic_save_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "c.pdckpt"
    ckpt.atomic_save({"model": {}, "step": 1}, target)

    def boom(obj, path):
        open(path, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(paddle, "save", boom)
    with pytest.raises(OSError):
        ckpt.atomic_save({"model": {}, "step": 2}, target)
    assert ckpt.load(target)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.pdckpt"]


def test_corrupt_checkpoint_is_named(tmp_path):
    bad = tmp_path / "last.pdckpt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ckpt.CheckpointError, match=str(bad)):
        ckpt.load(bad)


def _losses(path):
    return [(r["step"], r["loss"], r["lr"], r["loss_scale"], r["skipped_steps"])
            for r in read_metrics(path / "metrics.jsonl", "train")]


def test_kill_and_resume_reproduces_the_uninterrupted_run(tiny_cfg, tmp_path, monkeypatch):
    # Emulated fp16 with a scale that overflows at first: the resumed run must continue the
    # loss-scale trajectory (scaler state in the checkpoint), not restart it.
    over = ["trainer.max_steps=6", "trainer.ckpt_every=3", "trainer.ema_decay=0.8", "seed=3", "amp=O1",
            f"amp.init_loss_scaling={2.0**18}", "amp.incr_every_n_steps=2"]  # 2**22 skipped all 6
    full = train(tiny_cfg(*over), tmp_path / "runs" / "full")

    # Same run, killed during step 5 (after the checkpoint at step 3 was written).
    real_step = Trainer.train_step

    def dies_at_5(self, batch):
        if self.step == 4:
            raise KeyboardInterrupt("killed")
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", dies_at_5)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_cfg(*over), tmp_path / "runs2" / "a_killed")
    monkeypatch.setattr(Trainer, "train_step", real_step)
    assert not (tmp_path / "runs2" / "a_killed" / "summary.json").exists()

    # A new invocation with resume=auto finds the killed sibling run and continues from step 3.
    resumed = train(tiny_cfg(*over, "trainer.resume=auto"), tmp_path / "runs2" / "b_resumed")
    assert resumed["resumed_from"].endswith("a_killed/checkpoints/last.pdckpt")
    assert _losses(tmp_path / "runs2" / "b_resumed") == _losses(tmp_path / "runs" / "full")
    assert resumed["param_digests"] == full["param_digests"]
    assert resumed["final_loss_scale"] == full["final_loss_scale"] and 0 < full["skipped_steps"] < 6
    assert resumed["metrics"] == full["metrics"]
    # its wall time counts the killed segment too (the checkpoint carries the time so far)
    seg = ckpt.load(tmp_path / "runs2" / "a_killed" / "checkpoints" / ckpt.LAST)["wall_time"]
    assert resumed["wall_time_before_resume_s"] == pytest.approx(seg) and seg > 0
    assert resumed["wall_time_s"] > seg and full["wall_time_before_resume_s"] == 0.0


def test_resume_in_same_folder_and_refusal_to_overwrite(tiny_cfg, tmp_path):
    train(tiny_cfg(), tmp_path)
    before = (tmp_path / "checkpoints" / ckpt.LAST).read_bytes()
    with pytest.raises(ckpt.CheckpointError, match="already holds a run"):
        train(tiny_cfg(), tmp_path)
    assert (tmp_path / "checkpoints" / ckpt.LAST).read_bytes() == before
    # Resuming a finished run in place with more steps continues from its last step.
    more = train(tiny_cfg("trainer.max_steps=6", "trainer.resume=auto"), tmp_path)
    assert more["steps"] == 6
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl", "train")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("override, key", [
    ("model.batch_size=-4", "model.batch_size"),
    ("model.eval_batch_size=0", "model.eval_batch_size"),
    ("amp.level=O7", "amp.level"),
    ("amp.dtype=float8", "amp.dtype"),
    ("model.net.name=resnet9000", "model.net.name"),
    ("optim.lr=-1", "optim.lr"),
    ("trainer.max_steps=0", "trainer.max_steps"),
    ("amp.on_unsupported=error", "on_unsupported=error"),
])
def test_bad_values_fail_before_training_naming_the_key(tiny_cfg, tmp_path, override, key):
    with pytest.raises(Exception, match=key.replace(".", r"\.")):
        train(tiny_cfg("amp=O1", override), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_missing_data_root_is_named(tmp_path):
    from conftest import compose

    cfg = compose(["model=resnet_tiny", "data=imagenet", f"data.root={tmp_path / 'nowhere'}"])
    with pytest.raises(ConfigError, match="data.root"):
        train(cfg, tmp_path / "run")


def test_nonfinite_loss_without_scaler_stops_clearly(tiny_cfg, tmp_path):
    with pytest.raises(FloatingPointError, match="loss is nan at step 1"):
        train(_nan_cfg(tiny_cfg), tmp_path)


def _nan_cfg(tiny_cfg):
    cfg = tiny_cfg("trainer.max_steps=3", "sched.warmup_steps=0")
    cfg.model.task._target_ = "tests.test_engine.NaNTask"  # loss that is NaN on the first step
    return cfg


class NaNTask:
    primary_metric = "top1"

    def __init__(self, **_):
        pass

    def losses(self, model, batch):
        out = model(batch["image"]).astype("float32").mean()
        return {"loss": out * float("nan")}

    def eval_stats(self, model, batch):
        return {"count": 1.0, "top1_correct": 0.0}

    def compute_metrics(self, sums):
        return {"top1": 0.0}


def test_schedule_warmup_and_piecewise():
    from zoo.engine import schedules

    s = schedules.piecewise(0.1, total_steps=40, steps_per_epoch=10, boundary_epochs=[1, 2], gamma=0.1)
    lrs = []
    for _ in range(30):
        lrs.append(s.last_lr)
        s.step()
    assert np.allclose([lrs[0], lrs[9], lrs[10], lrs[20]], [0.1, 0.1, 0.01, 0.001])
    w = schedules.cosine(1.0, total_steps=10, steps_per_epoch=5, warmup_steps=4, warmup_start_factor=0.0)
    seen = []
    for _ in range(10):
        seen.append(w.last_lr)
        w.step()
    assert seen[0] == 0.0 and np.isclose(seen[2], 0.5) and np.isclose(seen[4], 1.0) and seen[9] < 0.1
    assert w.warmup_clipped is None  # a warm-up that fits is left as it is
    with pytest.raises(ValueError, match="sched.warmup_steps: expected an integer >= 0, got -1"):
        schedules.constant(0.1, total_steps=5, steps_per_epoch=5, warmup_steps=-1)


@pytest.mark.parametrize("make", ["constant", "cosine", "piecewise"])
def test_a_warmup_as_long_as_the_run_is_clipped_to_half_of_it(make):
    """trainer.max_steps=10 under a 10- or 20-step warm-up: the LR reaches the base LR at step 5."""
    from zoo.engine import schedules

    extra = {"boundary_steps": [8]} if make == "piecewise" else {}
    for warmup in (10, 20):
        s = getattr(schedules, make)(1.0, total_steps=10, steps_per_epoch=5, warmup_steps=warmup,
                                     warmup_start_factor=0.0, **extra)
        assert s.warmup_clipped == {"key": "sched.warmup_steps", "configured": warmup, "configured_steps": warmup,
                                    "used_steps": 5, "total_steps": 10}
        lrs = []
        for _ in range(10):
            lrs.append(s.last_lr)
            s.step()
        assert lrs[0] == 0.0 and np.isclose(lrs[4], 0.8) and np.isclose(lrs[5], 1.0)
    epochs = schedules.cosine(1.0, total_steps=10, steps_per_epoch=5, warmup_epochs=3)
    assert epochs.warmup_clipped["key"] == "sched.warmup_epochs" and epochs.warmup_clipped["configured_steps"] == 15
    assert schedules.clipped_warmup_message(epochs.warmup_clipped) == (
        "warning: sched.warmup_epochs: a warm-up of 3 epochs (= 15 steps) is not shorter than the run (10 steps); "
        "clipped to 5 steps, half the run (summary.json: warmup_clipped)")
    one = schedules.cosine(1.0, total_steps=1, steps_per_epoch=5, warmup_steps=10)
    assert one.warmup_clipped["used_steps"] == 0 and one.last_lr == 1.0  # a one-step run: no warm-up at all


def test_a_clipped_warmup_is_one_warning_line_and_recorded(tiny_cfg, tmp_path, capsys):
    summary = train(tiny_cfg("sched.warmup_steps=10"), tmp_path)  # TINY: trainer.max_steps=4
    err = capsys.readouterr().err
    warnings = [ln for ln in err.splitlines() if "warmup" in ln]
    assert warnings == ["warning: sched.warmup_steps: a warm-up of 10 steps is not shorter than the run (4 steps); "
                        "clipped to 2 steps, half the run (summary.json: warmup_clipped)"], err
    assert summary["warmup_clipped"] == {"key": "sched.warmup_steps", "configured": 10, "configured_steps": 10,
                                         "used_steps": 2, "total_steps": 4}
    assert json.loads((tmp_path / "summary.json").read_text())["warmup_clipped"] == summary["warmup_clipped"]
    assert train(tiny_cfg(), tmp_path / "fits")["warmup_clipped"] is None


def test_cosine_warmup_epochs_and_horizon():
    """PP-YOLOE's schedule: warm-up given in epochs, cosine period 1.2 x the run (360 of 300 epochs)."""
    from zoo.engine import schedules

    s = schedules.cosine(1.0, total_steps=100, steps_per_epoch=10, warmup_epochs=1, horizon=1.2)
    lrs = []
    for _ in range(100):
        lrs.append(s.last_lr)
        s.step()
    assert lrs[0] == 0.0 and np.isclose(lrs[10], 1.0)
    # after warm-up: 0.5 * (1 + cos(pi * t / T)) with T = 120 - 10 = 110 steps; the run ends at t = 89
    assert np.isclose(lrs[99], 0.5 * (1 + np.cos(np.pi * 89 / 110)))
    assert lrs[99] > 0.08  # stops above eta_min (0), as the 300/360-epoch schedule does
    with pytest.raises(ValueError, match="horizon"):
        schedules.cosine(1.0, total_steps=10, steps_per_epoch=5, horizon=0.5)


def test_gradient_clipping_bounds_the_first_update(tiny_cfg, tmp_path):
    from zoo.engine.run import build_trainer

    cfg = tiny_cfg("optim=momentum", "optim.optimizer.weight_decay=0.0", "optim.grad_clip_norm=0.001",
                   "sched=constant", "sched.warmup_steps=0", "optim.lr=0.5")
    trainer, _ = build_trainer(cfg, tmp_path)
    trainable = {n: p for n, p in trainer.model.named_parameters() if p.trainable}
    before = {n: p.numpy().copy() for n, p in trainable.items()}
    from zoo.data import TrainBatchSampler, build_loader

    sampler = TrainBatchSampler(len(trainer.train_set), 16, 0)
    trainer.train_step(next(iter(build_loader(trainer.train_set, sampler))))
    step = np.sqrt(sum(((p.numpy() - before[n]) ** 2).sum() for n, p in trainable.items()))
    # Momentum's first update is lr * clipped gradient, whose global norm is the clip norm.
    assert np.isclose(step, 0.5 * 0.001, rtol=1e-3)


def test_resume_errors_name_the_path_and_the_mismatch(tiny_cfg, tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="trainer.resume=.*no checkpoint at"):
        train(tiny_cfg(f"trainer.resume={tmp_path / 'nowhere'}"), tmp_path / "a")
    train(tiny_cfg(), tmp_path / "tiny")
    other = tiny_cfg("model.net.name=resnet18", f"trainer.resume={tmp_path / 'tiny'}")
    with pytest.raises(ckpt.CheckpointError, match="model.net.name: 'resnet_tiny' -> 'resnet18'"):
        train(other, tmp_path / "b")
    # Forced past the settings check, the weights themselves still have to fit.
    with pytest.raises(ckpt.CheckpointError, match="does not fit this model"):
        train(tiny_cfg("model.net.name=resnet18", f"trainer.resume={tmp_path / 'tiny'}",
                       "trainer.resume_allow_changes=true"), tmp_path / "c")


def test_resume_refuses_same_names_with_other_shapes(tiny_cfg, tmp_path):
    train(tiny_cfg(), tmp_path / "tiny")
    wider = tiny_cfg("+model.net.widths=[8,16,32,128]", f"trainer.resume={tmp_path / 'tiny'}",
                     "trainer.resume_allow_changes=true")
    with pytest.raises(ckpt.CheckpointError, match=r"shape mismatch \d+ \['blocks.3"):
        train(wider, tmp_path / "b")


def test_amp_without_rounding_reproduces_fp32_bit_for_bit(tiny_cfg, tmp_path):
    """The ablation control of MODEL_CARDS (db_det, item 5): emulated fp16 O1 with both roundings
    switched off keeps only the AMP code path (autocast bookkeeping, loss scaling and unscaling by a
    power of two, the overflow guard), which must change no number. With the rounding on, the same
    run differs: the comparison can fail."""
    fp32 = train(tiny_cfg("amp=fp32", "seed=5"), tmp_path / "fp32")
    control = train(tiny_cfg("amp=O1", "seed=5", "amp.emulation.forward=false", "amp.emulation.backward=false"),
                    tmp_path / "control")
    rounded = train(tiny_cfg("amp=O1", "seed=5"), tmp_path / "rounded")
    assert control["effective_precision"] == "emulated-fp16-O1-ablation-none-rounding"
    assert control["final_loss_scale"] > 1 and control["skipped_steps"] == 0  # the scaler did act
    assert [x[:3] for x in _losses(tmp_path / "control")] == [x[:3] for x in _losses(tmp_path / "fp32")]
    assert control["param_digests"] == fp32["param_digests"] and control["metrics"] == fp32["metrics"]
    assert rounded["param_digests"] != fp32["param_digests"]
