"""One line saying why ``python -m paddle.distributed.launch`` failed: which rank, how, its last line.

The launcher exits with the status of the *first rank in rank order* whose code is non-zero, and a
rank killed by a signal has code ``-N``, which ``sys.exit`` turns into ``256 - N``: 245 is SIGSEGV,
250 SIGABRT, 241 SIGTERM, 247 SIGKILL. Once one rank fails the launcher stops the others with
SIGTERM, so 241 is often a healthy rank 0 stopped because rank 1 failed. The rank that failed
first is the one the launcher names on stderr (``Container rank N status failed ... code C log
PATH``); its ``workerlog.N`` holds its last words. ``python -m zoo.engine.launch_report LOG_DIR
STATUS [LAUNCHER_STDERR_FILE]`` prints the line for a launch that already ended.
"""
from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

# the launcher's "Container failed" record (controllers/controller.py: Container.__str__)
_FAILED = re.compile(r"Container rank (\d+) status failed\b.* code (-?\d+) log (\S+)")
# lines that say nothing about a failure: glog INFO chatter, banners, Paddle's FLAGS notice
_NOISE = re.compile(r"^(I\d{4} \d\d:\d\d:\d\d\.\d+ |[-=]+$|FLAGS\(name=)")


def describe_code(code: int) -> str:
    """A rank's code as the launcher records it (``Popen.returncode``): -11 -> 'killed by SIGSEGV'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def describe_status(status: int) -> str:
    """The launcher's own exit status: 245 -> 'a rank killed by SIGSEGV (245 = 256 - 11)'."""
    if 256 - 64 < status < 256:  # sys.exit(-N) of a signalled rank's code
        return f"a rank {describe_code(status - 256)} ({status} = 256 - {256 - status})"
    return f"a rank's exit status {status}"


def failed_ranks(launcher_output: str) -> list[tuple[int, int, str]]:
    """``(rank, code, log path)`` of each rank the launcher reported failed, in its order."""
    return [(int(m[1]), int(m[2]), m[3]) for m in _FAILED.finditer(launcher_output or "")]


def last_line(log: Path) -> str:
    """The last line of a worker log that is not glog INFO chatter or decoration ('' if none)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((ln.strip() for ln in reversed(lines) if ln.strip() and not _NOISE.match(ln.strip())), "")


def describe_launch_failure(status: int, launcher_output: str, log_dir: str | Path) -> str:
    """One line for a failed launch ('' for status 0): the first failed rank, its code, its last line.

    Without the launcher's output (only the log folder) every rank's last line is given instead.
    """
    if status == 0:
        return ""
    log_dir = Path(log_dir)
    head = f"paddle.distributed.launch exited {status}: {describe_status(status)}"
    failed = failed_ranks(launcher_output)
    if not failed:
        logs = sorted(log_dir.glob("workerlog.*"), key=lambda p: p.suffix)
        lasts = "; ".join(f"{p.name}: {last_line(p)!r}" for p in logs) or f"no workerlog.* in {log_dir}"
        return f"{head}; the launcher's output names no failed rank; last lines: {lasts}"
    rank, code, path = failed[0]
    log = Path(path) if Path(path).is_absolute() else log_dir / Path(path).name
    line = f"{head}; first failed rank {rank}: {describe_code(code)}, last line of {log.name}: {last_line(log)!r}"
    if (code & 0xFF) != status:  # the status is a lower rank's, typically stopped by the launcher
        line += f" (the exit status is another rank's: the launcher stops the others after rank {rank} fails)"
    return line


def main(argv: list[str]) -> int:
    """``LOG_DIR STATUS [LAUNCHER_STDERR_FILE]``: print the line; exit 0, or 2 on bad arguments."""
    if len(argv) not in (2, 3) or not argv[1].lstrip("-").isdigit():
        print("usage: python -m zoo.engine.launch_report LOG_DIR STATUS [LAUNCHER_STDERR_FILE]", file=sys.stderr)
        return 2
    output = Path(argv[2]).read_text(errors="replace") if len(argv) == 3 else ""
    print(describe_launch_failure(int(argv[1]), output, argv[0]) or "exit status 0: the launch succeeded")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
