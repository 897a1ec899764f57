"""A torchvision-free PyTorch ResNet-50 (bottleneck, stride on the 3x3 conv) for gpu_check.py.

Reuses bench_cpu.py's ``torch``/``nn`` imports and its TResNet conventions (kaiming fan_out init,
projection shortcuts when shapes change); the bottleneck block is new since bench_cpu.py has only
basic blocks.  Parameter count asserted equal to scalesgd's ResNet-50 (25,557,032 at 1000 classes).
"""
from __future__ import annotations

import bench_cpu as _B

torch = _B.torch                           # None when torch does not import (then nothing here runs)
tnn, F = getattr(_B, "tnn", None), getattr(_B, "F", None)

from scalesgd.nn.resnet import ARCHS

if tnn is not None:
    class TBottleneck(tnn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = tnn.Conv2d(cin, width, 1, bias=False), tnn.BatchNorm2d(width)
            self.conv2 = tnn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(width)
            self.conv3, self.bn3 = tnn.Conv2d(width, cout, 1, bias=False), tnn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False),
                                                 tnn.BatchNorm2d(cout))

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)), inplace=True)
            out = F.relu(self.bn2(self.conv2(out)), inplace=True)
            out = self.bn3(self.conv3(out))
            out = out + (x if self.downsample is None else self.downsample(x))
            return F.relu(out, inplace=True)


def resnet50(num_classes: int = 1000):
    a = ARCHS["resnet50"]
    w0 = a.widths[0]
    stem = tnn.Sequential(tnn.Conv2d(3, w0, 7, 2, 3, bias=False), tnn.BatchNorm2d(w0),
                          tnn.ReLU(inplace=True), tnn.MaxPool2d(3, 2, 1))
    blocks, cin = [], w0
    for si, (n, w) in enumerate(zip(a.stages, a.widths)):
        for bi in range(n):
            blocks.append(TBottleneck(cin, w, 2 if (bi == 0 and si > 0) else 1))
            cin = w * 4
    model = tnn.Sequential(stem, *blocks, tnn.AdaptiveAvgPool2d(1), tnn.Flatten(),
                           tnn.Linear(cin, num_classes))
    for m in model.modules():
        if isinstance(m, tnn.Conv2d):
            tnn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model
