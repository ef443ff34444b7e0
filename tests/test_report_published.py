"""tools/report.py --against-published: a finished run against the upstream figure its config states
(issue 37, Build item 4; zoo/report/published.py)."""
from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT, TINY, compose, run_tool

from zoo.report.published import PublishedInputError, compare_run

PUBLISHED = ["+published.metric=top1", "+published.value=12.5", "+published.source='a paper, table 2'",
             "+published.tolerance=100", "+published.reason='a stated tolerance for the test'"]


def fake_run(folder, published, summary):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"published": published} if published else {"seed": 0}))
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


BLOCK = {"metric": "hmean", "value": 75.12, "source": "s", "tolerance": 1.0, "reason": "r"}


def test_difference_and_tolerance(tmp_path):
    summary = {"primary_metric": {"name": "hmean", "value": 0.7450, "evaluated_in": "fp32"}, "metrics": {}}
    c = compare_run(fake_run(tmp_path / "a", BLOCK, summary))
    assert (round(c.measured, 2), c.published, round(c.difference, 2), c.within) == (74.5, 75.12, -0.62, True)
    summary["primary_metric"]["value"] = 0.7400
    assert not compare_run(fake_run(tmp_path / "b", BLOCK, summary) / "summary.json").within  # -1.12 pp


def test_fp32_evaluation_is_compared_when_upstream_evaluates_in_fp32(tmp_path):
    block = {**BLOCK, "metric": "top1", "value": 76.5, "tolerance": 0.3, "evaluated_in": "fp32"}
    summary = {"primary_metric": {"name": "top1", "value": 0.760, "evaluated_in": "float16"},
               "metrics_fp32_eval": {"top1": 0.764}}
    c = compare_run(fake_run(tmp_path / "r", block, summary))
    assert c.evaluated_in.startswith("fp32") and round(c.measured, 1) == 76.4 and c.within


@pytest.mark.parametrize("published,summary,match", [
    (None, {"primary_metric": {"name": "hmean", "value": 0.7}}, "no `published` block"),
    ({**BLOCK, "tolerance": None}, {"primary_metric": {"name": "hmean", "value": 0.7}}, "missing tolerance"),
    ({**BLOCK, "value": "75"}, {"primary_metric": {"name": "hmean", "value": 0.7}}, "published.value: expected a number"),
    (BLOCK, {"status": "stopped_by_guard", "primary_metric": {"name": "hmean", "value": None}}, "no measured 'hmean'"),
])
def test_clear_errors(tmp_path, published, summary, match):
    with pytest.raises(PublishedInputError, match=match):
        compare_run(fake_run(tmp_path / "x", published, summary))


def test_every_reproduction_experiment_states_its_published_figure():
    for name in ("db_mv3_icdar2015", "db_r50vd_icdar2015", "ppyoloe_s_coco", "resnet50_imagenet_amp",
                 "resnet50_vd_imagenet", "resnet50_vd_imagenet_amp"):
        block = compose([f"experiment={name}"]).published
        assert block.value > 0 and block.tolerance > 0 and len(block.reason) > 40 and ":" in block.source


def test_short_run_against_a_stated_published_figure(tmp_path):
    """A real (tiny, 4-step) run with the figure given on the command line, then the report tool."""
    run = tmp_path / "run"
    train = run_tool(["tools/train.py", *TINY, "trainer.progress=false", *PUBLISHED, f"hydra.run.dir={run}"],
                     ROOT, env_extra={"OMP_NUM_THREADS": "1"})
    assert train.returncode == 0, train.stderr[-2000:]
    out = run_tool(["tools/report.py", str(run), "--against-published"], ROOT)
    measured = json.loads((run / "summary.json").read_text())["primary_metric"]["value"] * 100
    assert out.returncode == 0, out.stdout + out.stderr  # any tiny-run top-1 is within 12.5 +- 100
    assert f"top1: measured {measured:.2f}, published 12.50, difference {measured - 12.5:+.2f} pp: within" in out.stdout
    assert "a paper, table 2" in out.stdout and "a stated tolerance for the test" in out.stdout
    # The same run against a figure 5 pp above it with no tolerance: outside, exit status 1.
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["published"].update(value=round(measured + 5, 4), tolerance=0)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    out = run_tool(["tools/report.py", str(run), "--against-published"], ROOT)
    assert out.returncode == 1 and "difference -5.00 pp: OUTSIDE the tolerance of +-0 pp" in out.stdout


def test_a_run_without_a_published_figure_is_an_input_error(tmp_path):
    run = fake_run(tmp_path / "plain", None, {"primary_metric": {"name": "top1", "value": 0.5}})
    out = run_tool(["tools/report.py", str(run), "--against-published"], ROOT)
    assert out.returncode == 2 and "no `published` block" in out.stderr


def test_model_cards_published_tables_are_generated_from_the_experiments(tmp_path):
    """Issue 37 item 4: MODEL_CARDS' "upstream reported results" tables are the experiments'
    `published` blocks; regenerating them changes nothing, so a block edited without the cards fails."""
    import shutil

    from conftest import run_tool

    cards = tmp_path / "MODEL_CARDS.md"
    shutil.copy(ROOT / "MODEL_CARDS.md", cards)
    res = run_tool(["tools/report.py", "--published-tables", "--model-cards", str(cards)], cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert cards.read_text() == (ROOT / "MODEL_CARDS.md").read_text().replace(
        "--model-cards MODEL_CARDS.md`", f"--model-cards {cards.name}`"), \
        "MODEL_CARDS.md's published tables differ from the experiments: run " \
        "python tools/report.py --published-tables --model-cards MODEL_CARDS.md"
    for experiment in ("db_mv3_icdar2015", "ppyoloe_s_coco", "resnet50_vd_imagenet"):
        assert f"`experiment={experiment}`" in cards.read_text()


def test_a_published_table_without_its_section_is_named(tmp_path):
    from zoo.report.published import PublishedInputError, rewrite_tables

    cards = tmp_path / "CARDS.md"
    cards.write_text("<!-- published:db -->\n<!-- /published:db -->\n")
    with pytest.raises(PublishedInputError, match="published:ppyoloe"):
        rewrite_tables(cards, {"db": "| t |\n", "ppyoloe": "| t |\n"}, "c")
    with pytest.raises(PublishedInputError, match="sections with no experiment: \\['db'\\]"):
        rewrite_tables(cards, {}, "c")
