"""Load finished run folders (summary.json + metrics.jsonl) and sort them into comparable groups.

Only the documented run-folder contract is read (docs/configuration.md, "What a run leaves behind"), so the report
works on folders copied from another machine without Paddle or the original configs.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REQUIRED_KEYS = ("model", "data", "seed", "requested_precision", "effective_precision",
                 "primary_metric", "steps", "global_batch_size")
# Files that mark a folder as a (possibly unfinished) run folder even without summary.json.
_RUN_MARKERS = ("metrics.jsonl", "config.yaml", "train.log")
_MAX_DEPTH = 3  # Hydra multirun: <sweep>/<job>/ or outputs/<name>/<time stamp>/
_MAX_CHAIN = 1000  # resumes of one run followed at most (a loop of continued_by ends there)


class ReportInputError(Exception):
    """A run folder or summary the report cannot use; the message names the file (and key)."""


@dataclass
class Run:
    """One finished run: its folder, its summary and its metric log records."""
    path: Path
    summary: dict
    records: list = field(default_factory=list)

    @property
    def metric(self) -> float:
        return float(self.summary["primary_metric"]["value"])

    @property
    def metric_name(self) -> str:
        return str(self.summary["primary_metric"]["name"])

    @property
    def precision(self) -> str:
        return str(self.summary["effective_precision"])

    @property
    def variant(self) -> str:
        """What the run is compared as: its effective precision, plus the scale when an fp16 run's
        loss scale was static (a recipe of its own: never pooled with dynamic-scale runs)."""
        scaler = self.summary.get("loss_scaler")
        if ("fp16" in self.precision and isinstance(scaler, dict)
                and scaler.get("use_dynamic_loss_scaling") is False):
            scale = scaler.get("init_loss_scaling")
            return f"{self.precision}-static-scale-{scale:g}" if isinstance(scale, (int, float)) \
                else f"{self.precision}-static-scale"
        return self.precision

    @property
    def eval_ci(self) -> dict | None:
        """Bootstrap CI over validation images of the primary metric (fractions), if recorded."""
        ci = self.summary["primary_metric"].get("ci")
        ok = isinstance(ci, dict) and all(isinstance(ci.get(k), (int, float)) for k in ("low", "high"))
        return ci if ok else None

    @property
    def nonfinite_images(self) -> int | None:
        """Images with inf/NaN outputs in the evaluation behind the primary metric (None: not counted,
        a summary.json from before the count)."""
        n = self.summary["primary_metric"].get("nonfinite_images")
        return int(n) if isinstance(n, (int, float)) else None

    @property
    def train_precision_nonfinite_images(self) -> int | None:
        """Images with inf/NaN outputs in the evaluation in the training precision (summary.json's
        ``eval_numerics``), whichever evaluation the primary metric is."""
        n = (self.summary.get("eval_numerics") or {}).get("nonfinite_images")
        return int(n) if isinstance(n, (int, float)) else None

    @property
    def eval_only_effect(self) -> float | None:
        """Training-precision minus FP32 evaluation of the same final weights, in pp (AMP runs)."""
        fp32 = self.summary.get("metrics_fp32_eval")
        own = self.summary.get("metrics")
        name = self.metric_name
        if self.precision == "fp32" or not isinstance(fp32, dict) or not isinstance(own, dict):
            return None
        if not isinstance(fp32.get(name), (int, float)) or not isinstance(own.get(name), (int, float)):
            return None
        return (float(own[name]) - float(fp32[name])) * 100.0

    def series(self, kind: str = "train") -> list[dict]:
        """Records of one kind ("train", "eval", "guard"), in step order."""
        return sorted((r for r in self.records if r.get("kind") == kind
                       and isinstance(r.get("step"), (int, float))), key=lambda r: r["step"])


@dataclass
class SetAside:
    """A run that is evidence for neither side, and why."""
    path: Path
    reason: str


def _load_summary(path: Path) -> dict:
    """Parse and validate one summary.json, raising ReportInputError that names file and key."""
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportInputError(f"{path}: missing summary.json (run unfinished or crashed? "
                               "pass finished run folders explicitly)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportInputError(f"{path}: corrupt summary.json ({err})") from None
    if not isinstance(summary, dict):
        raise ReportInputError(f"{path}: summary.json is not a JSON object")
    if summary.get("status", "completed") != "completed":
        return summary  # a run that did not complete (stopped by the guard): set aside, with its status
    for key in REQUIRED_KEYS:
        if key not in summary:
            raise ReportInputError(f"{path}: summary.json lacks required key '{key}'")
    pm = summary["primary_metric"]
    if not isinstance(pm, dict) or "name" not in pm or "value" not in pm:
        raise ReportInputError(f"{path}: summary.json key 'primary_metric' needs 'name' and 'value'")
    for key in ("steps", "global_batch_size"):
        if not isinstance(summary[key], int) or isinstance(summary[key], bool):
            raise ReportInputError(f"{path}: summary.json key '{key}' is not an integer")
    try:
        value = float(pm["value"])
    except (TypeError, ValueError):
        value = math.nan
    if pm["value"] is None and summary.get("eval_precision", "") is None:
        raise ReportInputError(f"{path}: run was not evaluated (trainer.final_eval=false); it cannot "
                               "enter a parity report")
    if not math.isfinite(value):
        raise ReportInputError(f"{path}: summary.json key 'primary_metric' has no finite value")
    return summary


def _load_records(path: Path) -> list[dict]:
    """metrics.jsonl records; a missing log or a torn last line only costs curves, not the verdict."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # e.g. a run killed mid-write; the summary is what the verdict rests on
        if isinstance(rec, dict):
            records.append(rec)
    return records


