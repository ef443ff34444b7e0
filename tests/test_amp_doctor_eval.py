"""tools/amp_doctor.py, issue 39 item 3: the eval-mode probe, prescriptions checked before they are
printed, and underflow ranked by the gradient signal lost."""
from __future__ import annotations

import json
import math

import numpy as np
import paddle
import pytest
from conftest import ROOT, compose, run_tool

from zoo.amp import Amp
from zoo.diagnostics.doctor import examine, measure
from zoo.diagnostics.eval_findings import EVAL_FP32, probe_findings
from zoo.diagnostics.fix_check import check_fixes
from zoo.diagnostics.prescribe import diagnose

FP16_MAX = 65504.0
EPS = 1e-5   # BatchNorm1D's epsilon


# ---- an eval-only overflow on a hand-built model ----------------------------------------------------
class EvalOnlyNet(paddle.nn.Layer):
    """fc1 -> BatchNorm -> bias-free fc2 (fp16 at O1). Train mode normalises by the batch; eval mode
    by a running variance of 0, i.e. divides by sqrt(eps) (x316): fc2 overflows in eval mode only,
    as DB's conv1 does on validation images."""

    def __init__(self, gain):
        super().__init__()
        self.fc1 = paddle.nn.Linear(4, 16)
        self.bn = paddle.nn.BatchNorm1D(16, epsilon=EPS)
        self.fc2 = paddle.nn.Linear(16, 16, bias_attr=False)
        with paddle.no_grad():
            self.fc2.weight.set_value(self.fc2.weight * gain)
            self.bn._variance.set_value(paddle.zeros([16]))

    def forward(self, x):
        return self.fc2(self.bn(self.fc1(x)))


class ImageTask:
    """A task over ``{"image": x}`` batches: a loss for the training steps, a forward for evaluation."""

    def __init__(self, factor=1.0):
        self.factor = factor

    def losses(self, model, batch):
        return {"loss": (model(batch["image"]).astype("float32") ** 2).mean() * self.factor}

    def eval_stats(self, model, batch):
        model(batch["image"])
        return {"num_images": float(batch["image"].shape[0])}


def _batches(seed, n=2, rows=16, cols=4):
    return [{"image": paddle.to_tensor(np.random.RandomState(seed + i).randn(rows, cols).astype("float32"))}
            for i in range(n)]


def _fc2_reference(model, x, train: bool) -> np.ndarray:
    """fc2's input and output in NumPy from the weights: BatchNorm on batch or running statistics."""
    h = x @ model.fc1.weight.numpy() + model.fc1.bias.numpy()
    mean, var = (h.mean(0), h.var(0)) if train else (model.bn._mean.numpy(), model.bn._variance.numpy())
    z = (h - mean) / np.sqrt(var + EPS) * model.bn.weight.numpy() + model.bn.bias.numpy()
    return z, z @ model.fc2.weight.numpy()


