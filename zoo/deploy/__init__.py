"""The deploy check (issue 35): does a Paddle inference model, as PaddleOCR / PaddleDetection /
PaddleClas / PaddleX write it, keep its predictions on the user's own images when deployed in
fp16 / bf16? No labels are needed: the same images go through the model in FP32 and in emulated low
precision and the predictions are compared image by image.

Paddle Inference and ``paddle.jit.load`` run a saved program in C++, out of reach of the zoo's
emulation, which wraps the ``paddle._C_ops`` functions dygraph code calls. So the program is read
(:mod:`zoo.weights.program`) and run op by op with those functions (:mod:`zoo.deploy.interpreter`),
where the emulation and the per-op recorder see every op. ``inputs`` lists and reads the images,
``preprocess`` turns one into the model's feeds, ``tasks`` turns outputs into predictions and scores
the agreement of two, ``agreement`` pools it over images into a verdict, ``check`` runs one
precision, ``report`` writes what it found, ``run`` is tools/deploy_check.py's body.
"""
from zoo.deploy.errors import DeployError
from zoo.deploy.interpreter import SUPPORTED, ProgramNet
from zoo.deploy.program import OpDesc, Program, fold_batch_norms, load_program

__all__ = ["SUPPORTED", "DeployError", "OpDesc", "Program", "ProgramNet", "fold_batch_norms", "load_program"]
