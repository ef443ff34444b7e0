"""tools/amp_conformance.py: the emulation against Paddle's compiled AMP rule."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import run_tool

from zoo.diagnostics.conformance import Call, compare, load_allow_list, parse_decisions

ROOT = Path(__file__).resolve().parents[1]
GLOG = """I1201 10:21:39.120761  4088 amp_utils.h:120] Change conv2d's AMP type from float16 to FP32
I1201 10:21:39.120790  4088 amp_utils.h:186] AMP GetAmpDestDtype: op(conv2d) amp_dtype(float32) amp_level(1).
I1201 10:21:39.120795  4088 amp_utils.h:282] AMP AmpAutoCasts: op_name(conv2d)input(input) dst_dtype(float32).
I1201 10:21:39.153519  4088 amp_utils.h:186] AMP GetAmpDestDtype: op(elementwise_add) amp_dtype(float32) amp_level(1).
I1201 10:21:39.154335  4088 amp_utils.h:120] Change batch_norm's AMP type from bfloat16 to FP32
I1201 10:21:39.154335  4088 amp_utils.h:186] AMP GetAmpDestDtype: op(batch_norm) amp_dtype(float32) amp_level(2).
"""


def test_glog_lines_give_paddles_decisions():
    assert parse_decisions(GLOG) == [("conv2d", "low"), ("elementwise_add", "fp32"), ("batch_norm", "low")]


def test_compare_counts_disagreements_and_honours_the_allow_list():
    paddle_calls = [Call("conv2d", "low", 10), Call("add", "fp32", 10), Call("cast", "fp32", 5)]
    emu_calls = [Call("conv2d", "low", 10), Call("add", "low", 10)]
    rep = compare(paddle_calls, emu_calls, load_allow_list(), (3, 3))
    assert rep.calls == 3 and rep.disagreements == 2 and rep.unexplained == 1  # cast is allow-listed
    rows = {(r[0], r[1], r[2]): r for r in rep.rows}
    assert rows[("add", "fp32", "low")][5] is None and rows[("cast", "fp32", "absent")][5]
    assert compare(paddle_calls[:2], emu_calls, [], (3, 2)).unexplained == 2  # + parameter count


def test_allow_list_entries_need_a_reason(tmp_path):
    bad = tmp_path / "allow.yaml"
    bad.write_text("- {op: cast, paddle: fp32, emulation: absent}\n")
    with pytest.raises(ValueError, match="entry 1 lacks reason"):
        load_allow_list(bad)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["db_det_tiny", "ppyoloe_tiny", "resnet_tiny"])
def test_tiny_models_conform_at_every_level(model, tmp_path):
    for amp in ("O1", "O2", "bf16_O1", "bf16_O2"):
        out = tmp_path / f"{amp}.json"
        res = run_tool(["tools/amp_conformance.py", f"model={model}", f"amp={amp}", "--json", str(out)], ROOT)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        rep = json.loads(out.read_text())
        assert rep["unexplained"] == 0 and rep["calls"] > 40
        low_params = rep["low_params"]
        assert low_params[0] == low_params[1] and (low_params[0] > 0) == amp.endswith("O2")
        assert any(r["paddle"] == "low" for r in rep["rows"])  # the trace did see low-precision ops


@pytest.mark.slow
def test_the_tool_catches_the_old_everything_low_o2_rule(tmp_path):
    """Before the conformance work the emulation rounded every non-black op at O2."""
    script = tmp_path / "old_rule.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT / 'tools')!r})
        import amp_conformance as tool
        from zoo.amp.emulation import Emulation
        Emulation.mode = lambda self, op: "black" if op in self.black else "white"
        sys.exit(tool.main(["model=db_det_tiny", "amp=O2"]))
    """))
    res = run_tool([str(script)], ROOT, env_extra={"GLOG_vmodule": "amp_utils=6", "GLOG_logtostderr": "1"})
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "DISAGREE" in res.stdout


@pytest.mark.slow
def test_ops_called_by_keyword_conform(tmp_path):
    """issue 35.6: a layer that calls ``paddle.multiply(x=..., y=...)`` (PaddleOCR's LCNetV3 SELayer
    does) is low precision in Paddle's rule; the emulation used to compute it in fp32 (it read only
    positional tensors), which this comparison reports as a disagreement."""
    script = tmp_path / "keyword_model.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import paddle
        from zoo.amp.emulation import Emulation
        from zoo.diagnostics import conformance as conf

        class Gate(paddle.nn.Layer):
            def __init__(self):
                super().__init__()
                self.conv = paddle.nn.Conv2D(4, 4, 3, padding=1, bias_attr=False)
            def forward(self, x):
                y = self.conv(x)
                return paddle.multiply(x=y, y=paddle.nn.functional.relu(y)).mean()

        def fresh():
            paddle.seed(0)
            return Gate()

        x = paddle.rand([2, 4, 8, 8])
        p_calls, _ = conf.paddle_trace(fresh(), lambda m: m(x), "O1", "float16")
        e_calls, _ = conf.emulation_trace(fresh(), lambda m: m(x), Emulation("O1", "float16"))
        rep = conf.compare(p_calls, e_calls, conf.load_allow_list(), (0, 0))
        rows = {{r[0]: r[1:3] for r in rep.rows}}
        print("multiply", rows.get("multiply"), "unexplained", rep.unexplained)
        sys.exit(0 if rep.unexplained == 0 and rows.get("multiply") == ("low", "low") else 1)
    """))
    res = run_tool([str(script)], ROOT, env_extra={"GLOG_vmodule": "amp_utils=6", "GLOG_logtostderr": "1"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
