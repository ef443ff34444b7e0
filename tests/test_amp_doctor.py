"""tools/amp_doctor.py: predictions on hand-built layers whose numerics are known, and on tiny models."""
from __future__ import annotations

import json
import math

import numpy as np
import paddle
import pytest
from conftest import ROOT, run_tool

from zoo.amp import Amp
from zoo.diagnostics.doctor import check, compare, measure
from zoo.diagnostics.numerics import FORMATS, Stats, loss_scale_window
from zoo.diagnostics.prescribe import diagnose

FP16 = FORMATS["float16"]


# ---- the exponent histogram ---------------------------------------------------------------------
def test_shares_are_exact_at_power_of_two_scales():
    s = Stats().add(np.array([0.0, 2.0 ** -26, 2.0 ** -20, 1.0, 2.0 ** 15, 2.0 ** 17], np.float32))
    assert s.numel == 6 and s.zeros == 1 and s.max_abs == 2.0 ** 17
    assert s.count_above(FP16.max) == 1                      # 2^17 only
    assert s.count_below(FP16.min_normal) == 2               # 2^-26, 2^-20
    assert s.count_below(FP16.min_subnormal / 2) == 1        # 2^-26 rounds to 0
    assert s.count_above(FP16.max, scale=2.0) == 2           # 2^15 * 2 = 2^16 overflows
    assert s.count_below(FP16.min_subnormal / 2, scale=2.0 ** 10) == 0
    assert math.isclose(s.dynamic_range_bits, 43.0)


def test_loss_scale_window_brackets_known_gradients():
    tiny = Stats().add(np.full(1000, 2.0 ** -24, np.float32))
    assert loss_scale_window([tiny], FP16) == (2.0 ** 10, 2.0 ** 39)   # 2^-24 * 2^10 = 2^-14 normal
    both = Stats().add(np.concatenate([np.full(1000, 2.0 ** -24, np.float32), np.full(10, 2.0 ** -2, np.float32)]))
    low, high = loss_scale_window([both], FP16)
    assert high == 2.0 ** 17                      # 2^-2 * 2^17 = 2^15 < 65504 < 2^16
    assert low < 2.0 ** 10                        # the tiny entries carry < 1% of the mass


# ---- hand-built layers ----------------------------------------------------------------------------
class ExpNet(paddle.nn.Layer):
    """exp(k * linear(x)): overflows fp16 for k * z > 11.09, as DBHead's step function does."""

    def __init__(self, k):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 4)
        self.k = k

    def forward(self, x):
        return paddle.reciprocal(1 + paddle.exp(-self.k * self.fc(x)))