def _is_run_dir(path: Path) -> bool:
    return (path / "summary.json").exists() or any((path / m).exists() for m in _RUN_MARKERS)


def _continued_by(path: Path) -> Path | None:
    """The folder that continued this run (its summary.json: ``status: continued``), else None.

    Looked for where the summary says, then beside this folder (run folders copied together)."""
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(summary, dict) or summary.get("status") != "continued":
        return None
    named = Path(str(summary.get("continued_by") or ""))
    for cand in (named, path.parent / named.name):
        if named.name and _is_run_dir(cand):
            return cand
    return path  # continued, but the continuation is not here


def _newest_of_chain(path: Path, notes: list) -> Path | None:
    """``path``, or for a run a resume continued, the chain's newest folder (one note says so);
    None when that folder is not here (left out, with a note)."""
    chain = [path]
    while len(chain) <= _MAX_CHAIN:
        nxt = _continued_by(chain[-1])
        if nxt is None:
            break
        if nxt == chain[-1] or nxt.resolve() in {p.resolve() for p in chain}:
            notes.append(f"{path}: continued by a resumed run that is not here; left out")
            return None
        chain.append(nxt)
    if len(chain) > 1:
        notes.append(f"{path}: continued by a resumed run (trainer.resume); read as {chain[-1]}")
    return chain[-1]


def find_run_dirs(inputs, notes: list | None = None) -> list[Path]:
    """Run folders named by ``inputs``: each a run folder, its summary.json, or a folder of runs.

    A run folder that a resume continued (summary.json ``status: continued``) stands for the
    newest folder of its chain; ``notes`` gets one line for each."""
    notes = [] if notes is None else notes
    found: list[Path] = []
    for item in map(Path, inputs):
        if item.is_file() and item.name == "summary.json":
            found.append(item.parent)
        elif not item.exists():
            raise ReportInputError(f"{item}: no such file or folder")
        elif _is_run_dir(item):
            found.append(item)
        else:
            below = _search(item, 1)
            if not below:
                raise ReportInputError(f"{item}: no run folders (with summary.json) found")
            found.extend(below)
    chained = [_newest_of_chain(p, notes) for p in found]
    return list(dict.fromkeys(p.resolve() for p in chained if p is not None))


def _search(folder: Path, depth: int) -> list[Path]:
    """Run folders below ``folder``, skipping hidden folders (.hydra) and earlier report output."""
    runs = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        if child.name.startswith(".") or child.name == "report":
            continue
        if _is_run_dir(child):
            runs.append(child)
        elif depth < _MAX_DEPTH:
            runs.extend(_search(child, depth + 1))
    return runs


def load_runs(inputs, notes: list | None = None, finished_only: bool = False) -> list[Run]:
    """Load every run under ``inputs``; any unusable summary stops the report (no silent gaps).
    ``notes`` gets a line for each run folder read as the resumed run that continued it and, with
    ``finished_only`` (a sweep still running), for each folder left out because it has no summary.json
    yet: the report says which runs it does not contain."""
    dirs = find_run_dirs(inputs, notes)
    if finished_only:
        unfinished = [d for d in dirs if not (d / "summary.json").exists()]
        if notes is not None:
            notes += [f"{d}: unfinished (no summary.json yet), left out (--finished-only)" for d in unfinished]
        dirs = [d for d in dirs if d not in unfinished]
    return [Run(d, _load_summary(d / "summary.json"), _load_records(d / "metrics.jsonl")) for d in dirs]


