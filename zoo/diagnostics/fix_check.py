"""A prescription is checked before it is printed: the doctor judges again with the fix applied.

Each finding names a fix (and maybe ``candidates``, tried next). For each line that sets config
keys, :func:`check_fixes` asks ``judge(overrides)`` for the findings with it applied, as the doctor
would make them: the training steps' measurement is reused when only loss-scaler keys change (the
values it measured do not depend on them) and taken again otherwise (a black list or
``master_grad`` changes which ops and gradients are low), and the emulated steps are re-run with
the fix, since they are where a scale with too little headroom shows (a skipped step). The
eval-mode findings keep their own check: a finding whose eval probe ran clean with the line is
gone, the others stay (a black-list entry only moves ops to fp32, so it cannot add an overflow).

A line is printed when, with it, the finding it fixes is gone or milder and no kind of finding is
more severe than before (a new risky finding, a note become risky). Otherwise the next candidate
is tried, and when none passes the finding says so instead of prescribing. What was checked, and
the verdict with the printed fix, go to doctor.json (``fix_check``).
"""
from __future__ import annotations

import re

import yaml
from omegaconf import OmegaConf

from zoo.diagnostics.findings import SEVERITY, verdict

SCALER_KEYS = {f"amp.{k}" for k in ("init_loss_scaling", "use_dynamic_loss_scaling", "incr_ratio", "decr_ratio",
                                    "incr_every_n_steps", "decr_every_n_nan_or_inf")}
SETTING = re.compile(r"[A-Za-z_][\w.]*=\S+")
NOT_NUMERICS = ("amp.guard.", "trainer.eval_precision")   # change what is recorded, not what is computed


def overrides(line: str) -> dict | None:
    """``a.b=1 c=[x,y]`` as ``{"a.b": 1, "c": ["x", "y"]}`` (values read as YAML, as Hydra reads
    them); None when the line is not only settings (a note, a command to run)."""
    tokens = line.split()
    if not tokens or not all(SETTING.fullmatch(t) for t in tokens):
        return None
    return {k: yaml.safe_load(v) for k, v in (t.split("=", 1) for t in tokens)}


def with_overrides(cfg, over: dict):
    """A copy of ``cfg`` with ``over`` set (every key must exist: a fix names real settings)."""
    c = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    for key, value in over.items():
        if OmegaConf.select(c, key, default="__absent__") == "__absent__":
            raise ValueError(f"{key}: a fix names a key the config does not have (a doctor bug)")
        OmegaConf.update(c, key, value, merge=False)
    return c


def reuses_measurement(over: dict) -> bool:
    """Whether the FP32 measurement of the training steps holds with ``over``: it does not depend
    on the loss scaler, nor on what is only recorded."""
    return set(over) <= SCALER_KEYS | {k for k in over if k.startswith(NOT_NUMERICS)}


def _kinds(findings) -> dict:
    out: dict = {}
    for f in findings:
        out[f["kind"]] = max(out.get(f["kind"], -1), SEVERITY[f["severity"]])
    return out


def _worse(before: list[dict], after: list[dict], fixed: dict) -> list[str]:
    """Why ``after`` is worse than ``before`` for the fix of ``fixed`` (empty: it is not): another
    kind of finding more severe than it was (a new one counts from note), the fixed one not milder,
    or a worse verdict."""
    was, now = _kinds(before), _kinds(after)
    why = {f"{f['kind']} becomes {f['severity']}" for f in after
           if f["kind"] != fixed["kind"] and SEVERITY[f["severity"]] > was.get(f["kind"], 0)}
    if now.get(fixed["kind"], -1) >= SEVERITY[fixed["severity"]]:
        why.add(f"{fixed['kind']} stays {fixed['severity']}")
    if SEVERITY.get(verdict(after), 0) > SEVERITY.get(verdict(before), 0):
        why.add(f"verdict {verdict(after)}")
    return sorted(why)


def _trains(over: dict) -> bool:
    return any(not k.startswith("trainer.eval_precision") for k in over)


def _with_fix(findings, line, over, judge) -> tuple[list[dict], str]:
    """The findings the doctor makes with ``line`` applied, and how they were made."""
    evals = [f for f in findings if f.get("mode") == "eval"]
    kept = [f for f in evals if not f.get("fix_checks", {}).get(line, {}).get("prevents")]
    how = []
    if _trains(over):
        training = judge(over)
        how.append(f"training steps judged again (FP32 measurement {'reused' if reuses_measurement(over) else 'taken again'}"
                   ", emulated steps re-run)")
    else:
        training = [f for f in findings if f.get("mode") != "eval"]
    if len(kept) < len(evals):
        how.append("the eval probe ran clean with it: " + "; ".join(
            f"{f['fix_checks'][line]['how']}, {f['fix_checks'][line]['nonfinite_images']} of "
            f"{f['fix_checks'][line]['images']} images non-finite" for f in evals if f not in kept))
    elif evals:
        how.append("eval findings kept (not probed with it)")
    return training + kept, "; ".join(how)


def check_fixes(findings: list[dict], judge) -> None:
    """Check every finding's fix (then its candidates) with ``judge(overrides) -> findings``; set
    ``fix`` to the first that passes and ``fix_check`` to what was found, in place."""
    cache: dict = {}
    for f in findings:
        tried = []
        for line in [f["fix"], *f.pop("candidates", [])]:
            over = overrides(line)
            if over is None or all(k.startswith("amp.guard.") for k in over):
                f["fix_check"] = {"checked": False, "why": "not a numerics setting" if over else "not a setting"}
                break
            if line not in cache:
                cache[line] = _with_fix(findings, line, over, judge)
            after, how = cache[line]
            why = _worse(findings, after, f)
            entry = {"fix": line, "verdict_with_fix": verdict(after), "verdict_without": verdict(findings),
                     "findings_with_fix": [f"[{g['severity']}] {g['what']}" for g in after], "how": how}
            if not why:
                f["fix"], f["fix_check"] = line, {"checked": True, **entry, "rejected": tried}
                break
            tried.append({**entry, "worse": why})
        else:
            f["fix"] = "none checked better: " + "; ".join(f"{t['fix']} ({', '.join(t['worse'])})" for t in tried)
            f["fix_check"] = {"checked": True, "verdict_with_fix": None, "rejected": tried}
