"""Training engine: loop, evaluation, checkpoints, schedules, EMA, distributed helpers."""
