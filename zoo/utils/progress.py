"""Progress: a tqdm bar on a terminal, a plain line now and then everywhere else.

A bar redraws itself with carriage returns; written into a redirected log (``> train.out 2>&1``, a
sweep's job log, CI) it becomes one endless line of partial bars. :class:`Progress` draws the bar
only when its stream (stderr) is a terminal. Elsewhere it writes a plain line every ``every``
updates (default: about every 10 % of ``total``) and, from :meth:`report`, the values a bar would
show in its postfix (the training loop reports step, loss, lr, ips every ``trainer.log_every`` steps).
Every progress display of the zoo goes through this module.

While a bar is drawn, a line written under it would be glued to the bar's last state and the bar
redrawn below it, half a line each time. So while any bar is live, the console handlers of the
root logger (Hydra's ``[time][name][LEVEL] - ...``) are swapped for ones that write through
``tqdm.write`` (clear the bar, write the line, redraw the bar), and :func:`write_line` does the
same for the zoo's plain lines (``announce``'s ``warning: ...``). Closing the last bar restores them.
"""
from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterable, Iterator

__all__ = ["Progress", "is_terminal", "progress", "write_line"]


def is_terminal(stream=None) -> bool:
    """Whether ``stream`` (default: stderr) is a terminal a bar can redraw itself on."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


_live: list = []      # the tqdm bars drawn now
_swapped: list = []   # (logger, original console handler, its tqdm.write replacement)


class _TqdmWriteHandler(logging.Handler):
    """A console handler's records, written with ``tqdm.write`` to the handler's own stream."""

    def __init__(self, original: logging.StreamHandler):
        super().__init__(original.level)
        self.original = original
        self.setFormatter(original.formatter)
        self.filters = list(original.filters)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.original.stream)
        except Exception:  # noqa: BLE001  (logging's own convention: never raise from a handler)
            self.handleError(record)


def _console_handlers(logger: logging.Logger) -> list[logging.StreamHandler]:
    return [h for h in logger.handlers if type(h) is logging.StreamHandler and is_terminal(h.stream)]


def _bar_opened(bar) -> None:
    if not _live:
        root = logging.getLogger()
        for handler in _console_handlers(root):
            replacement = _TqdmWriteHandler(handler)
            root.handlers[root.handlers.index(handler)] = replacement  # in place: the order stays
            _swapped.append((root, handler, replacement))
    _live.append(bar)


def _bar_closed(bar) -> None:
    if bar in _live:
        _live.remove(bar)
    if not _live:
        while _swapped:
            logger, handler, replacement = _swapped.pop()
            if replacement in logger.handlers:
                logger.handlers[logger.handlers.index(replacement)] = handler


def write_line(message: str, stream=None) -> None:
    """``print(message, file=stream)`` (stdout by default), through ``tqdm.write`` while a bar is drawn."""
    stream = sys.stdout if stream is None else stream
    if _live:
        from tqdm import tqdm

        tqdm.write(message, file=stream)
        stream.flush()
    else:
        print(message, file=stream, flush=True)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)


class Progress:
    """tqdm's ``update`` / ``set_postfix`` / ``close`` (and iteration with :func:`progress`).

    ``disable`` shows nothing at all. ``every``: a plain line after every ``every`` updates when not
    on a terminal; ``None`` = about every 10 % of ``total`` (no lines without a total); ``0`` = none
    but those of :meth:`report`. ``unit_scale`` formats counts as sizes (bytes of a download).
    """

    def __init__(self, total: int | None = None, desc: str = "", initial: int = 0, disable: bool = False,
                 every: int | None = None, unit: str = "it", unit_scale: bool = False, leave: bool = True,
                 stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.total, self.desc, self.unit, self.unit_scale = total, desc, unit, unit_scale
        self.n = self._last_line = initial
        self.disable = bool(disable)
        self.start = time.perf_counter()
        self._bar = None
        if not self.disable and is_terminal(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=unit_scale,
                             unit_divisor=1024 if unit_scale else 1000, leave=leave, file=self.stream,
                             dynamic_ncols=True)
            _bar_opened(self._bar)
        if every is None:
            every = max(1, math.ceil((total - initial) / 10)) if total and total > initial else 0
        self.every = int(every)

    @property
    def plain(self) -> bool:
        """Plain lines instead of a bar (shown, but not on a terminal)."""
        return not self.disable and self._bar is None

    def _count(self, n) -> str:
        if not self.unit_scale:
            return str(n)
        from tqdm import tqdm

        return tqdm.format_sizeof(n, "B" if self.unit == "B" else "", 1024)

    def _line(self, fields: dict | None = None) -> None:
        done = f"{self._count(self.n)}/{self._count(self.total)}" if self.total else self._count(self.n)
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        unit = "" if self.unit_scale else f" {self.unit}"
        extra = "".join(f", {k} {_fmt(v)}" for k, v in (fields or {}).items())
        elapsed = time.perf_counter() - self.start
        print(f"{self.desc}: {done}{unit}{pct}{extra}, {elapsed:.0f}s", file=self.stream, flush=True)
        self._last_line = self.n

    def update(self, n: int = 1) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.plain and self.every and (self.n - self._last_line >= self.every
                                            or (self.total and self.n >= self.total > self._last_line)):
            self._line()

    def set_postfix(self, **fields) -> None:
        """Values beside the bar (on a terminal only; see :meth:`report` for lines elsewhere)."""
        if self._bar is not None:
            self._bar.set_postfix(**fields)

    def report(self, **fields) -> None:
        """The values of this point: the bar's postfix on a terminal, a plain line elsewhere."""
        if self._bar is not None:
            self._bar.set_postfix(**fields)
        elif self.plain:
            self._line(fields)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            _bar_closed(self._bar)
            self._bar = None
        self.disable = True  # nothing more, in either mode

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(iterable: Iterable, total: int | None = None, **kwargs) -> Iterator:
    """Iterate ``iterable`` with a :class:`Progress` (``total`` defaults to its ``len``)."""
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with Progress(total=total, **kwargs) as bar:
        for item in iterable:
            yield item
            bar.update(1)
