"""Diagnostics of AMP numerics, run outside training: the doctor, its probe and prescriptions,
the conformance check against Paddle's compiled AMP rule, and number-format statistics.

- :mod:`zoo.diagnostics.numerics`: formats (fp16/bf16 ranges) and exponent statistics of tensors;
- :mod:`zoo.diagnostics.probe`: records every op's output and gradient during a few steps;
- :mod:`zoo.diagnostics.doctor`: measures a model under FP32 and the emulation (``tools/amp_doctor.py``);
- :mod:`zoo.diagnostics.prescribe`: findings and fixes from what the doctor measured
  (:mod:`~zoo.diagnostics.findings`: severities and the verdict; :mod:`~zoo.diagnostics.gradient_findings`:
  the loss-scale window and underflow, judged by the gradient signal lost);
- :mod:`zoo.diagnostics.eval_probe`, :mod:`zoo.diagnostics.eval_findings`: the eval-mode forward on
  validation images, as evaluation runs it, and what overflows there;
- :mod:`zoo.diagnostics.fix_check`: a fix is printed only after the doctor judged again with it;
- :mod:`zoo.diagnostics.doctor_report`: the doctor's table, JSON, plot and HTML;
- :mod:`zoo.diagnostics.conformance`: the emulation's op decisions against Paddle's own
  (``tools/amp_conformance.py``).
"""
