"""Ctrl-C and SIGTERM during training: finish the step, save a checkpoint, say how to resume."""
from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal; the message says where it stopped and how to resume."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """128 + signal number, as a shell reports a process killed by it (130 Ctrl-C, 143 SIGTERM)."""
        return 128 + int(self.signum)


class StopRequests:
    """Context manager: the first SIGINT/SIGTERM sets :attr:`signum` (the loop stops at the end of
    its step); a second one raises KeyboardInterrupt at once.

    Handlers are only installed in the main thread of a single-process run: under a launcher each
    rank would see the signal at a different step and wait for the others in the checkpoint barrier.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        log.warning("%s received: stopping after this step and saving a checkpoint "
                    "(send it again to stop at once)", signal.Signals(signum).name)

    def __enter__(self) -> StopRequests:
        if self.enabled:
            for s in STOP_SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            # None: a handler installed outside Python; it cannot be put back, the default can.
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
