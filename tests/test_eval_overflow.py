"""Issue 39: an evaluation under low precision whose outputs hold inf or NaN says so, and DB's recipe
makes the run's metric the FP32 evaluation.

The README's run (`python tools/train.py model=db_det amp=O1`, 250 steps) ends with the head's
binarize.conv1 reaching 2.3e5 before its BatchNorm in eval mode: fp16 overflows there and 28 of 100
validation images get NaN maps. Training 250 steps takes minutes, so these tests plant the same
state in db_det's weights: conv1's weights times c, its BatchNorm's running mean times c and
running variance times c^2. FP32 computes the same maps (checked), train-mode BatchNorm is
scale-invariant, and the eval-mode conv1 output exceeds fp16's range as in the README's run.
"""
from __future__ import annotations

import json

import numpy as np
import paddle
import pytest
from conftest import compose

import zoo
from zoo.amp.emulation import Emulation
from zoo.amp.nonfinite import NonFiniteWatch, describe
from zoo.engine.run import result_line, train

FP16_MAX = 65504.0
SHORT = ["model=db_det", "amp=O1", "data.builder.num_train=8", "data.builder.num_val=6", "model.batch_size=2",
         "model.eval_batch_size=3", "trainer.max_steps=2", "trainer.progress=false",
         "trainer.bootstrap_resamples=0", "trainer.draw_samples=1"]


def _images(n=3, size=128, seed=0):
    rng = np.random.default_rng(seed)
    return paddle.to_tensor(rng.normal(0.0, 1.0, (n, 3, size, size)).astype("float32"))


def plant_overflow(model, images) -> float:
    """Scale binarize.conv1 and its BatchNorm statistics so the eval-mode conv1 output reaches 8x
    fp16's max on ``images``; returns the factor."""
    branch = model.head.binarize
    seen = []
    hook = branch.conv1.register_forward_post_hook(lambda _l, _i, out: seen.append(float(out.abs().max())))
    model.eval()
    with paddle.no_grad():
        model(images)
    hook.remove()
    c = 8 * FP16_MAX / seen[0]
    with paddle.no_grad():
        branch.conv1.weight.set_value(branch.conv1.weight * c)
        branch.conv_bn1._mean.set_value(branch.conv_bn1._mean * c)
        branch.conv_bn1._variance.set_value(branch.conv_bn1._variance * c * c)
    return c


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    paddle.seed(3)
    model = zoo.create_model("db_det")
    images = _images()
    model.eval()
    with paddle.no_grad():
        before = model(images)["maps"].numpy()
    plant_overflow(model, images)
    with paddle.no_grad():
        after = model(images)["maps"].numpy()
    path = tmp_path_factory.mktemp("planted") / "db_det_planted.pdparams"
    paddle.save(model.state_dict(), str(path))
    return model, images, before, after, path


def test_planting_leaves_fp32_unchanged(planted):
    _, _, before, after, _ = planted
    np.testing.assert_allclose(after, before, atol=1e-5)


def test_watch_counts_images_and_names_the_layer(planted):
    model, images, _, _, _ = planted
    with paddle.no_grad(), Emulation("O1", "float16", custom_black_list=["exp"])(), NonFiniteWatch(model) as watch:
        watch.begin_batch([10, 11, 12])
        out = model(images)["maps"].numpy()
    # independent count: conv1's own fp16 output, computed here with NumPy from its fp32 output
    conv1 = model.head.binarize.conv1
    with paddle.no_grad():
        feats = model.neck(model.backbone(images))
        pre = conv1(feats).numpy()
    with np.errstate(over="ignore"):
        bad = [10 + i for i in range(3) if not np.isfinite(pre[i].astype(np.float16)).all()]
    result = watch.result()
    assert bad and result["nonfinite_images"] == len(bad) and result["image_indices"] == bad
    assert result["first_layers"] == {"head.binarize.conv1 (Conv2D)": len(bad)}
    assert result["nonfinite_output_images"] == sum(not np.isfinite(out[i - 10]).all() for i in bad)
    assert describe(result).startswith(f"{len(bad)} of 3 images met non-finite values (first at "
                                       f"head.binarize.conv1 (Conv2D) in {len(bad)}; in ")
    with paddle.no_grad(), NonFiniteWatch(model) as fp32:
        model(images)
    assert fp32.result()["nonfinite_images"] == 0