def test_an_eval_only_overflow_is_found_with_the_images_it_costs_and_checked_fixes():
    amp = Amp(name="t", enabled=True, level="O1", dtype="float16")
    train, val = _batches(0), _batches(10)
    paddle.seed(0)
    model = EvalOnlyNet(300.0)
    # the plant, against NumPy: train-mode fc2 stays far below the max (not even "near"), eval goes over
    assert max(np.abs(_fc2_reference(model, b["image"].numpy(), True)[1]).max() for b in train) < FP16_MAX / 4
    assert max(np.abs(_fc2_reference(model, b["image"].numpy(), False)[1]).max() for b in val) > FP16_MAX
    task = ImageTask(1e-6)   # gradients well inside fp16 at the default scale: nothing else to find
    measured = measure(model, task, paddle.optimizer.SGD(0.0, parameters=model.parameters()), train, amp)
    assert diagnose(measured, None, amp)["findings"] == []   # what the doctor said before: OK

    paddle.seed(0)
    model = EvalOnlyNet(300.0)
    got = probe_findings(model, task, val, None, amp, measured, "test")
    [f] = got["findings"]
    assert f["mode"] == "eval" and f["layers"] == ["fc2:linear"] and f["severity"] == "risky"
    # which images go inf: fc2 in fp16 (inputs rounded, fp32 accumulation, output rounded), in NumPy
    inf_rows = []
    for i, b in enumerate(val):
        z, _ = _fc2_reference(model, b["image"].numpy(), False)
        w = model.fc2.weight.numpy().astype(np.float16).astype(np.float32)
        with np.errstate(over="ignore"):   # the overflow to inf is the point
            out16 = (z.astype(np.float16).astype(np.float32) @ w).astype(np.float16)
        inf_rows += [i * 16 + r for r in np.flatnonzero(~np.isfinite(out16).all(1))]
    assert got["info"]["nonfinite_images"] == inf_rows and f["nonfinite_images"] == len(inf_rows) > 0
    assert f"{len(inf_rows)} of 32 validation images get non-finite outputs" in f["why"]
    assert f["fix"] == EVAL_FP32 and f["fix_checks"][EVAL_FP32]["prevents"]
    assert f["fix_checks"]["amp.custom_black_list=[linear]"]["prevents"]     # re-run emulated with it
    assert got["info"]["nonfinite_images_fp32"] == []


def test_without_the_running_statistics_plant_the_eval_probe_finds_nothing():
    amp = Amp(name="t", enabled=True, level="O1", dtype="float16")
    paddle.seed(0)
    model = EvalOnlyNet(300.0)
    with paddle.no_grad():
        model.bn._variance.set_value(paddle.ones([16]))   # eval mode close to train mode again
    measured = measure(model, ImageTask(), paddle.optimizer.SGD(0.0, parameters=model.parameters()),
                       _batches(0), amp)
    got = probe_findings(model, ImageTask(), _batches(10), None, amp, measured, "test")
    assert got["findings"] == [] and got["info"]["nonfinite_images"] == []


# ---- a prescription is checked before it is printed -------------------------------------------------
def _f(kind, severity, fix, **kw):
    return {"kind": kind, "severity": severity, "what": kind, "why": "", "fix": fix, **kw}


def test_a_fix_that_makes_the_verdict_worse_is_replaced_by_the_next_candidate():
    calib = _f("calibration", "note", "amp.init_loss_scaling=32768", candidates=["amp.init_loss_scaling=8192"])
    seen = []

    def judge(over):   # 32768: no headroom, the emulated steps skip (db_det amp=O2, issue 39)
        seen.append(over)
        return [_f("emulated skips", "risky", "")] if over["amp.init_loss_scaling"] == 32768 else []

    check_fixes([calib], judge)
    assert calib["fix"] == "amp.init_loss_scaling=8192" and calib["fix_check"]["verdict_with_fix"] == "OK"
    assert calib["fix_check"]["rejected"][0]["fix"] == "amp.init_loss_scaling=32768"
    assert "emulated skips becomes risky" in calib["fix_check"]["rejected"][0]["worse"]
    assert seen == [{"amp.init_loss_scaling": 32768}, {"amp.init_loss_scaling": 8192}]


def test_no_fix_is_printed_when_every_candidate_is_worse_and_switches_are_not_judged():
    under = _f("underflow", "risky", "amp.init_loss_scaling=4")
    skips = _f("emulated skips", "risky", "amp.guard.find_nonfinite_layer=true (tools/train.py) to name the layer")
    check_fixes([under, skips], lambda over: [_f("underflow", "risky", "x"), _f("flush", "risky", "y")])
    assert under["fix"].startswith("none checked better: amp.init_loss_scaling=4 (")
    assert "flush becomes risky" in under["fix"] and "underflow stays risky" in under["fix"]
    assert skips["fix_check"] == {"checked": False, "why": "not a setting"}


