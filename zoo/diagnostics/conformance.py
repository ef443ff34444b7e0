"""Does the emulation pick the precision Paddle's compiled AMP rule picks? Call by call.

Paddle decides each op's dtype in C++ (``paddle/fluid/imperative/amp_utils.h``, GetAmpDestDtype)
and only then, finding a CPU place, falls back to fp32; with ``GLOG_vmodule=amp_utils=6`` it logs
``Change <op>'s AMP type from float16 to FP32`` exactly where the rule had picked the low format.
:func:`paddle_trace` puts the dygraph tracer into AMP mode as ``auto_cast`` would on a GPU, casts the
parameters as ``decorate`` would at O2, runs a forward, and after every op whose rule said "low"
casts its outputs to the format, so that the next op sees the dtypes a GPU would show it.
:func:`emulation_trace` runs the same forward under :class:`~zoo.amp.emulation.Emulation` and reads
the low-precision tag of every output. :func:`compare` aligns the two call sequences and counts
agreements per op. The glog switch must be in the environment before paddle is imported;
``tools/amp_conformance.py`` re-executes itself to arrange that.
"""
from __future__ import annotations

import contextlib
import difflib
import math
import os
import re
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import paddle
import yaml
from paddle import _C_ops

from zoo.amp import emulation as emu

GLOG_ENV = {"GLOG_vmodule": "amp_utils=6", "GLOG_logtostderr": "1", "GLOG_minloglevel": "0"}
_LINE = re.compile(r"amp_utils\.h:\d+\] (?:Change (\S+)'s AMP type from (float16|bfloat16) to FP32"
                   r"|AMP GetAmpDestDtype: op\((\S+)\))")
_LOW = (paddle.float16, paddle.bfloat16)
ALLOW_FILE = Path(__file__).with_name("conformance_allow.yaml")


def glog_ready() -> bool:
    return "amp_utils=6" in os.environ.get("GLOG_vmodule", "")


@dataclass
class Call:
    op: str            # the _C_ops function name (or Paddle's log name for calls we could not wrap)
    dtype: str         # "low" or "fp32"
    numel: int = 0
    paddle_name: str = ""
    note: str = ""


@dataclass
class Report:
    rows: list = field(default_factory=list)        # (op, paddle, emulation, calls, share, allowed reason)
    disagreements: int = 0
    unexplained: int = 0
    calls: int = 0
    low_params: tuple = (0, 0)                      # parameters stored low: Paddle, emulation


class _StderrTap:
    """fd 2 redirected to a file whose new text can be read at any moment (glog writes there)."""

    def __enter__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._file = tempfile.TemporaryFile()
        os.dup2(self._file.fileno(), 2)
        self._pos = 0
        return self

    def read(self) -> str:
        self._file.seek(self._pos)
        data = self._file.read()
        self._pos += len(data)
        return data.decode("utf-8", "replace")

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.close()


def parse_decisions(text: str) -> list[tuple[str, str]]:
    """``[(paddle op name, "low" | "fp32")]`` from glog text, one entry per GetAmpDestDtype line."""
    out, changed = [], None
    for m in _LINE.finditer(text):
        if m.group(1):
            changed = m.group(1)
        else:
            name = m.group(3)
            out.append((name, "low" if changed == name else "fp32"))
            changed = None
    return out


def _callables():
    names = [n for n in dir(_C_ops) if not n.startswith("_") and not n.endswith("_")
             and callable(getattr(_C_ops, n))]
    return names


@contextlib.contextmanager
def every_op(hook):
    """Route every ``_C_ops`` function and Tensor operator through ``hook(name, fn, args, kwargs)``;
    calls made inside a hooked call pass straight through."""
    state = threading.local()
    saved_ops = {n: getattr(_C_ops, n) for n in _callables()}
    saved_dunders = {d: getattr(paddle.Tensor, d) for d in emu._DUNDERS}

    def wrap(name, fn):
        def wrapper(*args, **kwargs):
            if getattr(state, "depth", 0):
                return fn(*args, **kwargs)
            state.depth = 1
            try:
                return hook(name, fn, args, kwargs)
            finally:
                state.depth = 0
        return wrapper

    try:
        for n, fn in saved_ops.items():
            setattr(_C_ops, n, wrap(n, fn))
        for d, fn in saved_dunders.items():
            setattr(paddle.Tensor, d, wrap(emu._DUNDERS[d], fn))
        yield
    finally:
        for n, fn in saved_ops.items():
            setattr(_C_ops, n, fn)
        for d, fn in saved_dunders.items():
            setattr(paddle.Tensor, d, fn)


