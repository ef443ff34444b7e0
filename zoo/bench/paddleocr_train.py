"""Training throughput against PaddleOCR's own ``tools/train.py`` (``tools/benchmark.py --train-against``).

Both sides train DB (det_mv3_db, or with ``model=ppocrv5_mobile_det`` among the overrides PP-OCRv5
mobile det against ``configs/det/PP-OCRv5/PP-OCRv5_mobile_det.yml``: :data:`UPSTREAM_CONFIGS`) from scratch for ``steps`` steps on the same images: the zoo's
``synthetic_text`` set generated with ``num_train = steps * batch`` (image ``i`` depends only on the
seed and ``i``, so these are the first images of the default 2000), its ``train_label.txt`` already
in PaddleOCR's ``path\\t[{"transcription", "points"}]`` format. PaddleOCR gets a SimpleDataSet over
those files (its own label copy, ``data_dir`` the zoo's generated folder) and a config derived from
its ``configs/det/det_mv3_db.yml`` (:func:`write_paddleocr_config`): the zoo's crop and batch,
Adam 1e-3 constant (upstream's), no pretrained backbone, no evaluation during the run, one epoch
over ``steps * batch`` images (PaddleOCR counts epochs; one epoch is exactly ``steps`` iterations
with ``drop_last`` false), ``num_workers`` 0, ``use_gpu`` false, a log line per step. For PP-OCRv5
the optimizer stays upstream's (Adam, cosine 1e-3 with warm-up, L2 5e-5, as the zoo's config) and
the zoo side gets ``model.net.pretrained=null``: both start from scratch. Both sides' parameter
counts are printed (PaddleOCR's from the model its ``tools/train.py`` built, reported by the
launcher) and must be equal.

The two commands run alternately (zoo, PaddleOCR, zoo, PaddleOCR, ...) as separate processes, each
with ``OMP_NUM_THREADS=1`` unless already set. Training img/s is measured the same way on both
sides, from each side's own per-step timer: the time of one step is from asking the loader for
the batch to the end of the optimizer step (zoo: ``images_per_s`` of each ``metrics.jsonl`` line
with ``trainer.log_every=1``; PaddleOCR: ``avg_batch_cost`` of each log line with
``print_batch_step: 1``, which starts its clock before the loader too); img/s is
``(steps - warmup) * batch`` over the sum of those step times after the first ``warmup`` steps.
Start-up (imports, model build, data checks) and the checkpoint saved after the last step are
outside it; the whole command's wall time is reported separately. The ratio is of medians,
zoo img/s over PaddleOCR img/s (>= 1.0: the zoo is at least as fast).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from zoo.engine.metrics_log import read_metrics
from zoo.engine.run import build_data

__all__ = ["LAUNCHER", "UPSTREAM_CONFIGS", "compose_zoo", "launcher_report", "parse_paddleocr_log",
           "paddleocr_version_check", "run", "split_model", "write_paddleocr_config", "write_simple_dataset",
           "zoo_step_times", "zoo_command"]

LAUNCHER = Path(__file__).with_name("_paddleocr_train_launcher.py")
ROOT = Path(__file__).resolve().parents[2]  # where the zoo package is importable from (PYTHONPATH, cwd)
# The zoo model -> PaddleOCR's config it is compared with.
UPSTREAM_CONFIGS = {"db_det": Path("configs") / "det" / "det_mv3_db.yml",
                    "ppocrv5_mobile_det": Path("configs") / "det" / "PP-OCRv5" / "PP-OCRv5_mobile_det.yml"}
UPSTREAM_CONFIG = UPSTREAM_CONFIGS["db_det"]
# Zoo-side overrides that make both sides start alike (PaddleOCR's side: pretrained_model null).
_ZOO_START = {"db_det": [], "ppocrv5_mobile_det": ["model.net.pretrained=null"]}
_STEP_LINE = re.compile(r"global_step: (\d+),.*?avg_batch_cost: ([0-9.]+) s")
_PARSE_ERROR = "When parsing line"


def write_simple_dataset(src_root: Path, train_label: Path, val_label: Path, out_dir: Path, n: int) -> dict:
    """PaddleOCR SimpleDataSet label files over the zoo's images: the first ``n`` train lines
    (``out_dir/train_label.txt``) and one val line (``out_dir/val_label.txt``), each checked to be
    ``relative/path\\t[{"transcription": str, "points": [[x, y] x4]}, ...]`` with the image under
    ``src_root``. Returns the paths and counts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, label, count in (("train", train_label, n), ("val", val_label, 1)):
        lines = [ln for ln in Path(label).read_text(encoding="utf-8").splitlines() if ln.strip()][:count]
        if len(lines) < count:
            raise ValueError(f"{label} has {len(lines)} lines, need {count}")
        for ln in lines:
            rel, sep, js = ln.partition("\t")
            boxes = json.loads(js) if sep else None
            if (not sep or not isinstance(boxes, list) or not (Path(src_root) / rel).is_file()
                    or any(set(b) != {"transcription", "points"} or len(b["points"]) != 4 for b in boxes)):
                raise ValueError(f"{label}: not a PaddleOCR detection label line: {ln[:120]!r}")
        path = out_dir / f"{name}_label.txt"
        path.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
        written[name] = path
        written[f"num_{name}"] = len(lines)
    written["data_dir"] = Path(src_root).resolve()
    return written


