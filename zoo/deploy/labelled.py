"""The deploy check with labels: a Paddle inference program judged by the metric of a zoo data set,
exactly as the export check (``tools/export.py export.precision=...``) judges the zoo's own networks.

``labels.run=<run folder>`` takes the data set and the task (its post-processing and metric) from a
zoo run's ``config.yaml``; ``labels.data=<data config> labels.model=<model config>`` composes them
from configs/ as ``tools/eval.py`` would (``labels.overrides`` adds more, e.g. ``[data.root=...]``).
The program (run op by op by zoo/deploy/interpreter.py, BatchNorms folded) takes the place of the
network: zoo/export/precision_check.py evaluates it on the validation split in FP32 and in the
emulated deployment, and gives the paired bootstrap CI of the primary metric against the margin, the
keep-list search and the report. On a zoo export the two checks see the same numbers
(tests/test_deploy_labelled.py holds them to it).

The inputs are the data set's own, prepared by the zoo's evaluation pipeline, not by the model
folder's yml; the program must take one input (the image batch) and give what the task evaluates:
DB's probability map, a classifier's probabilities. A PP-YOLOE export ends in its NMS and takes a
``scale_factor``, which the zoo's evaluation does not feed: it is refused with the command that
checks it from its run instead.
"""
from __future__ import annotations

from pathlib import Path

import paddle
from omegaconf import DictConfig, OmegaConf

from zoo.deploy.errors import DeployError

__all__ = ["LABELLED_TASKS", "check_labelled", "labels_config", "wants_labels"]

# the zoo task kinds whose exported program outputs what the task's evaluation reads
LABELLED_TASKS = ("text_detection", "classification")


def wants_labels(labels) -> bool:
    """Whether ``labels:`` names a run or a data set."""
    return bool(labels) and bool(labels.get("run") or labels.get("data") or labels.get("model"))


def labels_config(labels, compose=None) -> tuple[DictConfig, str]:
    """``(config with data, model and seed, what it came from)`` for ``labels:``. ``compose(overrides)``
    composes configs/eval.yaml (Hydra's compose API inside the running app)."""
    run, data, model = labels.get("run"), labels.get("data"), labels.get("model")
    extra = list(labels.get("overrides") or [])
    if run and (data or model):
        raise DeployError("labels.run and labels.data / labels.model: pass one (a run brings its own data and model)")
    if run:
        from zoo.engine.from_run import RUN_CONFIG, run_folder_of

        folder = run_folder_of(Path(str(run)).expanduser())
        if folder is None:
            raise DeployError(f"labels.run={run}: not a zoo run folder (no {RUN_CONFIG} in it or around its "
                              f"checkpoints/)")
        cfg = OmegaConf.load(folder / RUN_CONFIG)
        if extra:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([str(e) for e in extra]))
        return cfg, f"run {folder}"
    if not (data and model):
        raise DeployError(f"labels: give labels.run=<zoo run folder>, or both labels.data=<configs/data name> and "
                          f"labels.model=<configs/model name> (got data={data!r}, model={model!r})")
    if compose is None:
        raise DeployError("labels.data / labels.model need the config tree (run tools/deploy_check.py)")
    try:
        cfg = compose([f"model={model}", f"data={data}", *map(str, extra)])
    except Exception as err:  # Hydra's MissingConfigException / override errors: one line
        raise DeployError(f"labels.data={data} labels.model={model}: {str(err).splitlines()[0]}") from None
    return cfg, f"data={data} model={model}"


class _FirstOutput(paddle.nn.Layer):
    """The program as the network the task evaluates: its one input, its first output."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)[0]


def check_labelled(net, program, labels, precision: str, settings, compose=None, log=print) -> dict:
    """The metric verdict of ``program`` (as ``net``, a ProgramNet) in ``precision`` on the labelled split
    of ``labels`` (module docstring); returns the export check's report (precision_report.json's form),
    with ``source``. Raises ``PrecisionRefused`` (report attached) as the export check does."""
    from zoo.engine.run import build
    from zoo.export.precision import PRECISIONS
    from zoo.export.precision_check import CheckSettings, Deployment, check_precision_export

    cfg, source = labels_config(labels, compose)
    task = build(cfg.model.task, "model.task")
    if task.kind not in LABELLED_TASKS:
        raise DeployError(f"labels: the {task.kind} task evaluates the network before its in-graph post-processing, "
                          f"which this program ends in; check it from its run instead: python tools/export.py "
                          f"run=<run folder> export.precision={precision}")
    if len(program.feeds) != 1:
        raise DeployError(f"labels: the program takes {len(program.feeds)} inputs ({', '.join(program.feeds)}); "
                          "the zoo's evaluation feeds one image batch")
    data = build(cfg.data.builder, "data.builder")
    val_set = data.build("val", int(cfg.get("seed", 0)))
    margins = dict(CheckSettings().margin)
    if labels.get("margin") is not None:
        margins = {k: float(labels.margin) for k in margins}
    check = CheckSettings(margin=margins, level=settings.level, resamples=settings.resamples,
                          max_keep=settings.max_keep, max_evaluations=settings.max_evaluations,
                          warn_fp32_share=settings.warn_fp32_share, top=settings.top)
    dep = Deployment(_FirstOutput(net), lambda: build(cfg.model.task, "model.task"), val_set,
                     int(cfg.model.get("eval_batch_size") or cfg.model.batch_size))
    log(f"{precision} with labels ({source}): {len(val_set)} validation images of {cfg.data.get('name', '?')}")
    report = check_precision_export(dep, precision, PRECISIONS[precision], check, log)
    report["source"] = source
    return report
