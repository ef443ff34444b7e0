"""Issue 15 item 5: no work a run does not use (final evaluation off, no batches past max_steps,
cheap image verification that still refuses truncated files)."""
from __future__ import annotations

import json
from itertools import islice

import pytest

from zoo.data import TrainBatchSampler
from zoo.engine import run as run_mod
from zoo.engine.metrics_log import read_metrics


def test_sampler_stop_step_ends_exactly_there_and_matches_the_infinite_stream():
    infinite = list(islice(iter(TrainBatchSampler(10, 3, seed=1)), 9))
    assert list(TrainBatchSampler(10, 3, seed=1, stop_step=7)) == infinite[:7]
    assert list(TrainBatchSampler(10, 3, seed=1, start_step=4, stop_step=7)) == infinite[4:7]
    assert list(TrainBatchSampler(10, 3, seed=1, start_step=7, stop_step=7)) == []


def _counting(monkeypatch):
    """Count the training samples a run loads."""
    calls = []
    real = run_mod.build_data

    def build_data(cfg):
        train_set, val_set, report = real(cfg)
        getitem = type(train_set).__getitem__

        class Counted(type(train_set)):
            def __getitem__(self, key):
                calls.append(int(key))
                return getitem(self, key)

        train_set.__class__ = Counted
        return train_set, val_set, report

    monkeypatch.setattr(run_mod, "build_data", build_data)
    return calls


def test_final_eval_off_and_loader_stops_at_max_steps(tiny_cfg, tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    summary = run_mod.train(tiny_cfg("trainer.final_eval=false"), tmp_path)
    # TINY: 4 steps of 16; the pairing digest reads the first 3 batches once before training.
    assert len(calls) == 3 * 16 + 4 * 16
    assert summary["steps"] == 4 and summary["primary_metric"]["value"] is None
    assert summary["metrics"] == {} and read_metrics(tmp_path / "metrics.jsonl", "eval") == []
    assert json.loads((tmp_path / "summary.json").read_text())["primary_metric"]["value"] is None


def test_final_eval_rejects_non_boolean(tiny_cfg, tmp_path):
    with pytest.raises(ValueError, match="trainer.final_eval"):
        run_mod.train(tiny_cfg("trainer.final_eval=maybe"), tmp_path)


def _label_dir(tmp_path, data: bytes):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.jpg").write_bytes(data)
    label = tmp_path / "train.txt"
    label.write_text('img/a.jpg\t[{"transcription": "x", "points": [[1,1],[20,1],[20,9],[1,9]]}]\n')
    return label


@pytest.mark.parametrize("decode", [False, True])
def test_junk_between_markers_is_refused_in_both_modes(tmp_path, decode):
    from zoo.data.text_det.dataset import load_det_labels

    # Start and end markers present, nothing decodable between: the header read (needed for the
    # polygon clipping anyway) refuses it without a decode.
    label = _label_dir(tmp_path, b"\xff\xd8" + b"\x00junk" * 50 + b"\xff\xd9")
    with pytest.raises(OSError, match=r"train.txt:1: .*a.jpg"):
        load_det_labels(label, "fail", tmp_path, decode=decode)


def test_verify_images_values(tmp_path):
    from zoo.data.text_det.dataset import TextDetData

    assert TextDetData(tmp_path, verify_images="decode").verify_images == "decode"
    with pytest.raises(ValueError, match="verify_images"):
        TextDetData(tmp_path, verify_images="full")


def test_truncated_jpeg_still_refused_without_decoding(tmp_path):
    import cv2
    import numpy as np

    from zoo.data.text_det.dataset import load_det_labels

    ok, buf = cv2.imencode(".jpg", np.full((40, 60, 3), 128, np.uint8))
    label = _label_dir(tmp_path, buf.tobytes()[:-40])
    with pytest.raises(OSError, match=r"train.txt:1: .*a.jpg.*truncated"):
        load_det_labels(label, "fail", tmp_path, decode=False)
    samples, problems = load_det_labels(label, "skip", tmp_path, decode=False)
    assert samples == [] and "truncated" in problems[0]


def test_a_timing_run_can_be_continued_with_the_final_evaluation(tiny_cfg, tmp_path):
    run_mod.train(tiny_cfg("trainer.final_eval=false"), tmp_path)
    summary = run_mod.train(tiny_cfg("trainer.max_steps=6", "trainer.resume=auto"), tmp_path)
    assert summary["steps"] == 6 and 0.0 <= summary["primary_metric"]["value"] <= 1.0
    assert summary["resume_changes"] and "trainer.final_eval" in json.dumps(summary["resume_changes"])
