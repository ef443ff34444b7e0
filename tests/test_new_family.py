"""A new model family added only where docs/architecture.md ("Where to add") says, trained and
exported (issue 34.7): if a new family needed a file the page does not name, this test would have to
touch it, and the page would be caught out of date.

In a copy of the repository it adds, each in its documented place:
- a toy network: ``zoo/models/toy.py`` with ``@register_model``, one import line in
  ``zoo/models/__init__.py``;
- a toy task family: ``zoo/tasks/toy.py`` (a ``Task`` of a new kind), one line in
  ``zoo/tasks/__init__.py``, one row in ``EXPORTS`` (``zoo/export/from_config.py``);
- ``configs/family/toy.yaml``, ``configs/recipe/toy/O1.yaml`` and ``configs/model/toy_net.yaml``.
Then it trains 2 steps at fp32 and at O1 (the family's recipe applied), and exports the O1 run.
"""
from __future__ import annotations

import json
import shutil
import textwrap

import pytest
from conftest import ROOT, run_tool

TOY_MODEL = '''
"""A toy classifier for tests/test_new_family.py."""
from paddle import nn

from zoo.models.registry import register_model


class ToyNet(nn.Layer):
    def __init__(self, num_classes=8, in_channels=3):
        super().__init__()
        self.conv = nn.Conv2D(in_channels, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2D(1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(self.pool(nn.functional.relu(self.conv(x))).flatten(1))


@register_model
def toy_net(num_classes=8, **kw):
    return ToyNet(num_classes)
'''

TOY_TASK = '''
"""A toy task family for tests/test_new_family.py: classification under a kind of its own."""
from zoo.tasks.classification import ClassificationTask


class ToyTask(ClassificationTask):
    kind = "toy"
'''

FAMILY = "# The toy family of tests/test_new_family.py.\nname: toy\ntask: toy\n"
RECIPE = "# @package _global_\n# The toy family under fp16 O1: a loss scale of its own, to see the recipe applied.\n" \
         "amp:\n  init_loss_scaling: 512.0\n"
MODEL = '''
# @package _global_
defaults:
  - /data: synthetic_shapes
  - /optim: adam
  - /sched: cosine
  - override /family: toy

trainer:
  max_steps: 2
model:
  name: toy_net
  batch_size: 8
  eval_batch_size: 16
  net:
    _target_: zoo.create_model
    name: ${model.name}
    num_classes: ${data.num_classes}
  task:
    _target_: zoo.tasks.toy.ToyTask
'''


def _insert(path, anchor: str, line: str) -> None:
    text = path.read_text()
    assert anchor in text, f"{path}: the documented place moved ({anchor!r} not found)"
    path.write_text(text.replace(anchor, anchor + line, 1))


@pytest.mark.slow
def test_a_new_family_trains_and_exports_from_the_documented_places(tmp_path, ampzoo_home):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".git", "outputs", "multirun", "__pycache__"))
    (repo / "zoo" / "models" / "toy.py").write_text(TOY_MODEL)
    _insert(repo / "zoo" / "models" / "__init__.py", "from zoo.models import (\n", "    toy,  # noqa: F401\n")
    (repo / "zoo" / "tasks" / "toy.py").write_text(TOY_TASK)
    (repo / "zoo" / "tasks" / "__init__.py").write_text(
        (repo / "zoo" / "tasks" / "__init__.py").read_text() + "from zoo.tasks.toy import ToyTask  # noqa: E402,F401\n")
    _insert(repo / "zoo" / "export" / "from_config.py", "EXPORTS: dict[str, Callable[..., _Plan]] = {\n",
            '    "toy": _classification_plan,\n')
    (repo / "configs" / "family" / "toy.yaml").write_text(FAMILY)
    (repo / "configs" / "recipe" / "toy").mkdir()
    (repo / "configs" / "recipe" / "toy" / "O1.yaml").write_text(RECIPE)
    (repo / "configs" / "model" / "toy_net.yaml").write_text(textwrap.dedent(MODEL).lstrip())

    env = {"AMPZOO_HOME": str(ampzoo_home)}
    small = ["model=toy_net", "data.builder.num_train=32", "data.builder.num_val=16", "trainer.progress=false",
             "trainer.bootstrap_resamples=0"]
    for amp in ("fp32", "O1"):
        out = run_tool(["tools/train.py", *small, f"amp={amp}", f"hydra.run.dir={tmp_path / amp}"], repo, env)
        assert out.returncode == 0, out.stderr[-3000:]
        summary = json.loads((tmp_path / amp / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["primary_metric"]["name"] == "top1"
    o1 = json.loads((tmp_path / "O1" / "summary.json").read_text())
    assert o1["effective_precision"] == "emulated-fp16-O1"
    assert o1["loss_scaler"]["init_loss_scaling"] == 512.0  # the family's recipe reached the run
    out = run_tool(["tools/export.py", f"run={tmp_path / 'O1'}", "export.model_name=ResNet18",
                    f"export.out_dir={tmp_path / 'deploy'}", "export.onnx=false"], repo, env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "deploy" / "inference.pdiparams").is_file() and (tmp_path / "deploy" / "inference.yml").is_file()
