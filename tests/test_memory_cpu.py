"""The planner's CPU check (zoo/diagnostics/memory_cpu.py, ``amp_doctor.py --memory --cpu-check``):
the batch it measures with leaves no loading thread behind to allocate during the step."""
from __future__ import annotations

import threading
import time

from conftest import compose

from zoo.diagnostics.probe import first_batch


def _loading_threads():
    return [t for t in threading.enumerate() if "_thread_loop" in t.name and t.is_alive()]


def test_the_first_batch_leaves_no_loading_thread_behind():
    """Paddle's single-process loader keeps loading in a thread after the caller stops reading;
    left running it held six db_det batches and allocated one more during the measured step."""
    from paddle.base import core

    cfg = compose(["model=db_det_tiny", "data.builder.num_train=64"], config_name="doctor")
    batch = first_batch(cfg, 2)
    assert batch["image"].shape[0] == 2
    assert _loading_threads() == []
    if hasattr(core, "host_memory_stat_current_value"):   # (a thread's share leaves them as it ends)
        time.sleep(0.1)
        before = core.host_memory_stat_current_value("Allocated", 0)
        time.sleep(0.3)
        assert core.host_memory_stat_current_value("Allocated", 0) <= before   # nothing allocates behind