def split_model(overrides: list[str]) -> tuple[str, list[str]]:
    """The compared model (the last ``model=`` override, default db_det) and the other overrides."""
    models = [o.split("=", 1)[1] for o in overrides if o.startswith("model=")]
    model = models[-1] if models else "db_det"
    if model not in UPSTREAM_CONFIGS:
        raise ValueError(f"--train-against paddleocr compares {', '.join(UPSTREAM_CONFIGS)}, got model={model}")
    return model, [o for o in overrides if not o.startswith("model=")]


def write_paddleocr_config(source: Path, out: Path, data: dict, crop: int, batch: int, steps: int,
                           seed: int, save_dir: Path, model: str = "db_det") -> dict:
    """Write PaddleOCR's config for ``model`` (:data:`UPSTREAM_CONFIGS`) with the benchmark's settings
    to ``out``; returns the config."""
    import yaml

    cfg = yaml.safe_load((Path(source) / UPSTREAM_CONFIGS[model]).read_text(encoding="utf-8"))
    g = cfg["Global"]
    g.update(use_gpu=False, epoch_num=1, print_batch_step=1, seed=int(seed),
             eval_batch_step=[steps + 1, 10 ** 9],  # first evaluation after the run's last step: never
             save_epoch_step=10 ** 9,  # no per-epoch copy (its "latest" is saved after the epoch anyway)
             save_model_dir=str(save_dir), pretrained_model=None, checkpoints=None,
             cal_metric_during_train=False, use_visualdl=False)
    opt = cfg["Optimizer"]
    if model == "db_det":
        assert opt["name"] == "Adam" and "name" not in opt["lr"], opt  # upstream's: Adam, constant LR
        opt["lr"]["learning_rate"] = 1e-3
    else:  # upstream's kept: Adam, cosine 1e-3 with warm-up, L2 5e-5 (the zoo's config has the same)
        assert opt["name"] == "Adam" and opt["lr"].get("name") == "Cosine" and opt["lr"]["learning_rate"] == 1e-3, opt
    for mode, labels in (("Train", data["train"]), ("Eval", data["val"])):
        ds, loader = cfg[mode]["dataset"], cfg[mode]["loader"]
        ds.update(data_dir=str(data["data_dir"]), label_file_list=[str(labels)])
        if mode == "Train":
            ds["ratio_list"] = [1.0]
            loader.update(batch_size_per_card=int(batch), drop_last=False, shuffle=True)
            crops = [t for t in ds["transforms"] if "EastRandomCropData" in t]
            assert len(crops) == 1, ds["transforms"]
            crops[0]["EastRandomCropData"]["size"] = [int(crop), int(crop)]
        loader.update(num_workers=0, use_shared_memory=False)
    out.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return cfg


def parse_paddleocr_log(text: str) -> dict:
    """Per-step seconds (``{global_step: avg_batch_cost}``) from PaddleOCR's train log with
    ``print_batch_step: 1``, and how many samples its dataset failed on (it silently draws another)."""
    steps = {int(m.group(1)): float(m.group(2)) for m in _STEP_LINE.finditer(text)}
    return {"step_s": steps, "dataset_errors": text.count(_PARSE_ERROR)}


def zoo_step_times(metrics_file: Path, batch: int) -> dict:
    """Per-step seconds from the zoo's metrics.jsonl written with ``trainer.log_every=1``."""
    return {int(r["step"]): batch / r["images_per_s"] for r in read_metrics(metrics_file, "train")}


def images_per_s(step_s: dict, steps: int, warmup: int, batch: int) -> float:
    """Images/s over steps ``warmup+1 .. steps`` (all must be present)."""
    missing = [k for k in range(warmup + 1, steps + 1) if k not in step_s]
    if missing:
        raise RuntimeError(f"no step time for steps {missing} (got {sorted(step_s)})")
    return (steps - warmup) * batch / sum(step_s[k] for k in range(warmup + 1, steps + 1))


