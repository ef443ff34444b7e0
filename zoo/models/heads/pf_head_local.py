"""PFHeadLocal: a DB head whose shrink map is refined at full resolution (PP-OCRv4/v5 server det).

The layout and outputs follow PaddleOCR ``ppocr/modeling/heads/det_db_head.py`` (classes
``PFHeadLocal`` and ``LocalModule``): :class:`~zoo.models.heads.DBHead`'s ``binarize`` and
``thresh`` branches, plus ``cbn_layer`` (:class:`LocalModule`), which takes the binarize branch's
last features (stride 2) upsampled 2x (nearest) and concatenated after the shrink map, and gives a
refined map through a 3x3 ConvBN + ReLU (``last_3.conv|bn``) and a biased 1x1 conv (``last_1``).

Outputs, as upstream's:

- eval: ``{"maps": 0.5 * (shrink + sigmoid(refined))}`` ([N, 1, H, W]);
- train: ``{"maps": [N, 3, H, W]}`` = (sigmoid(refined), threshold, binary), the binary map being
  the step function of the *unrefined* shrink map and the threshold, plus ``"cbn_maps"``: the
  binary map again ([N, 1, H, W]). Upstream's ``DBLoss`` (``ppocr/losses/det_db_loss.py``) adds a
  balanced BCE of that map against the shrink label when the output carries it (``loss_cbn``), and
  so does the zoo's :class:`~zoo.losses.DBLoss`. (Upstream names that entry ``cbn_maps`` and also
  returns the refined map as ``distance_maps``, which its loss reads only as a switch.)
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

from zoo.models.heads.db_head import DBHead
from zoo.models.necks.db_fpn import upsample_nearest

__all__ = ["LocalModule", "PFHeadLocal"]


class _ConvBNReLU(nn.Layer):
    """Bias-free conv + BatchNorm + ReLU as ``conv.*`` / ``bn.*``."""

    def __init__(self, in_ch, out_ch, kernel):
        super().__init__()
        self.conv = nn.Conv2D(in_ch, out_ch, kernel, padding=kernel // 2, bias_attr=False)
        self.bn = nn.BatchNorm2D(out_ch)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class LocalModule(nn.Layer):
    """``last_1(last_3(concat(init_map, features)))``: a 1-channel logit map at the features' size."""

    def __init__(self, in_channels, mid_channels):
        super().__init__()
        self.last_3 = _ConvBNReLU(in_channels + 1, mid_channels, 3)
        self.last_1 = nn.Conv2D(mid_channels, 1, 1)

    def forward(self, features, init_map):
        return self.last_1(self.last_3(paddle.concat([init_map, features], axis=1)))


class PFHeadLocal(DBHead):
    """DB head with a local refinement of the shrink map (see the module doc).

    Args:
        in_channels: channels of the neck output (PP-OCRv5 server det: 256).
        k: amplification factor of the differentiable step function.
        mode: "large" (``cbn_layer`` width ``in_channels // 4``, the server dets') or "small"
            (``in_channels // 8``).
        fix_nan: as :class:`~zoo.models.heads.DBHead` (off in the server det configs).
    """

    def __init__(self, in_channels, k=50, mode="large", fix_nan=False):
        super().__init__(in_channels, k=k, fix_nan=fix_nan)
        widths = {"large": in_channels // 4, "small": in_channels // 8}
        if mode not in widths:
            raise ValueError(f"PFHeadLocal: mode must be 'large' or 'small', got {mode!r}")
        if widths[mode] < 1:
            raise ValueError(f"PFHeadLocal: in_channels {in_channels!r} too small for mode {mode!r}")
        self.mode = mode
        self.cbn_layer = LocalModule(in_channels // 4, widths[mode])

    def forward(self, x):
        features = self.binarize.features(x)
        shrink = F.sigmoid(self.binarize.conv3(features))
        refined = F.sigmoid(self.cbn_layer(upsample_nearest(features, 2), shrink))
        if not self.training:
            return {"maps": 0.5 * (shrink + refined)}
        thresh = self.thresh(x)
        binary = self.step_function(shrink, thresh)
        return {"maps": paddle.concat([refined, thresh, binary], axis=1), "cbn_maps": binary}