def plant_eval_only_overflow(model, images, path) -> None:
    """The README run's state, planted: eval-mode activations far above train-mode ones because a
    BatchNorm's running statistics do not match (there: lagging a short run's weights). The last
    backbone BatchNorm's running mean is moved so that, in eval mode, binarize.conv1 would reach 40x
    fp16's max on ``images`` (the BatchNorm's own output overflows first); train mode (batch
    statistics) is untouched, and the mean survives two training steps (momentum 0.9: 0.81 of it is
    left)."""
    bn = model.backbone.stage3[3].bn
    base = bn._mean.numpy().copy()
    seen = []
    hook = model.head.binarize.conv1.register_forward_post_hook(lambda _l, _i, o: seen.append(float(o.abs().max())))
    model.eval()
    shift = 1.0
    with paddle.no_grad():
        for _ in range(6):  # conv1's max grows about linearly with a large shift: a few rescalings
            bn._mean.set_value(paddle.to_tensor(base - shift))
            model(images)
            if seen[-1] > 40 * FP16_MAX:
                break
            shift *= 50 * FP16_MAX / seen[-1]
    hook.remove()
    assert seen[-1] > 40 * FP16_MAX
    paddle.save(model.state_dict(), str(path))


@pytest.mark.slow
def test_short_readme_run_reports_its_nonfinite_images(tmp_path, capsys):
    """The README's command, shortened, from weights whose eval-mode forward overflows fp16 where
    training does not: the console and summary.json name the non-finite images of the fp16
    evaluation; the metric is the FP32 evaluation's (recipe/db/O1.yaml) and says so."""
    paddle.seed(3)
    path = tmp_path / "eval_overflow.pdparams"
    plant_eval_only_overflow(zoo.create_model("db_det"), _images(size=256), path)
    summary = train(compose([*SHORT, f"model.net.pretrained={path}"]), tmp_path / "run")
    out = capsys.readouterr().out
    numerics = summary["eval_numerics"]
    assert numerics["images"] == 6 and numerics["nonfinite_images"] >= 1
    # the planted BatchNorm's own fp16 output overflows first; ReLU turns the NaN after it into 0,
    # so the maps can be finite and wrong: the count is of images whose forward met inf/NaN
    assert set(numerics["first_layers"]) == {"backbone.stage3.3.bn (BatchNorm2D)"}
    assert summary["eval_numerics_fp32"]["nonfinite_images"] == 0
    pm = summary["primary_metric"]
    assert pm["evaluated_in"] == "fp32" and pm["nonfinite_images"] == 0
    assert summary["primary_metric_train_precision_eval"]["nonfinite_images"] == numerics["nonfinite_images"]
    line = next(x for x in out.splitlines() if x.startswith("hmean"))
    assert "in the FP32 evaluation (trainer.eval_precision=fp32) after 2 steps of emulated-fp16-O1 training" in line
    assert (f"in the emulated-fp16-O1 evaluation {numerics['nonfinite_images']} of 6 images met non-finite "
            "values (first at backbone.stage3.3.bn (BatchNorm2D)") in line
    assert summary["skipped_steps"] <= 1  # training itself does not overflow (1: the scaler's calibration)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["eval_numerics"] == numerics
    drawn = sorted(p.name for p in (tmp_path / "run" / "drawings").glob("*.png"))
    assert drawn == ["step2_emulated-fp16-O1_0.png", "step2_fp32_0.png"]


def test_result_line_never_hides_nonfinite_outputs():
    base = {"effective_precision": "emulated-fp16-O1",
            "primary_metric": {"name": "hmean", "value": 0.5156, "evaluated_in": "emulated-fp16-O1"},
            "eval_numerics": {"images": 100, "nonfinite_images": 28,
                              "first_layers": {"head.binarize.conv1 (Conv2D)": 28}}}
    assert result_line(base, 250) == (
        "hmean 0.5156 after 250 steps (emulated-fp16-O1); in the emulated-fp16-O1 evaluation 28 of 100 "
        "images met non-finite values (first at head.binarize.conv1 (Conv2D) in 28) (summary.json eval_numerics)")
    clean = {**base, "eval_numerics": {"images": 100, "nonfinite_images": 0}}
    assert result_line(clean, 250) == "hmean 0.5156 after 250 steps (emulated-fp16-O1)"
