"""Deploy check (issue 35): does a Paddle inference model, as PaddleOCR / PaddleDetection / PaddleClas /
PaddleX write it, keep its predictions on the user's own images when run in fp16 / bf16?

No labels are needed: the same images go through the model in FP32 and in emulated low precision
and the two predictions are compared image by image. ``inputs`` lists and reads the images,
``preprocess`` turns one into the model's feeds, ``tasks`` turns outputs into predictions and
scores the agreement of two, ``agreement`` pools it over images into a verdict.
"""
