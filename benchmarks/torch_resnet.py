"""The PyTorch reference of the benchmarks: scalesgd's ResNets written in plain ``torch.nn`` (no
torchvision), and a runner with the same interface as ``benchlib.OursRunner``.

torch is not a dependency of scalesgd: ``torch`` below is None when it does not import, and then
nothing else here may be used.  The networks follow ``scalesgd.nn.resnet.ARCHS``: CIFAR stem (3x3
conv) or ImageNet stem (7x7/2 conv + 3x3/2 max pool); basic blocks or bottlenecks (stride on the
3x3 conv); a projection shortcut (1x1 conv + BN) wherever the shape changes; Kaiming fan-out init.
Their parameter counts equal scalesgd's (ResNet-20 272,474; ResNet-18 11,689,512; ResNet-50
25,557,032 at 1000 classes), which the runner asserts.
"""
from __future__ import annotations

import contextlib

from benchlib import synthetic_batch

from scalesgd.nn.resnet import ARCHS

try:  # optional
    import torch
    import torch.nn as tnn
    import torch.nn.functional as F
except Exception:  # noqa: BLE001 - any import failure means "no torch column"
    torch = None

if torch is not None:
    def _shortcut(cin: int, cout: int, stride: int):
        """None (identity) or the projection 1x1 conv + BN, as scalesgd."""
        if stride == 1 and cin == cout:
            return None
        return tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout))

    class BasicBlock(tnn.Module):
        expansion = 1

        def __init__(self, cin: int, width: int, stride: int):
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, width, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(width)
            self.conv2 = tnn.Conv2d(width, width, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(width)
            self.downsample = _shortcut(cin, width, stride)

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)), inplace=True)
            out = self.bn2(self.conv2(out))
            out = out + (x if self.downsample is None else self.downsample(x))
            return F.relu(out, inplace=True)

    class Bottleneck(tnn.Module):
        expansion = 4

        def __init__(self, cin: int, width: int, stride: int):
            super().__init__()
            cout = width * 4
            self.conv1, self.bn1 = tnn.Conv2d(cin, width, 1, bias=False), tnn.BatchNorm2d(width)
            self.conv2 = tnn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(width)
            self.conv3, self.bn3 = tnn.Conv2d(width, cout, 1, bias=False), tnn.BatchNorm2d(cout)
            self.downsample = _shortcut(cin, cout, stride)

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)), inplace=True)
            out = F.relu(self.bn2(self.conv2(out)), inplace=True)
            out = self.bn3(self.conv3(out))
            out = out + (x if self.downsample is None else self.downsample(x))
            return F.relu(out, inplace=True)

    class TResNet(tnn.Module):
        """x: (N, 3, H, W) (NCHW or channels_last memory) -> logits (N, num_classes)."""

        def __init__(self, name: str, num_classes: int, width: float = 1.0):
            super().__init__()
            a = ARCHS[name]
            block = BasicBlock if a.block == "basic" else Bottleneck
            widths = [max(1, round(w * width)) for w in a.widths]        # as scalesgd's ResNet
            w0 = widths[0]
            stem = [tnn.Conv2d(3, w0, 7, 2, 3, bias=False) if a.stem == "imagenet"
                    else tnn.Conv2d(3, w0, 3, 1, 1, bias=False), tnn.BatchNorm2d(w0), tnn.ReLU(inplace=True)]
            self.stem = tnn.Sequential(*stem, *([tnn.MaxPool2d(3, 2, 1)] if a.stem == "imagenet" else []))
            blocks, cin = [], w0
            for si, (n, w) in enumerate(zip(a.stages, widths)):
                for bi in range(n):
                    blocks.append(block(cin, w, 2 if (bi == 0 and si > 0) else 1))
                    cin = w * block.expansion
            self.blocks = tnn.Sequential(*blocks)
            self.fc = tnn.Linear(cin, num_classes)
            for m in self.modules():
                if isinstance(m, tnn.Conv2d):
                    tnn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def forward(self, x):
            x = self.blocks(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class TorchRunner:
    """Training steps of ``TResNet(name)`` on the batch ``benchlib.synthetic_batch`` draws for the
    same arguments (so it sees OursRunner's data, as NCHW); SGD with Nesterov momentum 0.9 and weight
    decay 1e-4 on conv/linear weights only (scalesgd's mask).  ``precision`` "bf16" runs the forward
    under autocast; "tf32" allows TF32 matmuls and convolutions on a GPU."""

    def __init__(self, name: str, classes: int, size: int, batch: int, num_params: int, *,
                 channels_last: bool = True, precision: str = "fp32", device: str = "cpu",
                 seed: int = 0, lr: float = 0.01, width: float = 1.0):
        torch.manual_seed(seed)
        self.batch, self.device, self.amp = batch, device, precision == "bf16"
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.model = TResNet(name, classes, width)
        n = sum(p.numel() for p in self.model.parameters())
        assert n == num_params, f"torch {name}: {n} parameters, scalesgd has {num_params}"
        self.model = self.model.to(device=device, memory_format=fmt).train()
        decay = [p for p in self.model.parameters() if p.ndim > 1]
        rest = [p for p in self.model.parameters() if p.ndim <= 1]
        self.opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4},
                                    {"params": rest, "weight_decay": 0.0}],
                                   lr=lr, momentum=0.9, nesterov=True)
        x, y = synthetic_batch(batch, size, classes)
        self.x = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(device).contiguous(memory_format=fmt)
        self.y = torch.from_numpy(y).to(device)
        self._loss = float("nan")
        if device != "cpu":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
            torch.backends.cudnn.benchmark = True
            torch.cuda.reset_peak_memory_stats()

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cpu" if self.device == "cpu" else "cuda", dtype=torch.bfloat16,
                            enabled=self.amp):
            loss = F.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        self._loss = loss.detach()

    @property
    def loss(self) -> float:
        return float(self._loss)

    @contextlib.contextmanager
    def threads(self, n: int):
        """torch's intra-op threads set to ``n`` for the block, restored after."""
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def sync(self) -> None:
        if self.device != "cpu":
            torch.cuda.synchronize()

    def peak_bytes(self) -> int | None:
        return None if self.device == "cpu" else torch.cuda.max_memory_allocated()