def test_an_eval_fix_is_judged_by_its_eval_check_and_keeps_the_training_findings():
    ev = _f("eval overflow conv2d", "risky", EVAL_FP32, mode="eval",
            fix_checks={EVAL_FP32: {"prevents": True, "how": "the FP32 pass", "images": 10, "nonfinite_images": 0}})
    note = _f("calibration", "note", "amp.init_loss_scaling=8192")
    check_fixes([ev, note], lambda over: [])
    assert ev["fix"] == EVAL_FP32 and ev["fix_check"]["verdict_with_fix"] == "OK"
    assert ev["fix_check"]["findings_with_fix"] == ["[note] calibration"]   # training side untouched
    assert note["fix_check"]["verdict_with_fix"] == "risky"                  # the eval finding stays


# ---- underflow ranked by the signal lost --------------------------------------------------------------
class TwoBranch(paddle.nn.Layer):
    """``fc_a`` reaches the loss scaled by 1e-12 (its FP32 gradient is ~0 everywhere), ``fc_b``
    directly: with the loss scaled by 1e-8 its gradients are ~1e-8, below fp16's 2^-25 at scale 1."""

    def __init__(self):
        super().__init__()
        self.fc_a = paddle.nn.Linear(8, 8, bias_attr=False)
        self.fc_b = paddle.nn.Linear(8, 8, bias_attr=False)

    def forward(self, x):
        return self.fc_a(x) * 1e-12 + self.fc_b(x)


def test_underflow_ranks_by_signal_lost_not_by_the_share_of_tiny_entries():
    amp = Amp(name="t", enabled=True, level="O1", dtype="float16", init_loss_scaling=1.0,
              use_dynamic_loss_scaling=False)
    paddle.seed(0)
    model = TwoBranch()
    measured = measure(model, ImageTask(1e-8), paddle.optimizer.SGD(0.0, parameters=model.parameters()),
                       _batches(0, 2, 16, 8), amp)
    [under] = [f for f in diagnose(measured, None, amp)["findings"] if f["kind"] == "underflow"]
    rank = dict(under["worst"])
    # both lose every entry (the element share that ranked them alike), only fc_b loses signal
    for name in ("fc_a.weight", "fc_b.weight"):
        assert measured.params[name].count_below(2.0 ** -25) == measured.params[name].nonzero
    assert rank["fc_b.weight"] > 0.5 > 1e-9 > rank["fc_a.weight"]
    assert [n for n, _ in under["worst"]].index("fc_b.weight") < [n for n, _ in under["worst"]].index("fc_a.weight")
    # the share against NumPy: fc_b's lost squares over every parameter's gradient, both steps
    paddle.seed(0)
    model, sums = TwoBranch(), {"fc_a.weight": 0.0, "fc_b.weight": 0.0}
    opt = paddle.optimizer.SGD(0.0, parameters=model.parameters())
    for b in _batches(0, 2, 16, 8):
        ImageTask(1e-8).losses(model, b)["loss"].backward()
        for n, p in model.named_parameters():
            sums[n] += float((p.grad.numpy().astype(np.float64) ** 2).sum())
        opt.clear_grad()
    assert math.isclose(rank["fc_b.weight"], math.sqrt(sums["fc_b.weight"] / sum(sums.values())), rel_tol=1e-6)


# ---- db_det_tiny: a planted eval-mode overflow in head.binarize.conv1 ------------------------------------
SMALL = ["data.builder.num_train=16", "data.builder.num_val=10", "data.builder.image_size=[128,128]",
         "data.builder.crop_size=96", "doctor.steps=2"]
PLANT = ["model=db_det_tiny", "amp=O1", *SMALL, "doctor.check=false", "doctor.check_fixes=false"]


def _eval_output(model, image):
    model.eval()
    with paddle.no_grad():
        return model(image)["maps"].numpy()


