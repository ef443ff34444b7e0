"""The planner's CPU check (zoo/diagnostics/memory_cpu.py, ``amp_doctor.py --memory --cpu-check``):
it reads the peak of live tensors from Paddle's host allocator over a second step, not the
process's peak RSS (glibc's heap, which read db_det's per-sample cost 40 % high); the batch it
measures with leaves no loading thread behind to allocate during the step; end to end on db_det_tiny."""
from __future__ import annotations

import json
import threading
import time

import paddle
import pytest
from conftest import ROOT, compose, run_tool

from zoo.diagnostics import memory_cpu as C
from zoo.diagnostics.probe import first_batch

MiB = 1 << 20


def _allocator():
    alloc = C.HostAllocator()
    if alloc.available:
        before = alloc.current()
        probe = paddle.zeros([1024])
        if alloc.current() - before == probe.size * 4:
            return alloc
    pytest.skip("this Paddle keeps no host allocator statistics")


def test_a_step_is_measured_by_its_live_tensors_by_hand():
    alloc = _allocator()
    state = []

    def step():
        if not state:                       # made by the first step, kept: the optimizer's state
            state.append(paddle.zeros([1 << 20]))          # 4 MiB
        a = paddle.zeros([2 << 20])         # 8 MiB
        b = paddle.zeros([3 << 20])         # 12 MiB while a is alive: the peak, 4 + 8 + 12
        del a
        c = paddle.zeros([2 << 20])         # 8 MiB where a was, or not: the heap's business
        del b, c

    r = C.measure_step(step, alloc)
    assert r["source"] == C.ALLOCATOR
    assert r["growth"] == r["first_step_growth"] == 24 * MiB
    assert r["rss_growth"] >= 0             # reported, not compared


class _NoStatistics:
    """The system allocator (FLAGS_use_system_allocator): statistics that read 0."""
    available = True

    def current(self):
        return 0

    def peak(self):
        return 0

    def reset_peak(self):
        pass


@pytest.mark.parametrize("alloc", [_NoStatistics(), type("Absent", (), {"available": False})()])
def test_without_allocator_statistics_the_check_says_it_reads_the_rss(alloc):
    calls = []
    r = C.measure_step(lambda: calls.append(1), alloc)
    assert r["source"] == C.RSS and r["growth"] == r["rss_growth"]
    assert calls == [1]                     # one step: a peak RSS cannot be read for a second


def _loading_threads():
    return [t for t in threading.enumerate() if "_thread_loop" in t.name and t.is_alive()]


def test_the_first_batch_leaves_no_loading_thread_behind():
    """Paddle's single-process loader keeps loading in a thread after the caller stops reading;
    left running it held six db_det batches and allocated one more during the measured step."""
    cfg = compose(["model=db_det_tiny", "data.builder.num_train=64"], config_name="doctor")
    earlier = set(_loading_threads())       # other tests' loops in this process may leave theirs
    batch = first_batch(cfg, 2)
    assert batch["image"].shape[0] == 2
    assert [t for t in _loading_threads() if t not in earlier] == []
    alloc = C.HostAllocator()
    # (a thread's share leaves the statistics as it ends; a loop of an earlier test may still be
    # loading behind its own caller, so this half holds only when the test runs on its own)
    if alloc.available and not earlier:
        time.sleep(0.1)
        before = alloc.current()
        time.sleep(0.3)
        assert alloc.current() <= before    # nothing allocates behind the caller's back


def test_the_cpu_check_end_to_end_on_db_det_tiny(tmp_path):
    out = tmp_path / "doc"
    r = run_tool(["tools/amp_doctor.py", "model=db_det_tiny", "data.builder.num_train=64", "model.batch_size=4",
                  "--memory", "--cpu-check", f"doctor.out={out}"], cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "a second real step's peak of live tensors (Paddle's host allocator)" in r.stdout
    rows = json.loads((out / "memory.json").read_text())["cpu_check"]
    assert [row["batch"] for row in rows] == [2, 4]
    for row in rows:
        assert row["source"] == C.ALLOCATOR
        assert 0.85 <= row["ratio"] <= 1.15, row      # the RSS read 1.8x here
    measured = rows[1]["growth"] - rows[0]["growth"]
    predicted = rows[1]["predicted"] - rows[0]["predicted"]
    assert abs(measured - predicted) <= 0.15 * predicted
