"""The Task contract (zoo/tasks/base.py, issue 34 items 2-3): each task satisfies it, the engine checks a
task's own settings rules, the export asks the task instead of matching names, and an evaluation hands
over predictions without anything patching the task."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import paddle
import pytest
from conftest import ROOT, compose

from zoo.engine.evaluate import evaluate
from zoo.engine.run import SETTINGS, ConfigError, build, check_numbers
from zoo.export.common import ExportError
from zoo.tasks import ClassificationTask, DBTask, PPYOLOETask, Task
from zoo.utils.checks import POSITIVE

TASKS = {"db_det_tiny": DBTask, "ppyoloe_tiny": PPYOLOETask, "resnet_tiny": ClassificationTask}
# What export needs beyond training; the base class's defaults raise NotImplementedError for them.
EXPORT_MEMBERS = ("deploy_module", "agreement", "metric_unit")


def test_the_contract_names_what_every_task_must_provide():
    """Pinned so that a member dropped from (or added to) the contract is a decision, not an accident."""
    assert Task.__abstractmethods__ == {"losses", "predict", "eval_stats", "compute_metrics",
                                        "bootstrap_primary", "resampled_primary", "n_evaluated_images"}

    class NoLosses(Task):
        kind, primary_metric = "toy", "acc"
        predict = eval_stats = compute_metrics = bootstrap_primary = resampled_primary = \
            n_evaluated_images = lambda self, *a, **k: None  # noqa: E731

    with pytest.raises(TypeError, match="losses"):
        NoLosses()


@pytest.mark.parametrize("model", sorted(TASKS))
def test_each_task_satisfies_the_contract(model):
    cls = TASKS[model]
    task = build(compose([f"model={model}"]).model.task, "model.task")  # its real config builds it
    assert isinstance(task, Task) and type(task) is cls
    assert isinstance(cls.kind, str) and isinstance(cls.primary_metric, str) and cls.SETTINGS
    for name in EXPORT_MEMBERS:  # the export's pieces are the task's own, not the base's refusals
        assert getattr(cls, name) is not getattr(Task, name), f"{cls.__name__}.{name}"
    for name, member in inspect.getmembers(Task, inspect.isfunction):
        if name.startswith("_"):
            continue
        want = list(inspect.signature(member).parameters)
        got = list(inspect.signature(getattr(cls, name)).parameters)
        assert got[:len(want)] == want, f"{cls.__name__}.{name}{got} does not take the contract's {want}"


def test_the_three_kinds_are_distinct_and_the_export_knows_each():
    from zoo.export.from_config import EXPORTS

    kinds = {cls.kind for cls in TASKS.values()}
    assert kinds == {"text_detection", "object_detection", "classification"} == set(EXPORTS)


def _split(model: str, n: int = 4):
    cfg = compose([f"model={model}", "data.builder.num_train=4", f"data.builder.num_val={n}"])
    paddle.seed(0)
    net = build(cfg.model.net, "model.net")
    net.eval()
    return cfg, net, build(cfg.data.builder, "data.builder").build("val", cfg.seed)


class _FP32:
    def autocast(self):
        import contextlib
        return contextlib.nullcontext()


class _TextSpot(paddle.nn.Layer):
    """A DB stand-in whose shrink map holds one confident rectangle per image (random weights find none)."""

    def forward(self, x):
        n, _, h, w = x.shape
        maps = np.zeros([n, 1, h, w], np.float32)
        maps[:, :, h // 4:h // 2, w // 4:3 * w // 4] = 0.9
        return {"maps": paddle.to_tensor(maps)}


class _TwoBoxes(paddle.nn.Layer):
    """A PP-YOLOE stand-in in eval mode: two anchors' boxes (input pixels), one confident class each."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes = num_classes

    def forward(self, x):
        n = x.shape[0]
        boxes = np.broadcast_to(np.array([[4, 4, 40, 30], [50, 40, 90, 80]], np.float32), (n, 2, 4))
        scores = np.zeros([n, self.num_classes, 2], np.float32)
        scores[:, 0, 0], scores[:, 1, 1] = 0.9, 0.8
        return {"boxes": paddle.to_tensor(np.ascontiguousarray(boxes)), "scores": paddle.to_tensor(scores)}


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("model", sorted(TASKS))
def test_an_evaluation_hands_over_each_images_prediction(model):
    """``evaluate(..., predictions=[])`` collects each image's ``predict`` entry in evaluation order
    (the same as calling predict batch by batch); two evaluations of one network agree completely, on
    detections that exist; the pooled sums come back with the metrics and give the metric's unit."""
    from zoo.data import EvalBatchSampler, build_loader

    cfg, net, val_set = _split(model)
    net = {"db_det_tiny": _TextSpot(), "ppyoloe_tiny": _TwoBoxes(int(cfg.model.task.get("num_classes", 0)))}.get(
        model, net)
    task = build(cfg.model.task, "model.task")
    checked = task.checked_module(net)
    first, second = [], []
    result = evaluate(checked, task, _FP32(), val_set, 3, predictions=first)
    n = task.n_evaluated_images()
    assert len(first) == n == len(val_set) == 4
    with paddle.no_grad():
        direct = [p for batch in build_loader(val_set, EvalBatchSampler(4, 3), 0) for p in task.predict(checked, batch)]
    assert _same(first, direct)
    assert result.sums.get("num_images", result.sums.get("count")) == 4  # the pooled eval_stats
    evaluate(checked, build(cfg.model.task, "model.task"), _FP32(), val_set, 3, predictions=second)
    agreement = task.agreement(first, second)
    assert agreement.get("fp32_detections", agreement.get("images")) >= 4, agreement  # not vacuous
    assert agreement.get("matched_share", agreement.get("same_top1_share")) == 1.0, agreement
    unit, what = task.metric_unit(n, result.sums, val_set)
    assert 0 < unit < float("inf") and what


