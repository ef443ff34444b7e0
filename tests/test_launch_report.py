"""A failed two-rank launch is reported as one line (rank, signal, last log line), and a completed
launched rank leaves without the C++ teardown that crashed rank 0 (issue 27, item 5)."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import ROOT, TINY, launch_failure, run_tool

from zoo.utils import distributed
from zoo.engine import launch_report as lr

CLOSING = "not evaluated (trainer.final_eval=false) after 4 steps (fp32); run folder /tmp/x/run"
GLOG = "I1202 20:42:21.329674 13261 pir_interpreter.cc:1606] New Executor is Running ..."


def _failed(rank: int, code: int, log_dir) -> str:
    """The launcher's stderr record of a failed rank, as controllers/controller.py prints it."""
    return (f"LAUNCH ERROR 2026-12-02 20:42:23,524 Container failed !!!\nContainer rank {rank} status failed "
            f"cmd ['/usr/bin/python', '-u', 'tools/train.py', 'model=resnet_tiny'] code {code} "
            f"log {log_dir}/workerlog.{rank}\nLAUNCH INFO 2026-12-02 20:42:23,524 Exit code {code}\n")


@pytest.fixture
def log_dir(tmp_path):
    """A launch folder: rank 0 finished its run, rank 1 died in a C++ kernel."""
    d = tmp_path / "log"
    d.mkdir()
    (d / "workerlog.0").write_text(f"=======\nFLAGS(name='FLAGS_x', current_value=True)\n{CLOSING}\n{GLOG}\n\n")
    (d / "workerlog.1").write_text(f"{GLOG}\nFatalError: `Segmentation fault` is detected by the operating "
                                   "system.\n  [SignalInfo: *** SIGSEGV (@0x0) received by PID 7 ***]\n\n")
    return d


@pytest.mark.parametrize("status,name", [(245, "SIGSEGV"), (241, "SIGTERM"), (250, "SIGABRT"), (247, "SIGKILL")])
def test_launcher_statuses_name_the_signal(status, name):
    assert f"killed by {name} ({status} = 256 - " in lr.describe_status(status)


def test_plain_statuses_stay_statuses():
    assert lr.describe_status(2) == "a rank's exit status 2"
    assert lr.describe_code(1) == "exit status 1" and lr.describe_code(-11) == "killed by SIGSEGV"


def test_a_peer_stopped_by_the_launcher_does_not_hide_the_rank_that_crashed(log_dir):
    """241 (rank 0 SIGTERM'd by the launcher) while rank 1 segfaulted: the line names rank 1."""
    line = lr.describe_launch_failure(241, _failed(1, -11, log_dir), log_dir)
    assert "exited 241: a rank killed by SIGTERM" in line
    assert "first failed rank 1: killed by SIGSEGV" in line
    assert "[SignalInfo: *** SIGSEGV (@0x0) received by PID 7 ***]" in line
    assert "the exit status is another rank's" in line
    assert "\n" not in line


def test_rank_0_crash_after_its_closing_line_is_shown_as_such(log_dir):
    line = lr.describe_launch_failure(245, _failed(0, -11, log_dir), log_dir)
    assert "first failed rank 0: killed by SIGSEGV, last line of workerlog.0: " + repr(CLOSING) in line
    assert "another rank" not in line  # the status is this rank's own


def test_python_error_exit_names_its_last_line(tmp_path):
    d = tmp_path / "log"
    d.mkdir()
    (d / "workerlog.1").write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                                   "RuntimeError: ranks ended with different parameters: ['a', 'b']\n")
    line = lr.describe_launch_failure(1, _failed(1, 1, d), d)
    assert line.endswith("first failed rank 1: exit status 1, last line of workerlog.1: "
                         "\"RuntimeError: ranks ended with different parameters: ['a', 'b']\"")