def _float_out(out):
    items = out if isinstance(out, (list, tuple)) else [out]
    return [t for t in items if isinstance(t, paddle.Tensor) and t.dtype in (*emu._FLOAT, *_LOW)]


def _composite_dtype(decided, args) -> str:
    """The last inner op's dtype on a GPU: low when it is not black-listed (the rule logged it as
    low or it follows its inputs), every earlier inner op was low, and every float input is low."""
    from paddle.base import framework

    *inner, (last, dt) = decided
    _, black = framework._dygraph_tracer()._get_amp_op_list()
    inputs = [a for a in args if isinstance(a, paddle.Tensor) and a.dtype in (*emu._FLOAT, *_LOW)]
    if dt == "low" or (last not in black and all(d == "low" for _, d in inner)
                       and all(t.dtype in _LOW for t in inputs)):
        return "low"
    return "fp32"


def _size(tensors) -> int:
    return sum(math.prod(t.shape) for t in tensors)


def _cast_out(out, dtype):
    if isinstance(out, paddle.Tensor):
        return out.astype(dtype) if out.dtype in emu._FLOAT else out
    if isinstance(out, (list, tuple)):
        return type(out)(_cast_out(t, dtype) for t in out)
    return out


@contextlib.contextmanager
def _tracer_amp(level: str, dtype: str, white=(), black=()):
    from paddle.amp.auto_cast import _update_list
    from paddle.base import core, framework

    tracer = framework._dygraph_tracer()
    saved = (tracer._amp_level, tracer._amp_dtype, tracer._use_promote, tracer._get_amp_op_list())
    w, b = _update_list(list(white), list(black), level, dtype)
    tracer._set_amp_op_list(w, b)
    tracer._amp_level = core.AmpLevel.O2 if level == "O2" else core.AmpLevel.O1
    tracer._amp_dtype = dtype
    tracer._use_promote = True
    try:
        yield
    finally:
        tracer._amp_level, tracer._amp_dtype, tracer._use_promote = saved[:3]
        tracer._set_amp_op_list(*saved[3])


def paddle_trace(model, forward, level: str, dtype: str, white=(), black=()) -> tuple[list[Call], int]:
    """Paddle's own per-op decisions over ``forward(model)``; also how many parameters it casts."""
    if not glog_ready():
        raise RuntimeError("paddle_trace needs GLOG_vmodule=amp_utils=6 set before paddle is imported")
    low_params = 0
    if level == "O2":
        from paddle.amp.auto_cast import amp_initialize
        before = {id(p): p.dtype for p in model.parameters()}
        amp_initialize([model], dtype, None)
        low_params = sum(1 for p in model.parameters() if p.dtype in _LOW and before[id(p)] not in _LOW)
    calls: list[Call] = []

    with _StderrTap() as tap:
        def hook(name, fn, args, kwargs):
            for pname, dt in parse_decisions(tap.read()):  # ops run by code we could not wrap
                calls.append(Call(emu.canonical(pname), dt, 0, pname, "unwrapped"))
            out = fn(*args, **kwargs)
            decided = parse_decisions(tap.read())
            floats = _float_out(out)
            if not floats:
                return out
            if decided:
                pname, dt = decided[-1]
                if len(decided) > 1:  # a composite (linear = matmul + add): on a CPU its inner
                    dt = _composite_dtype(decided, args)  # outputs stay fp32, so re-apply the rule
                if dt == "low":
                    out = _cast_out(out, dtype)
                    tap.read()  # the casts' own log lines
            else:  # no AMP rule for this op: it computes in its inputs' dtype
                pname, dt = name, ("low" if floats[0].dtype in _LOW else "fp32")
            calls.append(Call(name, dt, _size(floats), pname,
                              "" if decided else "no AMP rule"))
            return out

        with paddle.no_grad(), _tracer_amp(level, dtype, white, black), every_op(hook):
            forward(model)
    return calls, low_params


