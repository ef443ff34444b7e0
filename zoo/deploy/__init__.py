"""The deploy check (issue 35): does a Paddle inference model, as PaddleOCR / PaddleDetection /
PaddleClas / PaddleX write it, keep its predictions when deployed in fp16 / bf16?

Paddle Inference and ``paddle.jit.load`` run a saved program in C++, out of reach of the zoo's
emulation, which wraps the ``paddle._C_ops`` functions dygraph code calls. So the program is read
(:mod:`zoo.deploy.program`) and run op by op with those functions (:mod:`zoo.deploy.interpreter`),
where the emulation and the per-op recorder see every op.
"""
from zoo.deploy.interpreter import SUPPORTED, ProgramNet
from zoo.deploy.program import DeployError, OpDesc, Program, fold_batch_norms, load_program

__all__ = ["SUPPORTED", "DeployError", "OpDesc", "Program", "ProgramNet", "fold_batch_norms", "load_program"]