def test_without_the_launcher_output_every_rank_last_line_is_given(log_dir):
    line = lr.describe_launch_failure(245, "", log_dir)
    assert "names no failed rank" in line and f"workerlog.0: {CLOSING!r}" in line and "workerlog.1: '[Sig" in line
    assert "no workerlog.* in" in lr.describe_launch_failure(245, "", log_dir / "missing")


def test_success_is_no_failure(log_dir):
    assert lr.describe_launch_failure(0, _failed(1, -11, log_dir), log_dir) == ""


def test_cli_prints_the_line(log_dir, capsys):
    (log_dir / "stderr.txt").write_text(_failed(1, -11, log_dir))
    assert lr.main([str(log_dir), "241", str(log_dir / "stderr.txt")]) == 0
    assert "first failed rank 1: killed by SIGSEGV" in capsys.readouterr().out
    assert lr.main([str(log_dir)]) == 2


def test_conftest_message_leads_with_the_line(log_dir):
    out = subprocess.CompletedProcess([], 241, stdout="", stderr=_failed(1, -11, log_dir))
    msg = launch_failure(out, log_dir)
    assert msg.splitlines()[0].startswith("paddle.distributed.launch exited 241") and "--- workerlog.1" in msg


def test_exit_after_run_does_nothing_outside_the_launcher(monkeypatch):
    monkeypatch.delenv("PADDLE_TRAINERS_NUM", raising=False)
    monkeypatch.setattr(distributed.os, "_exit", lambda status: pytest.fail("exited"))
    distributed.exit_after_run()  # returns: a single process ends the ordinary way


def test_exit_after_run_waits_for_all_ranks_then_exits_0(monkeypatch):
    calls = []
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(distributed.atexit, "_run_exitfuncs", lambda: calls.append("atexit"))

    class Exited(Exception):
        pass

    def fake_exit(status):
        calls.append(f"_exit({status})")
        raise Exited

    monkeypatch.setattr(distributed.os, "_exit", fake_exit)
    with pytest.raises(Exited):
        distributed.exit_after_run()
    assert calls == ["barrier", "atexit", "_exit(0)"]


# LD_PRELOAD probe: rank N sleeps the N-th of EXIT_DELAY_MS's comma-separated milliseconds at the very
# end of exit(), after the C++ statics of Paddle's libraries are destroyed. Rank 0 sleeping there while
# rank 1 leaves puts rank 1's disconnect into the window that crashed rank 0 (SIGABRT, exit 250).
PROBE_C = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int delay_ms = 0;
static void sleeper(void) { usleep(delay_ms * 1000); }
__attribute__((constructor)) static void init(void) {
  const char *r = getenv("PADDLE_TRAINER_ID"), *ms = getenv("EXIT_DELAY_MS");
  if (!r || !ms) return;
  for (int i = atoi(r); i > 0 && ms; i--) { ms = strchr(ms, ','); if (ms) ms++; }
  if (ms && (delay_ms = atoi(ms)) > 0) atexit(sleeper);
}
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the exit-delay probe")
def test_compiled_two_rank_run_survives_a_peer_leaving_during_exit(tmp_path, ampzoo_home):
    """Deterministic form of the intermittent exit-250/245: without distributed.exit_after_run, a
    compiled run's rank 0 still runs its store server thread during exit() and aborts when rank 1
    disconnects there. With it, no rank reaches exit() after a completed run."""
    (tmp_path / "probe.c").write_text(PROBE_C)
    probe = tmp_path / "probe.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(probe), str(tmp_path / "probe.c")], check=True)
    args = ["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
            str(ROOT / "tools" / "train.py"), *TINY, "model.batch_size=8", "trainer.final_eval=false",
            "trainer.compile=true", f"hydra.run.dir={tmp_path / 'run'}"]
    out = run_tool(args, tmp_path, {"AMPZOO_HOME": str(ampzoo_home), "LD_PRELOAD": str(probe),
                                    "EXIT_DELAY_MS": "3000,1000"})
    assert out.returncode == 0, launch_failure(out, tmp_path / "log")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ranks_in_sync"] and summary["compiled"]
