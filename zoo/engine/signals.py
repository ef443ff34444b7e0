"""Ctrl-C and SIGTERM during a run: stop at the next safe point, save a checkpoint, say how to resume.

A run's phases (training steps, periodic evaluation, the final evaluation, the FP32 evaluation and
the drawings) each look at :meth:`StopRequests.check` at their safe points: after a training step,
before each evaluation batch, between phases. There the first signal becomes
:class:`StopRequested`, which the trainer turns into a checkpoint of the last completed step and
:class:`TrainingInterrupted` (one line, exit status 130 / 143).
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_last_stop: TrainingInterrupted | None = None  # the newest stop's line, for a signal that follows it


def record_stop(stop: TrainingInterrupted) -> TrainingInterrupted:
    """Remember ``stop`` (the run's last words): a further signal while the program unwinds (the
    handlers are Python's again) is reported with it (:func:`last_stop`), not as a stop elsewhere."""
    global _last_stop
    _last_stop = stop
    return stop


def last_stop() -> TrainingInterrupted | None:
    """The stop recorded since :func:`forget_stop`, if any."""
    return _last_stop


def forget_stop() -> None:
    global _last_stop
    _last_stop = None


@contextlib.contextmanager
def ignoring_stop_signals():
    """Drop SIGINT/SIGTERM inside the block (the stop line is being written; the program is leaving),
    then put the handlers back. Outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal; the message says where it stopped and how to resume."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """128 + signal number, as a shell reports a process killed by it (130 Ctrl-C, 143 SIGTERM)."""
        return 128 + int(self.signum)


class StopRequested(KeyboardInterrupt):
    """Raised by :meth:`StopRequests.check` at a safe point after the first signal: the training
    state is whole (no step half done), so a checkpoint may be written."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopAtOnce(KeyboardInterrupt):
    """The second signal: raised wherever the program is, so nothing may be saved on the way out."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequests:
    """Context manager: the first SIGINT/SIGTERM sets :attr:`signum` (the run stops at its next
    :meth:`check`); a second one raises :class:`StopAtOnce` at once.

    Handlers are only installed in the main thread of a single-process run: under a launcher each
    rank would see the signal at a different step and wait for the others in the checkpoint barrier.
    ``StopRequests(enabled=False)`` never sees a signal: its :meth:`check` does nothing.
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.signum: int | None = None
        self.active = False  # inside the ``with`` block with handlers installed
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise StopAtOnce(signum)
        self.signum = signum
        log.warning("%s received: stopping at the next safe point (the end of this training step or "
                    "evaluation batch) and saving a checkpoint (send it again to stop at once)",
                    signal.Signals(signum).name)

    def check(self) -> None:
        """Raise :class:`StopRequested` if a stop signal came; call it only where state is whole."""
        if self.signum is not None:
            raise StopRequested(self.signum)

    def __enter__(self) -> StopRequests:
        if self.enabled:
            for s in STOP_SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
            self.active = True
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            # None: a handler installed outside Python; it cannot be put back, the default can.
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
        self.active = False