def zoo_command(train: Path, overrides: list[str], steps: int, num_train: int, run_dir: Path,
                model: str = "db_det") -> list[str]:
    """The zoo's side: ``<train> model=db_det amp=fp32 trainer.final_eval=false ...``, ``train`` being
    tools/train.py (tools/benchmark.py names it: this package does not reach into tools/ by path).
    ``overrides`` without ``model=`` (:func:`split_model`)."""
    return [sys.executable, str(train), f"model={model}", "amp=fp32",
            "trainer.final_eval=false", f"trainer.max_steps={steps}", "trainer.log_every=1",
            "trainer.progress=false", f"data.builder.num_train={num_train}", "data.builder.num_val=1",
            *_ZOO_START[model], *overrides, f"hydra.run.dir={run_dir}"]


def launcher_report(stderr: str, key: str = "AMPZOO_PADDLE") -> dict:
    """A JSON line ``KEY {...}`` the launcher wrote to stderr (``AMPZOO_PADDLE``: the Paddle it ran;
    ``AMPZOO_PARAMS``: the parameter count of the model PaddleOCR built)."""
    for line in stderr.splitlines():
        if line.startswith(key + " "):
            return json.loads(line.split(" ", 1)[1])
    return {}


def paddleocr_version_check(stderr: str) -> dict:
    """The Paddle the PaddleOCR side ran (the launcher's ``AMPZOO_PADDLE`` line)."""
    return launcher_report(stderr, "AMPZOO_PADDLE")


def zoo_parameter_count(cfg) -> dict:
    """Parameters of the network the zoo's command builds (its composed ``model.net``)."""
    from hydra.utils import instantiate

    params = instantiate(cfg.model.net).parameters()
    return {"parameters": int(sum(int(np.prod(p.shape)) for p in params)),
            "trainable": int(sum(int(np.prod(p.shape)) for p in params if not p.stop_gradient))}


def _env() -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run(cmd: list[str], cwd: Path, log: Path) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    log.write_text(f"$ {' '.join(cmd)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}", encoding="utf-8")
    if proc.returncode != 0:
        raise RuntimeError(f"exit status {proc.returncode}: {' '.join(cmd[:3])} ...; log: {log}\n"
                           f"{proc.stderr.strip()[-1500:]}")
    return wall, proc


def compose_zoo(config_dir: str, overrides: list[str], steps: int):
    """The zoo side's config as its command composes it (two passes: the batch size sets num_train)."""
    from hydra import compose, initialize_config_dir

    model, rest = split_model(overrides)
    with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        first = compose(config_name="train",
                        overrides=zoo_command(Path("train.py"), rest, steps, 1, Path("x"), model)[2:-1])
        n = steps * int(first.model.batch_size)
        return compose(config_name="train",
                       overrides=zoo_command(Path("train.py"), rest, steps, n, Path("x"), model)[2:-1])


