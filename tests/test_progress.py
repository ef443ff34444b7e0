"""Progress display: a bar on a terminal, plain lines in a redirected log (zoo/utils/progress.py)."""
from __future__ import annotations

import io
import re
from pathlib import Path

from conftest import ROOT, TINY, run_tool

from zoo.utils.progress import Progress, is_terminal, progress


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_not_a_terminal_gets_a_plain_line_about_every_tenth_and_no_carriage_returns():
    out = _Stream(tty=False)
    assert not is_terminal(out)
    items = list(progress(range(45), desc="eval", unit="batches", stream=out))
    assert items == list(range(45))
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [re.match(r"eval: (\d+)/45 batches", x).group(1) for x in lines] == \
        ["5", "10", "15", "20", "25", "30", "35", "40", "45"]


def test_report_writes_the_values_a_bar_would_show_and_update_alone_writes_nothing_with_every_0():
    out = _Stream(tty=False)
    bar = Progress(total=100, initial=40, desc="train", unit="steps", every=0, stream=out)
    for step in range(41, 61):
        bar.update(1)
        if step % 10 == 0:
            bar.report(loss="0.6931", lr="1.00e-03", ips="48.1")
    bar.close()
    bar.report(loss="1")  # closed: nothing more
    lines = [re.sub(r", \d+s$", "", x) for x in out.getvalue().splitlines()]  # without the elapsed time
    assert lines == ["train: 50/100 steps (50%), loss 0.6931, lr 1.00e-03, ips 48.1",
                     "train: 60/100 steps (60%), loss 0.6931, lr 1.00e-03, ips 48.1"]


def test_a_terminal_gets_the_tqdm_bar_and_disable_shows_nothing():
    tty = _Stream(tty=True)
    with Progress(total=3, desc="train", stream=tty) as bar:
        for _ in range(3):
            bar.update(1)
        bar.report(loss="0.5")
    assert "\r" in tty.getvalue() and "train" in tty.getvalue() and "loss=0.5" in tty.getvalue()
    for tty_flag in (True, False):
        quiet = _Stream(tty=tty_flag)
        list(progress(range(20), desc="x", disable=True, stream=quiet))
        Progress(total=5, disable=True, stream=quiet).report(loss=1)
        assert quiet.getvalue() == ""


def test_sizes_are_formatted_for_a_download():
    out = _Stream(tty=False)
    with Progress(total=10 * 2**20, unit="B", unit_scale=True, desc="w.pdparams", stream=out) as bar:
        for _ in range(10):
            bar.update(2**20)
    first = out.getvalue().splitlines()[0]
    assert first.startswith("w.pdparams: 1.00MB/10.0MB (10%)"), first


def test_every_bar_of_the_zoo_goes_through_the_helper():
    users = [p for p in (ROOT / "zoo").rglob("*.py") if "tqdm" in p.read_text() and p.name != "progress.py"]
    users += [p for p in (ROOT / "tools").glob("*.py") if "tqdm" in p.read_text()]
    assert users == [], users


def test_training_into_a_redirected_log_writes_plain_lines_with_step_loss_lr_ips(tmp_path):
    run = tmp_path / "run"
    args = [o for o in TINY if not o.startswith(("trainer.progress", "trainer.log_every"))]
    out = run_tool(["tools/train.py", *args, "trainer.progress=true", "trainer.log_every=2",
                    f"hydra.run.dir={run}"], ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "\r" not in out.stderr and "it/s" not in out.stderr
    train = [x for x in out.stderr.splitlines() if x.startswith("train: ")]
    assert [x.split()[1] for x in train] == ["2/4", "4/4"], out.stderr
    assert all(re.search(r"loss [\d.]+, lr [\d.e+-]+, scale -, ips [\d.]+", x) for x in train), train
    assert [x.split()[1] for x in out.stderr.splitlines() if x.startswith("eval: ")] == ["1/2", "2/2"]
    assert "train: " not in Path(run / "train.log").read_text()  # the log file keeps its own lines
