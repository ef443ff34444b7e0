"""Bad image files: caught before training when possible, and never a hang when found during it."""
from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from zoo.data import EvalBatchSampler, SampleLoadError, TrainBatchSampler, build_loader
from zoo.data.coco.dataset import load_coco_instances
from zoo.data.images import ImageDecodeError, verify_image_file
from zoo.data.text_det.dataset import TextDetData

GOOD = '[{"transcription": "AB", "points": [[10, 10], [60, 10], [60, 30], [10, 30]]}]'


def _jpeg(path, h=64, w=96, cut=None):
    """A noisy JPEG (so it has real entropy-coded data); ``cut`` keeps that fraction of its bytes."""
    img = np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)
    data = cv2.imencode(".jpg", img)[1].tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: int(len(data) * cut)] if cut else data)
    return path


def _text_root(tmp_path):
    _jpeg(tmp_path / "img" / "good.jpg")
    _jpeg(tmp_path / "img" / "cut.jpg", cut=1 / 3)
    lines = [f"img/good.jpg\t{GOOD}"] * 3 + [f"img/cut.jpg\t{GOOD}"]
    for name in ("train.txt", "val.txt"):
        (tmp_path / name).write_text("\n".join(lines) + "\n")


def test_truncated_jpeg_decodes_in_opencv_but_is_refused(tmp_path):
    cut = _jpeg(tmp_path / "cut.jpg", cut=1 / 3)
    # The trap: OpenCV returns an image for it (with only a warning on stderr).
    assert cv2.imread(str(cut), cv2.IMREAD_REDUCED_GRAYSCALE_8) is not None
    with pytest.raises(ImageDecodeError, match="truncated"):
        verify_image_file(cut)
    verify_image_file(_jpeg(tmp_path / "ok.jpg"), expected_hw=(64, 96))
    with pytest.raises(ImageDecodeError, match="96x64 .* annotation says 90x64"):
        verify_image_file(tmp_path / "ok.jpg", expected_hw=(64, 90))


@pytest.mark.parametrize("hw", [(1, 1), (7, 20), (20, 7)])
def test_reduced_decode_of_an_image_under_8_px_a_side_falls_back_to_a_full_one(tmp_path, hw):
    """OpenCV shrinks a non-JPEG after decoding it in full, and its resize asserts on a side below
    the reduction: ``(-215:Assertion failed) inv_scale_x > 0``. The checks decode such images in full."""
    from zoo.data.images import decode_image

    path = tmp_path / "small.png"
    cv2.imwrite(str(path), np.full(hw + (3,), 90, np.uint8))
    with pytest.raises(cv2.error, match="inv_scale_x > 0"):  # the trap, if OpenCV ever changes
        cv2.imread(str(path), cv2.IMREAD_REDUCED_GRAYSCALE_8)
    verify_image_file(path, decode=True)
    data = path.read_bytes()
    assert decode_image(data, path, cv2.IMREAD_REDUCED_COLOR_8).shape == hw + (3,)
    # at 1/2 a 7 px side still shrinks (to 3: OpenCV floors for PNG) and a 1 px one decodes in full
    assert decode_image(data, path, cv2.IMREAD_REDUCED_COLOR_2).shape[:2] in (hw, (hw[0] // 2, hw[1] // 2))
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(data[:8] + b"\0" * 40 + data[-12:])  # signature and IEND, no image inside
    with pytest.raises(ImageDecodeError, match="corrupt.png"):
        verify_image_file(corrupt, decode=True)


def test_truncated_jpeg_in_label_file_fails_or_is_skipped_before_training(tmp_path):
    _text_root(tmp_path)
    data = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4)
    with pytest.raises(OSError, match=f"{tmp_path / 'train.txt'}:4: .*truncated"):
        data.build("train", 0)
    data = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4,
                       bad_samples="skip")
    assert len(data.build("train", 0)) == 3 and "cut.jpg" in data.skipped["train"][0]


def _coco(tmp_path, files: dict, sizes: dict):
    (tmp_path / "annotations").mkdir(exist_ok=True)
    images = [{"id": i, "file_name": name, "width": sizes[i][1], "height": sizes[i][0]}
              for i, name in files.items()]
    anns = [{"id": i, "image_id": i, "category_id": 1, "bbox": [1, 1, 10, 10]} for i in files]
    path = tmp_path / "annotations" / "ann.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "a"}]}))
    return path