def run(config_dir: str, train: Path, source: Path, python: str, work: Path, overrides: list[str], steps: int, warmup: int,
        repeats: int) -> dict:
    """Prepare both sides, alternate them ``repeats`` times each, print and return the figures.
    ``overrides`` go to the zoo's command (after its own, so they win) and, through the composed
    config (crop, batch, seed), into PaddleOCR's."""
    import paddle


    model, rest = split_model(overrides)
    cfg = compose_zoo(config_dir, overrides, steps)
    upstream = UPSTREAM_CONFIGS[model]

    source = Path(source).expanduser().resolve()
    if not (source / "tools" / "train.py").is_file() or not (source / upstream).is_file():
        raise FileNotFoundError(f"{source} is not a PaddleOCR source tree (no tools/train.py or {upstream})")
    if cfg.model.name != model or cfg.data.name != "synthetic_text":
        raise ValueError(f"--train-against paddleocr compares {model} on synthetic_text, got model={cfg.model.name} "
                         f"data={cfg.data.name}")
    if not 0 <= warmup < steps:
        raise ValueError(f"need 0 <= warmup < steps, got warmup {warmup}, steps {steps}")
    batch, crop, n = int(cfg.model.batch_size), int(cfg.data.builder.crop_size), steps * int(cfg.model.batch_size)
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    train_set, val_set, _ = build_data(cfg)  # generates the images (outside any timing)
    data = write_simple_dataset(train_set.root, train_set.label_file, val_set.label_file, work / "paddleocr_data", n)
    save_dir = work / "paddleocr_output"
    pcfg = work / f"{upstream.stem}_bench.yml"
    write_paddleocr_config(source, pcfg, data, crop, batch, steps, cfg.seed, save_dir, model)
    commands = {"zoo": zoo_command(train, rest, steps, n, work / "zoo_run", model),
                "paddleocr": [python, str(LAUNCHER), str(source), str(pcfg)]}
    env = _env()
    zoo_params = zoo_parameter_count(cfg)
    print(f"{model} fp32 training against PaddleOCR's {upstream.as_posix()}, {steps} steps of batch {batch} "
          f"({crop} px crops), {n} synthetic_text images, "
          f"img/s over steps {warmup + 1}-{steps}; OMP_NUM_THREADS={env['OMP_NUM_THREADS']}; alternating "
          f"zoo / PaddleOCR x{repeats}", flush=True)
    runs = {"zoo": [], "paddleocr": []}
    for rep in range(repeats):
        for side in ("zoo", "paddleocr"):
            run_dir = work / ("zoo_run" if side == "zoo" else "paddleocr_output")
            if run_dir.exists():  # each round starts clean (PaddleOCR's log appends)
                shutil.rmtree(run_dir)
            wall, proc = _run(commands[side], ROOT if side == "zoo" else work, work / f"{side}_{rep}.log")
            if side == "zoo":
                step_s = zoo_step_times(run_dir / "metrics.jsonl", batch)
                rec = {}
            else:
                parsed = parse_paddleocr_log((save_dir / "train.log").read_text(encoding="utf-8"))
                step_s = parsed["step_s"]
                rec = {"dataset_errors": parsed["dataset_errors"], "paddle": paddleocr_version_check(proc.stderr),
                       "params": launcher_report(proc.stderr, "AMPZOO_PARAMS")}
                if rec["params"].get("parameters") != zoo_params["parameters"]:
                    raise RuntimeError(f"PaddleOCR's network has {rec['params'] or '?'} parameters, the zoo's "
                                       f"{zoo_params}: not the same network")
                if parsed["dataset_errors"]:
                    raise RuntimeError(f"PaddleOCR's dataset failed on {parsed['dataset_errors']} samples "
                                       f"(it draws others instead); see {work / f'{side}_{rep}.log'}")
                if rec["paddle"].get("version") != paddle.__version__:
                    raise RuntimeError(f"PaddleOCR's side runs Paddle {rec['paddle'] or '?'}, the zoo "
                                       f"{paddle.__version__}: not the same framework")
            if max(step_s) != steps:
                raise RuntimeError(f"{side} ran {max(step_s)} steps, expected {steps}")
            rec.update(images_per_s=images_per_s(step_s, steps, warmup, batch), wall_s=wall,
                       step_s=[step_s[k] for k in sorted(step_s)])
            runs[side].append(rec)
            print(f"  {side:<9} run {rep + 1}: {rec['images_per_s']:.3f} img/s (steps {warmup + 1}-{steps}), "
                  f"whole command {wall:.1f} s", flush=True)
    zoo = float(np.median([r["images_per_s"] for r in runs["zoo"]]))
    ref = float(np.median([r["images_per_s"] for r in runs["paddleocr"]]))
    result = {"model": model, "paddleocr_config_source": upstream.as_posix(), "amp": "fp32",
              "zoo_params": zoo_params, "paddleocr_params": runs["paddleocr"][0]["params"], "data": "synthetic_text", "images": n, "batch_size": batch,
              "crop_size": crop, "steps": steps, "warmup": warmup, "repeats": repeats,
              "omp_num_threads": env["OMP_NUM_THREADS"], "paddle_version": paddle.__version__,
              "zoo_images_per_s": zoo, "paddleocr_images_per_s": ref, "ratio": zoo / ref,
              "zoo_wall_s": float(np.median([r["wall_s"] for r in runs["zoo"]])),
              "paddleocr_wall_s": float(np.median([r["wall_s"] for r in runs["paddleocr"]])),
              "runs": runs, "commands": {k: " ".join(v) for k, v in commands.items()},
              "paddleocr_config": str(pcfg)}
    print(f"parameters: zoo {zoo_params['parameters']:,}, PaddleOCR {result['paddleocr_params']['parameters']:,}")
    print(f"training img/s (median of {repeats}): zoo {zoo:.3f}, PaddleOCR {ref:.3f}; zoo/PaddleOCR "
          f"{result['ratio']:.3f}; whole command (median) zoo {result['zoo_wall_s']:.1f} s, PaddleOCR "
          f"{result['paddleocr_wall_s']:.1f} s")
    return result