def emulation_trace(model, forward, emulation: emu.Emulation, master_grad: bool = False
                    ) -> tuple[list[Call], int]:
    """The emulation's per-op decisions over ``forward(model)`` (read from the outputs' tags)."""
    low_params = 0
    if emulation.level == "O2":
        emu.mark_o2_parameters(model, emulation.dtype)
        low_params = len(emu.low_precision_parameters(model.parameters()))
    calls: list[Call] = []

    def hook(name, fn, args, kwargs):
        out = fn(*args, **kwargs)
        floats = _float_out(out)
        if floats:
            calls.append(Call(name, "low" if emu.is_low(floats[0]) else "fp32", _size(floats), name))
        return out

    with paddle.no_grad(), emulation():
        with every_op(hook):
            forward(model)
    return calls, low_params


def load_allow_list(path: Path = ALLOW_FILE) -> list[dict]:
    """Known, explained differences: ``[{op, paddle, emulation, reason}]``."""
    entries = yaml.safe_load(path.read_text()) or []
    for i, e in enumerate(entries):
        missing = {"op", "paddle", "emulation", "reason"} - set(e)
        if missing:
            raise ValueError(f"{path}: entry {i + 1} lacks {', '.join(sorted(missing))}")
    return entries


def _allowed(allow, op, p_dt, e_dt):
    for e in allow:
        if e["op"] == op and e["paddle"] in (p_dt, "*") and e["emulation"] in (e_dt, "*"):
            return e["reason"]
    return None


def compare(paddle_calls: list[Call], emu_calls: list[Call], allow: list[dict],
            low_params=(0, 0)) -> Report:
    """Align the two call sequences by op name and count (op, Paddle dtype, emulation dtype)."""
    a = [c.op for c in paddle_calls]
    b = [c.op for c in emu_calls]
    pairs = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            pairs += [(paddle_calls[i], emu_calls[j]) for i, j in zip(range(i1, i2), range(j1, j2))]
        else:
            pairs += [(paddle_calls[i], None) for i in range(i1, i2)]
            pairs += [(None, emu_calls[j]) for j in range(j1, j2)]
    total = sum(max(p.numel if p else 0, e.numel if e else 0) for p, e in pairs) or 1
    groups: dict = {}
    for p, e in pairs:
        op = p.op if p else e.op
        key = (op, p.dtype if p else "absent", e.dtype if e else "absent")
        n, numel = groups.get(key, (0, 0))
        groups[key] = (n + 1, numel + max(p.numel if p else 0, e.numel if e else 0))
    rep = Report(calls=len(pairs), low_params=tuple(low_params))
    for (op, p_dt, e_dt), (n, numel) in sorted(groups.items()):
        reason = None if p_dt == e_dt else _allowed(allow, op, p_dt, e_dt)
        rep.rows.append((op, p_dt, e_dt, n, numel / total, reason))
        if p_dt != e_dt:
            rep.disagreements += n
            rep.unexplained += 0 if reason else n
    if low_params[0] != low_params[1]:
        rep.unexplained += 1
    return rep


def format_table(rep: Report) -> str:
    lines = [f"{'op':<28} {'calls':>5} {'Paddle':>6} {'emulation':>9} {'activations':>11}  verdict",
             "-" * 80]
    for op, p_dt, e_dt, n, share, reason in rep.rows:
        verdict = "agree" if p_dt == e_dt else (f"allowed: {reason}" if reason else "DISAGREE")
        lines.append(f"{op:<28} {n:>5} {p_dt:>6} {e_dt:>9} {share:>10.1%}  {verdict}")
    lines.append("-" * 80)
    agree = rep.calls - rep.disagreements
    lines.append(f"{agree} of {rep.calls} op calls agree; {rep.disagreements - rep.unexplained} "
                 f"allow-listed, {rep.unexplained - int(rep.low_params[0] != rep.low_params[1])} unexplained")
    lines.append(f"parameters stored in low precision: Paddle {rep.low_params[0]}, emulation "
                 f"{rep.low_params[1]}" + ("" if rep.low_params[0] == rep.low_params[1] else "  DISAGREE"))
    return "\n".join(lines)