class TinyGradNet(paddle.nn.Layer):
    """Linear whose loss is multiplied by ``factor``: gradients of known, tiny size."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x)


class Task:
    def __init__(self, factor=1.0):
        self.factor = factor

    def losses(self, model, batch):
        out = model(batch)
        return {"loss": (out.astype("float32") ** 2).mean() * self.factor}


def _doctor(make, task, amp_kw, steps=2, run_check=True):
    batches = [paddle.to_tensor(np.random.RandomState(i).randn(16, make().fc.weight.shape[0]).astype("float32"))
               for i in range(steps)]

    def fresh():
        paddle.seed(0)
        model = make()
        return model, paddle.optimizer.SGD(1e-3, parameters=model.parameters())

    amp_args = {"name": "t", "enabled": True, "level": "O2", "dtype": "float16", **amp_kw}
    model, opt = fresh()
    measured = measure(model, task, opt, batches, Amp(**amp_args))
    emulated = None
    if run_check:
        model, opt = fresh()
        emulated = check(model, task, opt, batches, Amp(**amp_args))
    return diagnose(measured, emulated, Amp(**amp_args)), measured, emulated


def test_exp_overflow_is_predicted_fails_in_the_emulation_and_black_listing_fixes_it():
    res, measured, emulated = _doctor(lambda: ExpNet(20.0), Task(), {})
    exp = [f for f in res["findings"] if f.get("op") == "exp"]
    assert res["verdict"] == "will fail" and exp and exp[0]["fix"] == "amp.custom_black_list=[exp]"
    assert not any(f.get("op") == "add" for f in res["findings"])    # 1 + inf is a consequence
    assert not any(emulated.stepped)                                  # the emulation agrees: NaN backward
    assert compare(measured, emulated)["ops"]["model:exp"]["act_rel_err"] == math.inf
    fixed, _, emulated = _doctor(lambda: ExpNet(20.0), Task(), {"custom_black_list": ["exp"], "init_loss_scaling": 64.0})
    assert not any(f.get("op") == "exp" for f in fixed["findings"]) and all(emulated.stepped)


def test_the_prediction_follows_the_emulation_rule_at_o1():
    # fp16 O1: Paddle's own black list holds exp, and the fp32 bias makes the linear's output fp32
    # anyway, so the same layer that fails at O2 computes exp in fp32 and is not flagged.
    res, measured, _ = _doctor(lambda: ExpNet(20.0), Task(), {"level": "O1"}, run_check=False)
    assert not measured.records["model:exp"].low and measured.records["fc:linear"].mode == "white"
    assert not any(f.get("op") == "exp" for f in res["findings"])


def test_a_small_exp_argument_is_not_flagged():
    res, _, _ = _doctor(lambda: ExpNet(0.5), Task(), {}, run_check=False)
    assert not any(f.get("op") == "exp" for f in res["findings"])


def test_underflow_at_a_static_scale_fails_and_the_window_scale_fixes_it():
    kw = {"use_dynamic_loss_scaling": False, "init_loss_scaling": 1.0, "master_grad": True}
    res, _, _ = _doctor(TinyGradNet, Task(1e-9), kw, run_check=False)
    under = [f for f in res["findings"] if "underflow" in f["what"]]
    assert res["verdict"] == "will fail" and under
    scale = float(under[0]["fix"].split()[0].split("=")[1])
    lo, hi = res["loss_scale"]["window"]
    assert lo <= scale <= hi and "amp.use_dynamic_loss_scaling=true" in under[0]["fix"]
    kw["init_loss_scaling"] = scale
    ok, _, _ = _doctor(TinyGradNet, Task(1e-9), kw, run_check=False)
    assert not any("underflow" in f["what"] for f in ok["findings"])


def test_subnormal_gradients_at_a_static_scale_are_risky_though_none_round_to_0():
    # gradients ~1e-5: inside fp16's subnormals (6e-8 .. 6.1e-5) at scale 1, a few bits each, little 0
    kw = {"use_dynamic_loss_scaling": False, "init_loss_scaling": 1.0, "master_grad": True}
    res, measured, _ = _doctor(TinyGradNet, Task(1e-4), kw, run_check=False)
    g = np.concatenate([measured.first_params[n].ravel() for n in measured.first_params]).astype(np.float64)
    norm = (g ** 2).sum()
    assert (g[np.abs(g) < 2.0 ** -25] ** 2).sum() < 1e-4 * norm < 0.25 * norm < (g[np.abs(g) < 2.0 ** -14] ** 2).sum()
    [under] = [f for f in res["findings"] if f["kind"] == "underflow"]
    assert under["severity"] == "risky" and under["share"] < 0.01 < max(under["below_normal"].values())
    lo, hi = res["loss_scale"]["window"]
    assert lo > 1 and under["fix"].startswith(f"amp.init_loss_scaling={max(lo, hi / 4):g} ")
    ok, _, _ = _doctor(TinyGradNet, Task(1e-4), {**kw, "init_loss_scaling": max(lo, hi / 4)}, run_check=False)
    assert not [f for f in ok["findings"] if f["kind"] == "underflow"]


def test_o2_stored_gradient_flush_is_predicted_confirmed_and_master_grad_removes_it():
    kw = {"init_loss_scaling": 2.0 ** 20}     # large enough that nothing underflows before storing
    res, measured, emulated = _doctor(TinyGradNet, Task(1e-12), kw)
    flush = [f for f in res["findings"] if "flush" in f["what"]]
    assert flush and flush[0]["fix"] == "amp.master_grad=true" and res["flush"]["flushed_share"] > 0.5
    assert emulated.flushed[0] > 0                                # the emulated store flushes some
    assert compare(measured, emulated)["lost_nonzero_param_grads"] > 0.9   # and the rest underflowed earlier
    ok, _, emulated = _doctor(TinyGradNet, Task(1e-12), {**kw, "master_grad": True})
    assert not any("flush" in f["what"] for f in ok["findings"]) and not emulated.flushed


def test_bf16_sum_that_cancels_is_flagged():
    class Cancel(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(8, 8)

        def forward(self, x):
            y = self.fc(x) + 5.0
            return (y - paddle.flip(y, [0]) * 0.99999).sum()   # 512 terms of ~1 summing to ~0.03

    class SumTask:
        def losses(self, model, batch):
            return {"loss": model(batch).astype("float32")}

    batches = [paddle.to_tensor(np.random.RandomState(0).randn(64, 8).astype("float32"))]
    paddle.seed(0)
    model = Cancel()
    amp = Amp(name="t", enabled=True, level="O2", dtype="bfloat16")
    measured = measure(model, SumTask(), paddle.optimizer.SGD(1e-3, parameters=model.parameters()), batches, amp)
    res = diagnose(measured, None, amp)
    assert any(f["what"].startswith("bf16 sums") for f in res["findings"]), res["findings"]


# ---- the tool on tiny models ------------------------------------------------------------------------
def _tool(tmp_path, *overrides):
    out = tmp_path / "doc"
    res = run_tool(["tools/amp_doctor.py", *overrides, "doctor.steps=2", f"doctor.out={out}"], ROOT)
    data = json.loads((out / "doctor.json").read_text()) if (out / "doctor.json").exists() else None
    return res, data, out


@pytest.mark.slow  # the first DB test of a session generates synthetic_text (~20 s)
def test_db_tiny_without_the_exp_entry_will_fail(tmp_path):
    res, data, out = _tool(tmp_path, "model=db_det_tiny", "amp=O2", "amp.custom_black_list=[]", "doctor.eval_batches=1")
    assert res.returncode == 1, res.stderr[-2000:]
    assert data["verdict"] == "will fail" and data["findings"][0]["fix"] == "amp.custom_black_list=[exp]"
    assert "DBHead" in data["findings"][0]["what"] and not any(data["check"]["stepped"])
    assert "verdict: will fail" in res.stdout and (out / "doctor.png").stat().st_size > 0
    assert "doctor.png" in (out / "index.html").read_text()


@pytest.mark.slow
def test_db_tiny_with_exp_black_listed_has_no_exp_finding(tmp_path):
    res, data, _ = _tool(tmp_path, "model=db_det_tiny", "amp=O2", "amp.custom_black_list=[exp]",
                         "doctor.eval_batches=1", "doctor.check_fixes=false")
    assert res.returncode in (0, 1), res.stderr[-2000:]
    assert data["verdict"] != "will fail" and not any(f.get("op") == "exp" for f in data["findings"])
    assert any(data["check"]["stepped"])
    if not data["check"]["stepped"][0]:   # a calibration skip: its zeroed gradients are not flush
        assert data["check"]["lost_nonzero_param_grads"] is None


def test_ppyoloe_tiny_o2_reports_the_stored_gradient_flush(tmp_path):
    _, data, _ = _tool(tmp_path, "model=ppyoloe_tiny", "amp=O2", "amp.master_grad=false", "doctor.eval_batches=1",
                       "doctor.check_fixes=false")
    assert data["flush"]["stored_low_params"] > 0
    flush = [f for f in data["findings"] if "flush" in f["what"]]
    assert flush and flush[0]["fix"] == "amp.master_grad=true"
    assert data["check"]["lost_nonzero_param_grads"] > 0       # the emulated steps lose them too


def test_ppyoloe_tiny_o2_master_grad_has_no_flush(tmp_path):
    _, data, _ = _tool(tmp_path, "model=ppyoloe_tiny", "amp=O2", "amp.master_grad=true", "doctor.eval_batches=1",
                       "doctor.check_fixes=false")
    assert not data["flush"] and not any("flush" in f["what"] for f in data["findings"])


def test_resnet_tiny_o1_is_clean(tmp_path):
    res, data, _ = _tool(tmp_path, "model=resnet_tiny", "amp=O1")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert data["verdict"] == "OK" and all(data["check"]["stepped"])


@pytest.mark.parametrize("args, key", [(["amp=fp32"], "amp:"), (["amp=O1", "doctor.steps=0"], "doctor.steps:"),
                                       (["amp=O1", "amp.decr_ratio=2"], "amp.decr_ratio:")])
def test_bad_input_exits_2_naming_the_key(tmp_path, args, key):
    res = run_tool(["tools/amp_doctor.py", "model=resnet_tiny", *args, f"doctor.out={tmp_path}"], ROOT)
    assert res.returncode == 2 and f"error: {key}" in res.stderr, res.stderr[-2000:]


@pytest.mark.parametrize("arg", ["doctor.eval_batches=-1", "doctor.eval_batches=some", "doctor.check_fixes=maybe",
                                 "doctor.check=2"])
def test_bad_doctor_settings_fail_before_anything_runs_naming_the_key(arg):
    from conftest import compose

    from zoo.diagnostics.doctor import examine
    from zoo.engine.run import ConfigError

    with pytest.raises(ConfigError, match=f"^{arg.split('=')[0]}: expected"):
        examine(compose(["model=resnet_tiny", "amp=O1", arg], "doctor"))