def test_db_tiny_planted_eval_overflow_in_the_binarize_conv_is_named(tmp_path):
    from zoo.diagnostics.eval_probe import val_batches
    from zoo.engine.run import build, seed_everything

    cfg = compose(PLANT, "doctor")
    seed_everything(0)
    model = build(cfg.model.net, "model.net")
    plain = tmp_path / "plain.pdparams"
    paddle.save(model.state_dict(), str(plain))
    [batch], _ = val_batches(cfg, 1)
    ref = _eval_output(model, batch["image"])
    seen = []
    hook = model.head.binarize.conv1.register_forward_post_hook(lambda _l, _i, o: seen.append(float(o.abs().max())))
    _eval_output(model, batch["image"])
    hook.remove()
    c = 4 * FP16_MAX / seen[0]           # conv1 x c overflows; its BatchNorm's statistics x c, x c^2 undo it
    head = model.head.binarize
    with paddle.no_grad():
        head.conv1.weight.set_value(head.conv1.weight * c)
        head.conv_bn1._mean.set_value(head.conv_bn1._mean * c)
        head.conv_bn1._variance.set_value(head.conv_bn1._variance * c * c)
    assert np.allclose(_eval_output(model, batch["image"]), ref, rtol=1e-4, atol=1e-5)   # FP32: the same maps
    planted = tmp_path / "planted.pdparams"
    paddle.save(model.state_dict(), str(planted))

    # the user's setting trainer.eval_precision=both: the fp16 evaluation is the run's metric
    found = examine(compose([*PLANT, f"model.net.pretrained={planted}", "trainer.eval_precision=both"], "doctor"))
    ev = [f for f in found["findings"] if f.get("mode") == "eval" and "head.binarize.conv1:conv2d" in f["layers"]]
    assert ev and found["verdict"] != "OK" and ev[0]["nonfinite_images"] > 0 and ev[0]["severity"] != "note"
    assert ev[0]["fix_checks"][EVAL_FP32]["prevents"] and ev[0]["fix"] == EVAL_FP32
    # DB's recipe already evaluates the metric in FP32: the overflow is named, as a note, nothing prescribed
    recipe = examine(compose([*PLANT, f"model.net.pretrained={planted}"], "doctor"))
    ev = [f for f in recipe["findings"] if f.get("mode") == "eval" and "head.binarize.conv1:conv2d" in f["layers"]]
    assert ev and ev[0]["severity"] == "note" and ev[0]["fix"] == f"none needed: {EVAL_FP32} is set"
    assert "This config already has trainer.eval_precision=fp32" in ev[0]["why"]
    clean = examine(compose([*PLANT, f"model.net.pretrained={plain}"], "doctor"))
    assert not [f for f in clean["findings"] if f.get("mode") == "eval"] and clean["eval"]["nonfinite_images"] == []


# ---- the tool: a printed fix applied does not make the verdict worse ---------------------------------------
@pytest.mark.slow   # two runs of the tool on db_det_tiny (~30 s)
def test_db_tiny_o2_printed_fix_applied_is_no_worse(tmp_path):
    def tool(*extra):
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        res = run_tool(["tools/amp_doctor.py", "model=db_det_tiny", "amp=O2", *SMALL, "doctor.eval_batches=1",
                        f"doctor.out={out}", *extra], ROOT)
        assert res.returncode in (0, 1), res.stderr[-2000:]
        return res, json.loads((out / "doctor.json").read_text())

    res, data = tool()
    fixes = [f for f in data["findings"] if f.get("fix_check", {}).get("checked") and f["fix_check"]["verdict_with_fix"]]
    assert fixes, data["findings"]   # db_det's O2 recipe: the calibration note, its scale checked
    assert "checked: verdict with it" in res.stdout and "eval-mode probe" in res.stdout
    order = ["OK", "risky", "will fail"]
    for f in fixes:
        _, fixed = tool(*f["fix"].split())
        assert order.index(fixed["verdict"]) <= order.index(data["verdict"]), (f["fix"], fixed["findings"])
        assert order.index(fixed["verdict"]) == order.index(f["fix_check"]["verdict_with_fix"])
