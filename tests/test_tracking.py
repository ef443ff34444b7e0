"""Experiment tracking (issue 38), read back through the tools' own readers: MLflow's client for
params, metrics at their steps, tags, artifacts and a sweep's parent/child runs; TensorBoard's event
accumulator for the event files. A logger that cannot start is one error line before training; one
that fails mid-run costs nothing of the run; a resume continues the same runs, no step twice."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, TINY, compose, run_tool

from zoo.engine.metrics_log import read_metrics
from zoo.engine.provenance import config_digest
from zoo.tracking import LoggerStartError, Tracker

mlflow = pytest.importorskip("mlflow", reason="the tracking extra is not installed (pip install -e '.[tracking]')")
pytest.importorskip("tensorboardX", reason="the tracking extra is not installed (pip install -e '.[tracking]')")
from mlflow.tracking import MlflowClient  # noqa: E402


def accumulator(folder, purge=True):
    """TensorBoard's own reader of a folder's event files (``purge``: its rule for steps a restarted
    writer logged again; off, every event on disk counts)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0, "tensors": 0},
                           purge_orphaned_data=purge)
    acc.Reload()
    return acc


def scalars(folder, tag, purge=False) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in accumulator(folder, purge).Scalars(tag)]


def history(client, run_id, key) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store for the module's runs (a new store builds its schema: seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def loggers(store, which="[mlflow,tensorboard]"):
    return [f"logger={which}", f"logger.mlflow.tracking_uri={store}"]


def train(tiny_cfg, out, *overrides, context=None):
    from zoo.engine.run import train as run_train

    return run_train(tiny_cfg(*overrides), out, announce_folder=False, tracking_context=context)


def mlflow_ids(run_dir) -> dict:
    return json.loads((Path(run_dir) / "tracking.json").read_text())["mlflow"]


# ---- the config group ------------------------------------------------------------------------------
def test_no_logger_by_default_and_several_at_once():
    assert "logger" not in compose(TINY)  # nothing changes for a run that does not ask
    assert "logger" not in compose(TINY + ["logger=[]"])
    assert set(compose(TINY + ["logger=[mlflow,tensorboard]"]).logger) == {"mlflow", "tensorboard"}
    assert set(compose(TINY + ["logger=mlflow"]).logger) == {"mlflow"}
    assert not compose(TINY + ["logger=none"]).get("logger")
    assert not Tracker.from_config(compose(TINY + ["logger=none"]).get("logger"))
    # where a run is tracked is not what it trains: the report still compares it with untracked runs
    assert config_digest(compose(TINY + ["logger=[mlflow,wandb]"])) == config_digest(compose(TINY))


def test_the_recipe_and_the_sweep_come_from_hydras_runtime_config():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from conftest import CONFIG_DIR
    from zoo.tracking.context import SWEEP_ENV, hydra_context

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        runtime = hydra_compose("train", ["model=resnet50", "amp=O1"], return_hydra_config=True).hydra
    context = hydra_context(runtime, environ={})
    assert context["sweep_dir"] is None  # a single run
    tags = context["tags"]
    assert tags["recipe"] == "resnet/O1" and tags["model_recipe"] == "none"
    assert tags["recipe.amp.init_loss_scaling"] == 128.0 and tags["recipe.model.batch_size"] == 256
    # a job of tools/sweep.py: a single Hydra run, told its sweep by the runner
    assert hydra_context(runtime, environ={SWEEP_ENV: "/data/sweeps/a"})["sweep_dir"] == "/data/sweeps/a"


