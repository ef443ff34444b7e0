"""Runs PaddleOCR's own ``tools/train.py`` (started by :mod:`zoo.bench.paddleocr_train`).

    python _paddleocr_train_launcher.py PADDLEOCR_SRC CONFIG.yml

Imports nothing from the zoo (it runs in the interpreter holding PaddleOCR's requirements).
Prints one line ``AMPZOO_PADDLE {"version": ..., "cuda": ...}`` to stderr (the parent checks it is
the zoo's Paddle), then runs ``PADDLEOCR_SRC/tools/train.py -c CONFIG.yml`` as ``__main__``,
unmodified, with the one numpy >= 2.4 adaptation of the pipeline worker
(:func:`_paddleocr_pipeline_worker._numpy_24_shim`: the same draw from the same stream). Without it
upstream's ``EastRandomCropData`` raises on numpy 2.4 whenever the text leaves more than one free
region along an axis (``region_wise_random_select``), and its ``SimpleDataSet`` would log the
error and silently train on another image instead (the parent counts such errors and fails).
It also prints ``AMPZOO_PARAMS {"parameters": ..., "trainable": ...}`` for the model upstream's
``tools/train.py`` built (read as it passes through ``apply_to_static``, which returns it unchanged
unless ``Global.to_static``), so the parent can check both sides train the same network.
"""
from __future__ import annotations

import json
import os
import runpy
import sys


def main() -> None:
    src, config = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, src)
    import paddle

    print("AMPZOO_PADDLE " + json.dumps({"version": paddle.__version__,
                                         "cuda": bool(paddle.is_compiled_with_cuda())}),
          file=sys.stderr, flush=True)
    import ppocr.data.imaug.random_crop_data as rcd
    from _paddleocr_pipeline_worker import _numpy_24_shim

    _numpy_24_shim(rcd)
    import ppocr.modeling.architectures as arch

    to_static = arch.apply_to_static

    def counted(model, config, logger):
        params = model.parameters()
        print("AMPZOO_PARAMS " + json.dumps({
            "parameters": sum(int(p.numel()) for p in params),
            "trainable": sum(int(p.numel()) for p in params if not p.stop_gradient)}), file=sys.stderr, flush=True)
        return to_static(model, config, logger)

    arch.apply_to_static = counted  # tools/train.py imports it from there when it is run below
    train_py = os.path.join(src, "tools", "train.py")
    sys.argv = [train_py, "-c", config]
    runpy.run_path(train_py, run_name="__main__")


if __name__ == "__main__":
    main()