def test_coco_truncated_or_wrong_size_image_is_named(tmp_path):
    _jpeg(tmp_path / "img" / "a.jpg")
    _jpeg(tmp_path / "img" / "b.jpg", cut=1 / 3)
    ann = _coco(tmp_path, {1: "a.jpg", 2: "b.jpg"}, {1: (64, 96), 2: (64, 96)})
    with pytest.raises(ValueError, match=r"image id=2 \(b.jpg\).*truncated"):
        load_coco_instances(ann, tmp_path / "img", verify_images=True)
    inst = load_coco_instances(ann, tmp_path / "img", bad_samples="skip", verify_images=True)
    assert [r["im_id"] for r in inst.records] == [1] and len(inst.skipped) == 1
    ann = _coco(tmp_path, {1: "a.jpg"}, {1: (64, 100)})
    with pytest.raises(ValueError, match=r"image id=1 \(a.jpg\).*96x64 \(w x h\) but its annotation says 100x64"):
        load_coco_instances(ann, tmp_path / "img", verify_images=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_sample_failing_during_training_raises_in_main_thread(tmp_path, workers):
    """Without verification the truncated file is met by the loader: an error naming it, not a hang."""
    _text_root(tmp_path)
    data = TextDetData(tmp_path, "train.txt", "val.txt", crop_size=32, eval_size=(64, 96), max_polys=4,
                       verify_images=False)
    train = data.build("train", 0)
    with pytest.raises(SampleLoadError, match=f"{tmp_path / 'train.txt'}:4: .*cut.jpg.*truncated"):
        for _ in zip(range(10), build_loader(train, TrainBatchSampler(len(train), 2, seed=0), workers)):
            pass
    val = data.build("val", 0)
    with pytest.raises(SampleLoadError, match="cut.jpg"):
        list(build_loader(val, EvalBatchSampler(len(val), 2), workers))


def test_negative_worker_count_is_named():
    with pytest.raises(ValueError, match="trainer.num_workers"):
        build_loader([], EvalBatchSampler(1, 1), -1)


@pytest.mark.timeout(120)
def test_issue_repro_ends_with_one_error_line_naming_the_file(tmp_path):
    """The issue's command, with verification off so the loader meets the truncated file."""
    from conftest import ROOT, run_tool

    _text_root(tmp_path / "data")
    # The bad image at line 40, so that it is met during training, not among the first batches
    # that the run reads before step 1 for its pairing digests (zoo/engine/provenance.py).
    lines = [f"img/good.jpg\t{GOOD}"] * 39 + [f"img/cut.jpg\t{GOOD}"]
    (tmp_path / "data" / "train.txt").write_text("\n".join(lines) + "\n")
    out = run_tool(["tools/train.py", "model=db_det_tiny", "data=icdar2015", f"data.root={tmp_path / 'data'}",
                    "data.builder.train_label=train.txt", "data.builder.val_label=val.txt",
                    "data.builder.verify_images=false", "trainer.max_steps=20", "model.batch_size=2",
                    "model.eval_batch_size=2", "data.builder.crop_size=64", "data.builder.eval_size=[64,96]",
                    "trainer.progress=false", f"hydra.run.dir={tmp_path / 'run'}"], ROOT, timeout=100)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{tmp_path / 'data' / 'train.txt'}:40" in errors[0] and "truncated" in errors[0]
    assert "Traceback" not in out.stderr
    log = (tmp_path / "run" / "train.log").read_text()  # the console's plain lines are in the log too
    assert "precision: requested fp32" in log and errors[0] in log
    # The steps done before the bad sample are kept, with the way to continue once it is fixed.
    assert "resume with trainer.resume=auto once the file is fixed" in errors[0]
    assert (tmp_path / "run" / "checkpoints" / "last.pdckpt").is_file()


def _train_args(tmp_path, *extra):
    return ["tools/train.py", "model=db_det_tiny", "data=icdar2015", f"data.root={tmp_path / 'data'}",
            "data.builder.train_label=train.txt", "data.builder.val_label=val.txt", "model.batch_size=2",
            "model.eval_batch_size=2", "data.builder.crop_size=64", "data.builder.eval_size=[64,96]",
            "trainer.progress=false", f"hydra.run.dir={tmp_path / 'run'}", *extra]


def _one_error_line(out) -> str:
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    return errors[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["missing", "truncated"])
def test_bad_image_met_by_the_check_before_training_is_one_error_line(tmp_path, case):
    """The default check (verify_images=true) meets a missing or truncated image at line 6 of the
    label file: one ``error:`` line naming file and line, exit 2, no traceback (it was an OSError
    the tools did not count as bad input: a traceback and exit 1), and no empty run folder left."""
    from conftest import ROOT, run_tool

    _text_root(tmp_path / "data")
    bad = "img/missing.jpg" if case == "missing" else "img/cut.jpg"
    lines = [f"img/good.jpg\t{GOOD}"] * 5 + [f"{bad}\t{GOOD}"]
    (tmp_path / "data" / "train.txt").write_text("\n".join(lines) + "\n")
    out = run_tool(_train_args(tmp_path, "trainer.max_steps=2"), ROOT, timeout=100)
    error = _one_error_line(out)
    reason = "image file not found" if case == "missing" else "JPEG file is truncated"
    assert error.startswith(f"error: {tmp_path / 'data' / 'train.txt'}:6: image is missing or cannot be "
                            f"decoded: ") and reason in error and bad in error, error
    assert not (tmp_path / "run").exists()  # nothing trained: the start-up folder is removed


@pytest.mark.timeout(150)
def test_bad_image_met_by_the_final_evaluation_keeps_the_trained_steps(tmp_path):
    """A validation image that fails in the evaluation after the last step: the documented line
    (exit 2) with the checkpoint of that step, which resumes once the file is fixed (before, the
    steps were lost: no checkpoint had been written yet)."""
    import json

    from conftest import ROOT, run_tool

    _text_root(tmp_path / "data")
    (tmp_path / "data" / "train.txt").write_text(f"img/good.jpg\t{GOOD}\n" * 8)  # val.txt:4 is cut.jpg
    args = _train_args(tmp_path, "data.builder.verify_images=false", "trainer.max_steps=3",
                       "trainer.eval_precision=train", "trainer.bootstrap_resamples=0")
    error = _one_error_line(run_tool(args, ROOT, timeout=100))
    assert error.startswith("error: data loading failed: ") and f"{tmp_path / 'data' / 'val.txt'}:4" in error
    assert "truncated" in error and "(sample key 3)" in error
    assert error.endswith(f"checkpoint of step 3 saved to {tmp_path / 'run' / 'checkpoints' / 'last.pdckpt'}, "
                          "resume with trainer.resume=auto once the file is fixed")
    _jpeg(tmp_path / "data" / "img" / "cut.jpg")  # fixed
    out = run_tool([*args, "trainer.resume=auto"], ROOT, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["resumed_from"].endswith("last.pdckpt")


@pytest.mark.timeout(90)
def test_loader_workers_die_with_a_killed_run(tmp_path):
    """kill -9 of the training process must not leave its loader workers running."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    script = f"""
import os, sys, time
sys.path.insert(0, {str(ROOT)!r})
import numpy as np
from zoo.data import TrainBatchSampler, build_loader
calls = []
class Slow:
    def __len__(self): return 64
    def __getitem__(self, key):
        open(os.path.join({str(tmp_path)!r}, f"worker{{os.getpid()}}"), "w").close()
        calls.append(key)  # per worker process: its first batch is quick, then a sample takes a minute
        time.sleep(0.05 if len(calls) <= 2 else 60)  # (a huge file, a stuck network file system)
        return {{"x": np.zeros(2, np.float32)}}
it = iter(build_loader(Slow(), TrainBatchSampler(64, 2, seed=0), 2))
next(it)
print("running", flush=True)
time.sleep(120)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    try:
        assert proc.stdout.readline().strip() == "running"
        workers = [int(p.name[len("worker"):]) for p in tmp_path.glob("worker*")]
        assert len(workers) == 2 and proc.pid not in workers
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 10
        alive = workers
        while alive and time.time() < deadline:
            time.sleep(0.2)
            alive = [w for w in workers if os.path.exists(f"/proc/{w}") and
                     "zombie" not in open(f"/proc/{w}/status").read().lower()]
        assert not alive, f"loader workers {alive} outlived their killed parent"
    finally:
        proc.kill()


@pytest.mark.timeout(90)
def test_ctrl_c_to_the_process_group_leaves_the_workers_to_the_main_process(tmp_path):
    """Ctrl-C reaches loader workers too; they must not die of it while the main process, waiting
    for a batch, still needs one to finish its step (it would get "Blocking queue is killed").
    Paddle's workers install their own signal handling; this pins that the combination holds."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    script = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
import numpy as np
from zoo.data import TrainBatchSampler, build_loader
from zoo.engine.signals import StopRequests
class Slow:
    def __len__(self): return 64
    def __getitem__(self, key):
        time.sleep(0.4)
        return {{"x": np.zeros(2, np.float32)}}
with StopRequests() as stop:
    for i, batch in enumerate(build_loader(Slow(), TrainBatchSampler(64, 2, seed=0), 2)):
        print("batch", i, flush=True)
        if stop.signum is not None:
            print("stopped cleanly", flush=True)
            break
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    try:
        assert proc.stdout.readline().startswith("batch")
        time.sleep(0.3)  # the main process now waits for the next batch
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "stopped cleanly" in out and proc.returncode == 0, err[-2000:]


@pytest.mark.timeout(60)
def test_sample_with_a_field_paddle_cannot_convert_is_named_not_a_hang():
    class Texts:
        def __len__(self):
            return 4

        def __getitem__(self, key):
            return {"image": np.zeros(2, np.float32), "text": np.array(["abc"])}

    with pytest.raises(SampleLoadError, match="field 'text' has dtype <U3"):
        next(iter(build_loader(Texts(), EvalBatchSampler(4, 2))))
