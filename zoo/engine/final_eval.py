"""After training: evaluation noise and the eval-only effect of AMP (issue 12 item 2).

- ``trainer.bootstrap_resamples``: a bootstrap CI over validation images of the primary metric of
  the final evaluation (the task's ``bootstrap_primary``), so the report can tell evaluation noise
  from training noise.
- ``trainer.eval_precision``: ``train`` keeps the final evaluation in the training precision only;
  ``fp32`` and ``both`` also evaluate the same final weights (EMA weights when EMA is on) in FP32,
  in a fresh FP32 copy of the model, recorded as ``metrics_fp32_eval``. With ``fp32`` that
  evaluation is the run's primary metric. The difference between the two is the part of an AMP
  effect that is inference only; what remains is a training effect.
"""
from __future__ import annotations

import contextlib
import logging

import numpy as np
import paddle

from zoo.amp import Amp
from zoo.engine.evaluate import evaluate, nonfinite_line
from zoo.utils import distributed as dist
from zoo.utils.checks import COUNT_OR_ZERO, check

log = logging.getLogger(__name__)

EVAL_PRECISIONS = ("train", "fp32", "both")
BOOTSTRAP_RESAMPLES = COUNT_OR_ZERO.but(note="0 = off")


def check_settings(eval_precision, bootstrap_resamples) -> None:
    """Fail before training on a bad ``trainer.eval_precision`` / ``trainer.bootstrap_resamples``."""
    if eval_precision not in EVAL_PRECISIONS:
        raise ValueError(f"trainer.eval_precision: expected one of {', '.join(EVAL_PRECISIONS)}, "
                         f"got {eval_precision!r}")
    check("trainer.bootstrap_resamples", bootstrap_resamples, BOOTSTRAP_RESAMPLES)


def _bootstrap(task, n_resamples: int) -> dict | None:
    if n_resamples <= 0 or not hasattr(task, "bootstrap_primary"):
        return None
    return task.bootstrap_primary(n_resamples)


def _fp32_weights(trainer) -> dict:
    """The weights the final evaluation used (EMA applied when on), as fp32 NumPy copies."""
    model = dist.unwrap(trainer.model)
    weights = trainer.ema.applied(model) if trainer.ema is not None else contextlib.nullcontext()
    with weights:
        state = {}
        for k, v in model.state_dict().items():
            arr = v.astype("float32").numpy() if v.dtype in (paddle.float16, paddle.bfloat16) else v.numpy()
            state[k] = np.array(arr, copy=True)
    return state


def after_training(trainer, make_model, metrics: dict, eval_precision: str, n_resamples: int) -> dict:
    """Summary entries: primary metric (with its bootstrap CI) and, if asked, the FP32 evaluation.

    ``make_model`` builds a fresh FP32 model of the run's architecture; ``metrics`` are the final
    evaluation's (in the training precision).
    """
    task, primary = trainer.task, trainer.task.primary_metric
    trainer.phase = "final evaluation"  # a stop signal is honoured between the parts (trainer.stop)
    trainer.stop.check()
    numerics = trainer.last_eval.get("numerics") or {}
    own = {"name": primary, "value": metrics[primary], "evaluated_in": trainer.amp.effective,
           "ci": _bootstrap(task, n_resamples), "nonfinite_images": numerics.get("nonfinite_images")}
    trainer.stop.check()
    out = {"eval_precision": eval_precision, "primary_metric": own}
    if eval_precision == "train":
        return out
    if not trainer.amp.active:  # an FP32 run: its evaluation already is the FP32 one
        fp32_metrics, fp32_ci, fp32_numerics = dict(metrics), own["ci"], numerics
    else:
        trainer.phase = "FP32 evaluation"
        model = make_model()
        model.set_state_dict(_fp32_weights(trainer))
        fp32_metrics = evaluate(model, task, Amp(), trainer.val_set, trainer.eval_batch_size,
                                trainer.settings.num_workers, False, stop=trainer.stop)
        fp32_ci, fp32_numerics = _bootstrap(task, n_resamples), fp32_metrics.numerics
        trainer.stop.check()
        if dist.is_main():
            log.info("FP32 evaluation of the final weights: %s %.4f (%s: %.4f)", primary,
                     fp32_metrics[primary], trainer.amp.effective, metrics[primary])
            said = nonfinite_line(fp32_metrics, "fp32")
            if said:
                log.warning("%s", said)
    out["metrics_fp32_eval"] = dict(fp32_metrics)
    out["eval_numerics_fp32"] = fp32_numerics
    fp32_primary = {"name": primary, "value": fp32_metrics[primary], "evaluated_in": "fp32", "ci": fp32_ci,
                    "nonfinite_images": fp32_numerics.get("nonfinite_images")}
    out["primary_metric_fp32_eval"] = fp32_primary
    if eval_precision == "fp32":
        out["primary_metric"] = fp32_primary
        out["primary_metric_train_precision_eval"] = own
    return out
