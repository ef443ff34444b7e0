"""PaddleOCR's detection ResNet_vd, with PaddleOCR's state-dict names.

The layout follows PaddleOCR ``ppocr/modeling/backbones/det_resnet_vd.py``
(class ``ResNet_vd``, without deformable convs), so DB checkpoints such as
``det_r50_vd_db_v2.0_train`` load without renaming. It differs from the
PaddleClas layout of :mod:`zoo.models.resnet`:

- ``conv1_1``, ``conv1_2``, ``conv1_3``: the 3x3 stem 3->32->32->64 (first
  one strided), each ``{name}._conv.weight`` + ``{name}._batch_norm.*``;
- ``bb_{stage}_{i}``: blocks named by stage and index within the stage, with
  ``conv0``, ``conv1`` (``conv2`` for bottlenecks) and, on the first block of
  each stage, the projection ``short``, all ``._conv`` / ``._batch_norm``.

As in upstream, the first block of *every* stage has a projection (even in
stage 0 of ResNet18/34, where channels do not change); it is a plain 1x1 conv
there, and a 2x2 average pool (ceil mode) + 1x1 conv in later stages. The
block's first 3x3 conv carries the stride.
"""

from __future__ import annotations

from paddle import nn

__all__ = ["DetResNetVd"]

# layers -> blocks per stage (ppocr's table).
_DEPTHS = {
    18: (2, 2, 2, 2),
    34: (3, 4, 6, 3),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 12, 48, 3),
}
_WIDTHS = (64, 128, 256, 512)


class ConvBNLayer(nn.Layer):
    """Optional 2x2 avg pool, conv (no bias), BatchNorm, optional ReLU.

    Persisted as ``_conv.weight`` and ``_batch_norm.*`` (PaddleOCR's names).
    """

    def __init__(self, in_ch, out_ch, kernel, stride=1, act=False, avg_down=False):
        super().__init__()
        # Exclusive averaging in ceil mode: odd sizes round up, like upstream.
        self._pool2d_avg = nn.AvgPool2D(2, 2, ceil_mode=True) if avg_down else None
        self._conv = nn.Conv2D(in_ch, out_ch, kernel, stride=stride,
                               padding=(kernel - 1) // 2, bias_attr=False)
        self._batch_norm = nn.BatchNorm2D(out_ch)
        self._relu = nn.ReLU() if act else None

    def forward(self, x):
        if self._pool2d_avg is not None:
            x = self._pool2d_avg(x)
        x = self._batch_norm(self._conv(x))
        return self._relu(x) if self._relu is not None else x


class BasicBlock(nn.Layer):
    """Two 3x3 convs (the first strided) plus identity or ``short`` projection."""

    expansion = 1

    def __init__(self, in_ch, width, stride, project, avg_down):
        super().__init__()
        self.conv0 = ConvBNLayer(in_ch, width, 3, stride, act=True)
        self.conv1 = ConvBNLayer(width, width, 3)
        self.short = ConvBNLayer(in_ch, width, 1, avg_down=avg_down) if project else None
        self.relu = nn.ReLU()

    def forward(self, x):
        short = x if self.short is None else self.short(x)
        return self.relu(self.conv1(self.conv0(x)) + short)


class BottleneckBlock(nn.Layer):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, plus identity or ``short``."""

    expansion = 4

    def __init__(self, in_ch, width, stride, project, avg_down):
        super().__init__()
        out_ch = width * self.expansion
        self.conv0 = ConvBNLayer(in_ch, width, 1, act=True)
        self.conv1 = ConvBNLayer(width, width, 3, stride, act=True)
        self.conv2 = ConvBNLayer(width, out_ch, 1)
        self.short = ConvBNLayer(in_ch, out_ch, 1, avg_down=avg_down) if project else None
        self.relu = nn.ReLU()

    def forward(self, x):
        short = x if self.short is None else self.short(x)
        return self.relu(self.conv2(self.conv1(self.conv0(x))) + short)


class DetResNetVd(nn.Layer):
    """ResNet_vd feature extractor returning four maps (strides 4, 8, 16, 32).

    Args:
        in_channels: image channels.
        layers: 18, 34 (basic blocks), 50, 101, 152 or 200 (bottlenecks).

    ``out_channels`` lists the channels of the four outputs: [64, 128, 256,
    512] for 18/34 and [256, 512, 1024, 2048] from 50 on.
    """

    def __init__(self, in_channels=3, layers=50):
        super().__init__()
        if layers not in _DEPTHS:
            raise ValueError(f"unsupported ResNet_vd layers {layers!r}; allowed: {sorted(_DEPTHS)}")
        self.layers = layers
        block_cls = BottleneckBlock if layers >= 50 else BasicBlock

        self.conv1_1 = ConvBNLayer(in_channels, 32, 3, stride=2, act=True)
        self.conv1_2 = ConvBNLayer(32, 32, 3, act=True)
        self.conv1_3 = ConvBNLayer(32, 64, 3, act=True)
        self.pool2d_max = nn.MaxPool2D(kernel_size=3, stride=2, padding=1)

        # Blocks are registered directly on self as bb_{stage}_{i} (upstream's
        # names), so stages are kept as lists of those names, not as layers.
        self._stage_names = []
        self.out_channels = []
        in_ch = 64
        for stage, (count, width) in enumerate(zip(_DEPTHS[layers], _WIDTHS)):
            names = []
            for i in range(count):
                first = i == 0
                name = f"bb_{stage}_{i}"
                self.add_sublayer(name, block_cls(
                    in_ch, width,
                    stride=2 if first and stage > 0 else 1,
                    project=first,
                    # Stage 0 does not downsample, so its projection has no pool.
                    avg_down=first and stage > 0,
                ))
                names.append(name)
                in_ch = width * block_cls.expansion
            self._stage_names.append(names)
            self.out_channels.append(in_ch)

    def forward(self, x):
        """Return the list of the four stage outputs, shallowest first."""
        x = self.pool2d_max(self.conv1_3(self.conv1_2(self.conv1_1(x))))
        outs = []
        for names in self._stage_names:
            for name in names:
                x = getattr(self, name)(x)
            outs.append(x)
        return outs