def test_only_rank_0_tracks(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # even a logger that could not start is not checked
    assert not Tracker.from_config({"mlflow": {}}, enabled=False)


# ---- one run ---------------------------------------------------------------------------------------
def test_a_run_reads_back_through_mlflow_and_tensorboard(tiny_cfg, tmp_path, store):
    out = tmp_path / "run"
    summary = train(tiny_cfg, out, "amp=O1", *loggers(store))
    lines = read_metrics(out / "metrics.jsonl", "train")
    client = MlflowClient(store)
    run = client.get_run(mlflow_ids(out)["run_id"])
    rid = run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == "resnet_tiny_synthetic_shapes_O1_seed0"
    assert client.get_experiment(run.info.experiment_id).name == "resnet_tiny_synthetic_shapes"
    # params: the composed config, flattened (the logger's own settings left out)
    params = run.data.params
    assert params["trainer.max_steps"] == "4" and params["amp.name"] == "O1" and params["model.name"] == "resnet_tiny"
    assert params["amp.init_loss_scaling"] == "65536.0" and not any(k.startswith("logger") for k in params)
    # tags: the precision asked for and the one that ran
    tags = run.data.tags
    assert tags["requested_precision"] == "fp16-O1"
    assert tags["effective_precision"] == summary["effective_precision"] == "emulated-fp16-O1"
    assert tags["device"] == "cpu" and tags["status"] == "completed"
    # metrics at their steps, as metrics.jsonl has them
    assert history(client, rid, "train/loss") == [(r["step"], pytest.approx(r["loss"])) for r in lines]
    assert history(client, rid, "train/loss_scale") == [(r["step"], r["loss_scale"]) for r in lines]
    assert [s for s, _ in history(client, rid, "train/lr")] == [1, 2, 3, 4]
    assert [s for s, _ in history(client, rid, "train/images_per_s")] == [1, 2, 3, 4]
    assert history(client, rid, "train/skipped_steps") == [(s, 0.0) for s in (1, 2, 3, 4)]
    assert history(client, rid, "eval/top1") == [(4, pytest.approx(summary["metrics"]["top1"]))]
    assert run.data.metrics["final/top1"] == pytest.approx(summary["primary_metric"]["value"])
    # artifacts: the run's files, as written
    names = {a.path for a in client.list_artifacts(rid)}
    assert {"config.yaml", "summary.json", "metrics.jsonl"} <= names
    got = Path(client.download_artifacts(rid, "summary.json", str(tmp_path)))
    assert json.loads(got.read_text()) == json.loads((out / "summary.json").read_text())
    # TensorBoard: the same scalars, beside metrics.jsonl
    assert len(list(out.glob("events.out.tfevents.*"))) == 1
    assert scalars(out, "train/loss") == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in lines]
    assert scalars(out, "train/loss_scale") == [(r["step"], r["loss_scale"]) for r in lines]
    text = accumulator(out).Tensors("run/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| effective_precision | emulated-fp16-O1 |" in text


def test_wandb_offline_run_in_the_run_folder(tiny_cfg, tmp_path):
    pytest.importorskip("wandb", reason="W&B is optional (pip install -e '.[wandb]')")
    out = tmp_path / "run"
    train(tiny_cfg, out, "logger=[wandb]", "logger.wandb.mode=offline")
    run_id = json.loads((out / "tracking.json").read_text())["wandb"]["id"]
    (folder,) = (out / "wandb").glob(f"offline-run-*-{run_id}")
    assert (folder / f"run-{run_id}.wandb").stat().st_size > 0
    assert not (folder / "files" / "summary.json").exists()  # the run's files go in an artifact, not W&B's files


def test_drawings_become_tensorboard_images(tmp_path):
    from PIL import Image

    from zoo.tracking.tensorboard_backend import TensorBoardBackend
    from zoo.tracking.base import RunInfo

    backend = TensorBoardBackend()
    backend.check()
    backend.start(RunInfo(out_dir=tmp_path, run_name="r", experiment="m_d"), {}, {"effective_precision": "fp32"})
    backend.log_metrics(7, {"train/loss": 1.5})
    Image.new("RGB", (32, 24), (200, 30, 30)).save(tmp_path / "step7_fp32_0.png")
    backend.log_artifact(tmp_path / "step7_fp32_0.png", "drawings")
    backend.finish("FINISHED")
    images = accumulator(tmp_path).Images("drawings/step7_fp32_0")
    assert [(i.step, i.width, i.height) for i in images] == [(7, 32, 24)]


# ---- resume ----------------------------------------------------------------------------------------
def test_resume_continues_the_same_runs_and_logs_no_step_twice(tiny_cfg, tmp_path, store):
    out = tmp_path / "run"
    train(tiny_cfg, out, "trainer.max_steps=2", *loggers(store))
    run_id = mlflow_ids(out)["run_id"]
    step2 = (out / "checkpoints" / "last.pdckpt").read_bytes()
    train(tiny_cfg, out, "trainer.max_steps=4", "trainer.resume=auto", *loggers(store))
    # killed after step 4 was logged, before its checkpoint: the step-2 checkpoint is the last whole one
    (out / "checkpoints" / "last.pdckpt").write_bytes(step2)
    (out / "summary.json").unlink()
    train(tiny_cfg, out, "trainer.max_steps=4", "trainer.resume=auto", *loggers(store))
    lines = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    client = MlflowClient(store)
    assert mlflow_ids(out)["run_id"] == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert history(client, run_id, "train/loss") == [(r["step"], pytest.approx(r["loss"], rel=1e-5)) for r in lines]
    assert [s for s, _ in history(client, run_id, "eval/top1")] == [2, 4]
    assert [s for s, _ in history(client, run_id, "final/top1")] == [2, 4]
    # the event files hold each step once, even for a reader that keeps every event on disk
    assert scalars(out, "train/loss", purge=False) == [(r["step"], pytest.approx(r["loss"], rel=1e-5)) for r in lines]
    assert [s for s, _ in scalars(out, "eval/top1", purge=False)] == [2, 4]
    # resumed into another folder: the same MLflow run; that folder's event files hold the whole curve
    other = tmp_path / "run2"
    train(tiny_cfg, other, "trainer.max_steps=6", f"trainer.resume={out}", *loggers(store))
    assert mlflow_ids(other)["run_id"] == run_id
    lines = read_metrics(other / "metrics.jsonl", "train")
    assert [s for s, _ in history(client, run_id, "train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in scalars(other, "train/loss", purge=False)] == [r["step"] for r in lines] == [1, 2, 3, 4, 5, 6]


# ---- a logger that cannot start, or fails ------------------------------------------------------------
def test_missing_mlflow_is_one_error_line_before_training(tmp_path, ampzoo_home):
    fake = tmp_path / "site" / "mlflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named mlflow (simulated)')\n")
    out = run_tool([str(ROOT / "tools" / "train.py"), *TINY, "logger=[tensorboard,mlflow]",
                    f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                   {"PYTHONPATH": str(tmp_path / "site"), "AMPZOO_HOME": str(ampzoo_home)}, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: logger=mlflow: the mlflow package is missing"), errors
    assert 'pip install -e ".[tracking]"' in errors[0] and "without logger=mlflow" in errors[0]
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()  # nothing trained, no empty run folder left


def test_a_store_that_cannot_be_written_or_reached_fails_before_training(tiny_cfg, tmp_path):
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "run"
    with pytest.raises(LoggerStartError, match=r"^logger=mlflow: cannot create the store's folder .*a_file"):
        train(tiny_cfg, out, "logger=mlflow", f"logger.mlflow.tracking_uri=sqlite:///{tmp_path}/a_file/x/mlflow.db")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LoggerStartError, match=rf"^logger=mlflow: no MLflow server answers at http://127.0.0.1:{port}"):
        train(tiny_cfg, out, "logger=mlflow", f"logger.mlflow.tracking_uri=http://127.0.0.1:{port}")
    with pytest.raises(LoggerStartError, match=r"^logger.mlflow.tracking_uri: .* is a folder"):
        train(tiny_cfg, out, "logger=mlflow", f"logger.mlflow.tracking_uri={tmp_path}/mlruns")
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def test_a_logger_failing_mid_run_warns_once_and_the_run_goes_on(tiny_cfg, tmp_path, store, monkeypatch, capsys):
    from zoo.tracking.mlflow_backend import MLflowBackend

    real = MLflowBackend.log_metrics

    def flaky(self, step, metrics, wall_time=None):
        if step >= 2:
            raise ConnectionError("the tracking server went away")
        real(self, step, metrics, wall_time)

    monkeypatch.setattr(MLflowBackend, "log_metrics", flaky)
    out = tmp_path / "run"
    summary = train(tiny_cfg, out, *loggers(store))
    said = [line for line in capsys.readouterr().err.splitlines() if "logger=mlflow failed" in line]
    assert len(said) == 1 and "ConnectionError: the tracking server went away" in said[0], said
    assert summary["status"] == "completed" and (out / "checkpoints" / "last.pdckpt").is_file()
    lines = read_metrics(out / "metrics.jsonl", "train")
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert [s for s, _ in scalars(out, "train/loss")] == [1, 2, 3, 4]  # the other logger went on
    client, run_id = MlflowClient(store), mlflow_ids(out)["run_id"]
    assert [s for s, _ in history(client, run_id, "train/loss")] == [1]
    assert client.get_run(run_id).info.status == "FAILED"
    # resuming logs what the store missed
    monkeypatch.setattr(MLflowBackend, "log_metrics", real)
    train(tiny_cfg, out, "trainer.resume=auto", *loggers(store))
    assert history(client, run_id, "train/loss") == [(r["step"], pytest.approx(r["loss"])) for r in lines]
    assert client.get_run(run_id).info.status == "FINISHED"


# ---- sweeps ----------------------------------------------------------------------------------------
def children(client, parent: dict) -> list:
    return client.search_runs([parent["experiment_id"]], f"tags.`mlflow.parentRunId` = '{parent['run_id']}'")


@pytest.fixture(scope="module")
def tracked_sweep(tmp_path_factory, store, ampzoo_home):
    """A 2-job Hydra sweep (fp32, O1) tracked in MLflow, and tools/report.py run on it."""
    root = tmp_path_factory.mktemp("tracked_sweep")
    sweep = root / "sweep"
    env = {"AMPZOO_HOME": str(ampzoo_home)}
    out = run_tool([str(ROOT / "tools" / "train.py"), "-m", *TINY, "amp=fp32,O1", *loggers(store, "[mlflow]"),
                    f"hydra.sweep.dir={sweep}"], root, env)
    assert out.returncode == 0, out.stderr[-3000:]
    report = run_tool([str(ROOT / "tools" / "report.py"), str(sweep)], root, env)
    assert report.returncode in (0, 1), report.stderr[-3000:]
    assert "report logged to the sweep's MLflow run" in report.stderr
    return sweep


@pytest.mark.slow
def test_a_sweep_is_a_parent_run_with_its_jobs_and_the_report_goes_to_it(tracked_sweep, store):
    sweep = tracked_sweep
    parents = json.loads((sweep / "mlflow_parent.json").read_text())["runs"]
    assert len(parents) == 1
    client = MlflowClient(store)
    parent = client.get_run(parents[0]["run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["sweep_dir"] == str(sweep.resolve())
    kids = children(client, parents[0])
    assert sorted(k.data.tags["effective_precision"] for k in kids) == ["emulated-fp16-O1", "fp32"]
    assert all(k.info.status == "FINISHED" and [s for s, _ in history(client, k.info.run_id, "train/loss")]
               == [1, 2, 3, 4] for k in kids)
    # the report's verdict, differences and files on the parent run
    report = json.loads((sweep / "report" / "report.json").read_text())
    assert parent.data.tags["report.verdict"] == ("all equivalent" if report["all_equivalent"] else "not all equivalent")
    side = report["groups"][0]["amp"][0]
    (diff,) = [v for k, v in parent.data.metrics.items() if k.startswith("report/") and k.endswith("/diff")]
    assert diff == pytest.approx(side["diff"])
    files = {Path(a.path).name for a in client.list_artifacts(parents[0]["run_id"], "report")}
    assert {"report.md", "report.json", "index.html"} <= files and any(f.endswith(".png") for f in files)


def chromium() -> str:
    from browser import find_chromium

    found = find_chromium()
    if found is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run installs it where it can)")
    return found


# the curve of the run page's train/loss chart: plotly's path in the chart's card
LOSS_CURVE = """(() => { let card = document.querySelector('h4[title="train/loss"]');
  while (card && !card.querySelector('path.js-line')) card = card.parentElement;
  return card ? card.querySelector('path.js-line').getAttribute('d') : null; })()"""


@pytest.mark.slow
def test_the_mlflow_ui_and_the_report_page_show_the_sweep_in_a_browser(tracked_sweep, store, tmp_path):
    from browser import Browser

    browser = Browser(chromium(), tmp_path / "profile")
    ui = None
    try:
        # the zoo's own report page: its table, and every plot decoded by the browser
        assert browser.open((tracked_sweep / "report" / "index.html").as_uri(), "document.readyState === 'complete'")
        assert browser.evaluate("document.querySelectorAll('table tr').length") >= 2
        assert "verdict" in browser.evaluate("document.querySelector('table').innerText")
        widths = browser.evaluate("[...document.images].map(i => i.complete ? i.naturalWidth : 0)")
        assert widths and min(widths) > 100, widths
        # `mlflow ui` on the store: a child run's page draws its loss curve, one point per logged step
        client = MlflowClient(store)
        parent = json.loads((tracked_sweep / "mlflow_parent.json").read_text())["runs"][0]
        kid = children(client, parent)[0]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ui = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store, "--host",
                               "127.0.0.1", "--port", str(port), "--workers", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).close()
                break
            except OSError:
                assert time.time() < deadline and ui.poll() is None, "mlflow ui did not start"
                time.sleep(1)
        url = f"http://127.0.0.1:{port}/#/experiments/{parent['experiment_id']}/runs/{kid.info.run_id}/model-metrics"
        assert browser.open(url, f"{LOSS_CURVE} !== null"), "the run's page shows no train/loss chart"
        assert kid.info.run_name in browser.evaluate("document.body.innerText")
        curve = browser.evaluate(LOSS_CURVE)
        assert curve.count("L") + 1 == 4, curve  # M x,y L x,y ...: the 4 logged steps
    finally:
        browser.close()
        if ui is not None:
            os.killpg(ui.pid, signal.SIGTERM)
            ui.wait(timeout=60)


def test_a_completed_sweep_may_be_continued_with_a_logger(tmp_path):
    """tools/sweep.py skips a completed job only if it ran the same overrides; a logger is not one."""
    import io

    from zoo.engine.sweep import run_sweep

    job = tmp_path / "sweep" / "seed=0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("- model=resnet_tiny\n- seed=0\n- trainer.progress=false\n")
    (job / "summary.json").write_text(json.dumps({"status": "completed"}))
    said = io.StringIO()
    assert run_sweep(ROOT / "tools" / "train.py", ["model=resnet_tiny", "seed=0,1", "logger=[mlflow]"],
                     tmp_path / "sweep", dry_run=True, out=said) == 0
    assert "seed=0: already completed" in said.getvalue()


@pytest.mark.slow
def test_jobs_of_tools_sweep_side_by_side_share_one_parent(tmp_path, store, ampzoo_home):
    sweep = tmp_path / "sweep"
    out = run_tool([str(ROOT / "tools" / "sweep.py"), "--jobs", "2", "--dir", str(sweep), "--", *TINY,
                    "seed=0,1", *loggers(store, "[mlflow]")], tmp_path, {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 0, out.stdout[-3000:]
    parents = json.loads((sweep / "mlflow_parent.json").read_text())["runs"]
    assert len(parents) == 1
    client = MlflowClient(store)
    assert sorted(k.data.params["seed"] for k in children(client, parents[0])) == ["0", "1"]
    assert client.get_run(parents[0]["run_id"]).info.status == "FINISHED"


@pytest.mark.slow
def test_two_ranks_log_one_run_from_rank_0(tmp_path, ampzoo_home):
    from conftest import launch_failure

    args = ["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
            str(ROOT / "tools" / "train.py"), *TINY, "model.batch_size=8", "logger=[mlflow,tensorboard]"]
    out = run_tool(args, tmp_path, {"AMPZOO_HOME": str(ampzoo_home)})
    assert out.returncode == 0, launch_failure(out, tmp_path / "log")
    (run,) = list((tmp_path / "outputs").glob("resnet_tiny_*/*"))
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")  # the default store
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.run_id for r in runs] == [mlflow_ids(run)["run_id"]]
    assert [s for s, _ in history(client, runs[0].info.run_id, "train/loss")] == [1, 2, 3, 4]