def test_an_evaluation_without_predictions_keeps_none_and_a_duck_typed_task_still_runs():
    """Training passes no list: the task's eval_stats is called as before (test doubles that do not
    subclass Task, like tests/test_engine.py's, keep working)."""
    cfg, net, val_set = _split("resnet_tiny")
    calls = []

    class Duck:
        primary_metric = "top1"

        def eval_stats(self, model, batch):
            calls.append(len(batch["image"]))
            return {"count": float(len(batch["image"]))}

        def compute_metrics(self, sums):
            return {"top1": 0.0, "count": sums["count"]}

    result = evaluate(net, Duck(), _FP32(), val_set, 3)
    assert calls == [3, 1] and result.sums == {"count": 4.0}


def test_the_engine_checks_a_tasks_own_rules_and_holds_none_of_its_own():
    assert not [key for key in SETTINGS if key.startswith("model.task.")]
    with pytest.raises(ConfigError, match=r"^model.task.loss.alpha: expected a finite number >= 0, got -1"):
        check_numbers(compose(["model=db_det_tiny", "model.task.loss.alpha=-1"]))
    with pytest.raises(ConfigError, match=r"^model.task.nms.score_threshold: expected a finite number in \[0, 1\]"):
        check_numbers(compose(["model=ppyoloe_tiny", "model.task.nms.score_threshold=1.5"]))
    cfg = compose(["model=resnet_tiny"])
    cfg.model.task = {"_target_": "tests.test_task_contract.ToyTask", "gain": -2.0}  # a family the engine never saw
    with pytest.raises(ConfigError, match=r"^model.task.gain: expected a finite number > 0, got -2.0"):
        check_numbers(cfg)
    cfg.model.task.gain = 2.0
    check_numbers(cfg)


class ToyTask(Task):
    """A new family: its rules are checked by the engine without an edit there; export has no row for it."""

    kind, primary_metric = "toy_regression", "mse"
    SETTINGS = {"gain": POSITIVE}

    def __init__(self, gain: float = 1.0):
        self.gain = gain

    losses = predict = eval_stats = compute_metrics = bootstrap_primary = resampled_primary = \
        n_evaluated_images = lambda self, *a, **k: None  # noqa: E731


class NoKindTask:
    def __init__(self, **_):
        pass


@pytest.mark.parametrize("target, said", [
    ("tests.test_task_contract.ToyTask", "is a task of kind 'toy_regression', which export does not know"),
    ("tests.test_task_contract.NoKindTask", "is a task that declares no kind (zoo/tasks/base.py)"),
    ("zoo.tasks.NoSuchTask", "cannot locate 'zoo.tasks.NoSuchTask'"),
])
def test_an_unknown_task_is_one_export_error_naming_the_target_and_the_known_kinds(tmp_path, target, said):
    from zoo.export import export_from_config

    cfg = compose(["model=resnet_tiny"], "export")
    cfg.model.task = {"_target_": target}
    with pytest.raises(ExportError) as err:
        export_from_config(cfg, tmp_path / "out", log=lambda *_: None)
    message = str(err.value)
    assert message.startswith(f"model.task._target_: ") and said in message and "\n" not in message
    assert "known kinds: classification, object_detection, text_detection" in message
    assert not (tmp_path / "out").exists()


def _export_sources() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "zoo" / "export").glob("*.py"))}


def test_the_export_matches_no_class_names_or_kinds():
    """Behaviour is chosen by the task's kind in one table (from_config.EXPORTS) or asked of the task:
    no string naming a task class or a kind anywhere else in zoo/export, and no comparison with ``.kind``."""
    kinds = {cls.kind for cls in TASKS.values()} | {"db", "ppyoloe"}  # and the kind names of before
    found = []
    for name, tree in _export_sources().items():
        table_keys = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Dict):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if name == "from_config.py" and any(getattr(t, "id", "") == "EXPORTS" for t in targets):
                    table_keys = {id(k) for k in node.value.keys}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in table_keys:
                text = node.value
                if text in kinds or (text.replace(".", "").isidentifier() and text.endswith("Task")):
                    found.append(f"{name}:{node.lineno}: {text!r}")
            if isinstance(node, ast.Compare) and any(isinstance(n, ast.Attribute) and n.attr == "kind"
                                                    for n in [node.left, *node.comparators]):
                found.append(f"{name}:{node.lineno}: compares .kind")
    assert found == []


def test_the_precision_check_patches_no_task():
    """Predictions come through ``evaluate(..., predictions=...)``: nothing assigns to a task's attributes."""
    tree = _export_sources()["precision_check.py"]
    assigned = [f"{n.lineno}: task.{t.attr}" for n in ast.walk(tree) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "task"]
    assert assigned == []
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "register_forward_post_hook"]


def test_deploy_modules_live_beside_their_tasks():
    """DB's shrink map, the classifier's softmax and PP-YOLOE's deploy graph are the tasks' (the export
    imports them, below it in the layers); the classifier's is a softmax over the logits."""
    from zoo.tasks import ClassifierProbs, DBProbabilityMap, PPYOLOEDeploy

    for layer, task in ((DBProbabilityMap, DBTask), (ClassifierProbs, ClassificationTask),
                        (PPYOLOEDeploy, PPYOLOETask)):
        assert Path(inspect.getfile(layer)) == Path(inspect.getfile(task))
    logits = paddle.to_tensor(np.array([[1.0, 2.0, 0.5]], np.float32))
    probs = ClassificationTask().deploy_module(lambda x: x)(logits).numpy()
    assert np.allclose(probs, np.exp([1.0, 2.0, 0.5]) / np.exp([1.0, 2.0, 0.5]).sum())