def set_aside_reason(run: Run) -> str | None:
    """Why a run is no evidence for the AMP-vs-FP32 comparison, or None when it is usable."""
    s = run.summary
    status = s.get("status", "completed")
    if status != "completed":
        return f"status '{status}', not completed"
    if s.get("all_steps_skipped"):
        return f"every one of its {s.get('steps')} steps was skipped: the weights never changed"
    requested, effective = str(s["requested_precision"]), str(s["effective_precision"])
    if requested != "fp32" and effective == "fp32":
        # Paddle silently runs FP32 where AMP is unsupported: such a run says nothing about AMP.
        return (f"requested {requested} but computed in FP32 on {s.get('device', 'an unknown device')}: "
                "not AMP evidence")
    return None


def start_of(summary: dict) -> str:
    """Where training started: "" from scratch, else the weights it fine-tuned from, named by their
    run folder (``<run>/checkpoints/best.pdparams``) or file name."""
    base = summary.get("pretrained")
    if not isinstance(base, dict) or not base.get("file"):
        return ""
    path = Path(str(base["file"]))
    return path.parent.parent.name if path.parent.name == "checkpoints" else path.name


def group_key(run: Run) -> tuple:
    """Runs are comparable when model, data, training length, global batch and the weights training
    started from (by path; their sha256 is checked by :func:`mixed_provenance`) all match."""
    s = run.summary
    return (str(s["model"]), str(s["data"]), int(s["steps"]), int(s["global_batch_size"]), start_of(s))


def group_runs(runs: list[Run]) -> tuple[dict, list[SetAside]]:
    """{group key: {variant (effective precision, static scale named): [runs by seed]}} and the
    list of set-aside runs."""
    groups: dict = defaultdict(lambda: defaultdict(list))
    aside = []
    for run in runs:
        reason = set_aside_reason(run)
        if reason:
            aside.append(SetAside(run.path, reason))
        else:
            groups[group_key(run)][run.variant].append(run)
    for by_prec in groups.values():
        for lst in by_prec.values():
            lst.sort(key=lambda r: (seed_order(r.summary["seed"]), str(r.path)))
    return {k: dict(v) for k, v in sorted(groups.items())}, aside


def seed_order(seed) -> tuple:
    """Sort key for seeds: by number (0, 1, 2, 10; as text 10 came before 2), other labels after."""
    try:
        return (0, int(seed), "")
    except (TypeError, ValueError):
        return (1, 0, str(seed))


def _versions(s: dict) -> dict:
    v = s.get("versions")
    if isinstance(v, dict):
        return {str(k): str(x) for k, x in v.items()}
    return {"paddle": str(s["paddle_version"])} if "paddle_version" in s else {}


def provenance_of(run: Run) -> dict:
    """What must agree between compared runs: git revision, library versions, data set, config, and
    the weights file a fine-tuned run started from (its sha256: the config only names its path)."""
    s = run.summary
    base = s.get("pretrained")
    out = {"git revision": s.get("git_revision"), "data-set version": s.get("data_version"),
           "config (without amp and seed)": s.get("config_digest"),
           "pretrained weights (sha256)": base.get("sha256") if isinstance(base, dict) else None}
    for lib, ver in _versions(s).items():
        out[f"{lib} version"] = ver
    return out


def mixed_provenance(groups: dict) -> list[str]:
    """Differences that make runs incomparable: git revision and library versions over all compared
    runs, data-set version and config digest within each group. Empty when everything agrees."""
    def differs(runs, keys, where):
        found = []
        for key in keys:
            values: dict = {}
            for r in runs:
                v = provenance_of(r).get(key)
                values.setdefault("not recorded" if v is None else str(v), []).append(r.path.name)
            if len(values) > 1:
                parts = ", ".join(f"{v if len(v) <= 48 else v[:12]} ({len(p)} run{'s' if len(p) > 1 else ''}: {', '.join(p[:3])}"
                                  f"{', ...' if len(p) > 3 else ''})" for v, p in sorted(values.items()))
                found.append(f"{key} differs{where}: {parts}")
        return found

    every = [r for by_prec in groups.values() for runs in by_prec.values() for r in runs]
    libs = sorted({k for r in every for k in provenance_of(r) if k.endswith(" version")
                   and k != "data-set version"})
    out = differs(every, ["git revision", *libs], "")
    for key, by_prec in groups.items():
        runs = [r for lst in by_prec.values() for r in lst]
        out += differs(runs, ["data-set version", "config (without amp and seed)", "pretrained weights (sha256)"],
                       f" within {key[0]} / {key[1]}")
    return out
