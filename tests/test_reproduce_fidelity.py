"""Each reproduction experiment holds upstream's hyperparameters (issue 37, Build item 3).

tests/fidelity/<experiment>.yaml is a table of the values upstream's config sets, each with its file and
line. This test composes the experiment as tools/train.py does and checks every row: the composed value
equals upstream's, or, where the zoo deliberately differs, equals the documented zoo value and the row
says why. A drift in either direction (an experiment edited, a table edited without a reason) fails.
"""
from __future__ import annotations

import importlib
import inspect
import math
from pathlib import Path

import pytest
import yaml
from conftest import compose
from omegaconf import OmegaConf

from zoo.data.sampler import TrainBatchSampler

TABLES = Path(__file__).parent / "fidelity"
EXPERIMENTS = sorted(p.stem for p in TABLES.glob("*.yaml"))
_MISSING = object()


def load_table(name: str) -> dict:
    table = yaml.safe_load((TABLES / f"{name}.yaml").read_text(encoding="utf-8"))
    assert table["experiment"] == name, f"{name}.yaml: names experiment {table['experiment']!r}"
    return table


def plain(value):
    """Config and YAML values in one comparable form (tuples and ListConfigs as lists)."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def same(a, b) -> bool:
    a, b = plain(a), plain(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def constructor_default(spec: str, param: str):
    """The default of ``param`` in the constructor of ``module:Class``."""
    module, cls = spec.split(":")
    sig = inspect.signature(getattr(importlib.import_module(module), cls))
    assert param in sig.parameters, f"{spec} has no parameter {param!r}"
    return sig.parameters[param].default


def effective(cfg, row: dict):
    """What the run uses for the row's key: the config's value, else the constructor default."""
    value = OmegaConf.select(cfg, row["key"], default=_MISSING)
    if value is _MISSING and row.get("default_from"):
        value = constructor_default(row["default_from"], row["key"].rsplit(".", 1)[1])
    return value


def iterations(cfg, row: dict) -> int:
    """Optimizer steps of the whole run on ``row['cards']`` cards, with the trainer's own sampler."""
    per_card = TrainBatchSampler(row["samples"], int(cfg.model.batch_size), seed=0, rank=0,
                                 world_size=row["cards"],
                                 drop_last=bool(cfg.trainer.get("drop_last", True))).steps_per_epoch
    return math.ceil(cfg.trainer.epochs * per_card)


def lr(cfg, row: dict) -> float:
    """The lr a run on ``row['cards']`` cards starts from (zoo.engine.run.build_optimizer's scaling)."""
    base = cfg.optim.get("base_batch_size")
    return float(cfg.optim.lr) * (cfg.model.batch_size * row["cards"] / base if base else 1.0)


def train_resizes(cfg, row: dict) -> int:
    """Resizes of each training image of a batch: the experiment's data builder (its own transform,
    sizes and multi-scale list) on a one-image COCO folder made here, cv2.resize counted from loading
    the items to the collated batch."""
    import json
    import tempfile
    from unittest import mock

    import cv2
    import numpy as np
    from hydra.utils import instantiate

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "annotations").mkdir()
        (root / "img").mkdir()
        cv2.imwrite(str(root / "img" / "1.png"), np.full((120, 160, 3), 90, np.uint8))
        coco = {"images": [{"id": 1, "file_name": "1.png", "width": 160, "height": 120}],
                "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [20, 10, 60, 50], "iscrowd": 0}],
                "categories": [{"id": 1, "name": "a"}]}
        (root / "annotations" / "a.json").write_text(json.dumps(coco))
        builder = OmegaConf.to_container(cfg.data.builder, resolve=False)
        builder.update(root=str(root), train_ann="annotations/a.json", val_ann="annotations/a.json",
                       train_images="img", val_images="img")
        train = instantiate(builder).build("train", 0)
        real = cv2.resize
        with mock.patch.object(cv2, "resize", side_effect=real) as counted:
            items = [train[k] for k in range(row.get("batch", 2))]
            train.collate_fn(items)
    assert counted.call_count % len(items) == 0, counted.call_args_list
    return counted.call_count // len(items)


DERIVED = {"iterations": iterations, "lr": lr, "train_resizes": train_resizes}


def rows():
    for name in EXPERIMENTS:
        for i, row in enumerate(load_table(name)["rows"]):
            label = row.get("key") or row.get("derived")
            marks = [pytest.mark.xfail(strict=True, reason=f"open: {row['open']}")] if row.get("open") else []
            yield pytest.param(name, row, id=f"{name}:{label}" + (f"[{','.join(row['with'])}]" if row.get("with") else ""),
                               marks=marks)


_composed: dict = {}


def composed(name: str, extra=()):
    key = (name, tuple(extra))
    if key not in _composed:
        _composed[key] = compose([f"experiment={name}", *extra])
    return _composed[key]


def test_every_experiment_with_an_upstream_has_a_table():
    upstream = {"db_mv3_icdar2015", "db_r50vd_icdar2015", "ppyoloe_s_coco", "resnet50_imagenet_amp",
                "resnet50_vd_imagenet", "resnet50_vd_imagenet_amp"}
    assert upstream <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_table_rows_are_complete(name):
    table = load_table(name)
    assert table["upstream"]["repo"] and table["upstream"]["file"]
    for row in table["rows"]:
        assert ("key" in row) != ("derived" in row), row
        assert "upstream" in row and str(row.get("at", "")).strip(), f"{name}: a row without upstream value or line: {row}"
        if "zoo" in row:  # a deliberate difference must say why
            assert len(str(row.get("differs", ""))) > 20, f"{name}: {row['key']} differs without a reason"
            assert not same(row["zoo"], row["upstream"]), f"{name}: {row['key']}: zoo == upstream, drop `zoo`"
        else:
            assert "differs" not in row, f"{name}: {row.get('key')}: `differs` without the zoo's value"


@pytest.mark.parametrize("name,row", list(rows()))
def test_experiment_matches_upstream(name, row):
    cfg = composed(name, row.get("with", ()))
    if "derived" in row:
        got = DERIVED[row["derived"]](cfg, row)
    else:
        got = effective(cfg, row)
        assert got is not _MISSING, f"experiment={name}: {row['key']} is not in the composed config"
    want = row.get("zoo", row["upstream"])
    what = "the documented zoo value" if "zoo" in row else f"upstream's ({row['at']})"
    assert same(got, want), f"experiment={name}: {row.get('key') or row['derived']} = {plain(got)!r}, " \
                            f"expected {what} {want!r}"


@pytest.mark.parametrize("drop_last,steps,last_batch", [(True, 2, 16), (False, 3, 8)])
def test_drop_last_false_trains_the_partial_batch(tiny_cfg, tmp_path, drop_last, steps, last_batch):
    """trainer.drop_last=false (PaddleOCR's and PaddleClas's loaders) adds the partial batch to an epoch:
    40 images in batches of 16 are 2 steps with the default, 3 (16, 16, 8) without dropping."""
    from zoo.engine.run import build_trainer

    cfg = tiny_cfg("data.builder.num_train=40", "trainer.epochs=1", f"trainer.drop_last={drop_last}")
    trainer, _ = build_trainer(cfg, tmp_path)
    assert trainer.settings.max_steps == steps
    sampler = TrainBatchSampler(40, 16, seed=0, drop_last=drop_last, stop_step=steps)
    assert [len(b) for b in sampler][-1] == last_batch
