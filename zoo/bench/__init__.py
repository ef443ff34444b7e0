"""Benchmarks (``tools/benchmark.py``, ``tools/pipeline_ab.py``): never imported by training.

- :mod:`zoo.bench.pipeline`: the input pipeline's stages, and PaddleOCR's own transforms beside it;
- :mod:`zoo.bench.paddleocr_train`: whole training runs of the zoo against PaddleOCR's tools/train.py;
- :mod:`zoo.bench.labels`: the DB label maps.
"""
