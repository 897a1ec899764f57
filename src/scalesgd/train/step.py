"""One training step and one evaluation step: forward + loss (+ backward).  No communication."""
from __future__ import annotations

from ..backend import get_array_module
from ..nn.layers import softmax_cross_entropy


def train_step(model, x, y, label_smoothing: float = 0.0, grad_scale: float = 1.0):
    """x: (N, H, W, 3), y: (N,) int -> (mean loss, number of top-1 errors), both 0-d xp arrays.

    Fills ``model.ps.grads`` with ``grad_scale`` x the gradient of the mean loss (backward is linear
    in dL/dlogits, so scaling that small array scales every gradient for free: an all-reduce SUM of
    gradients scaled by 1/p is their average, with no extra pass over the flat buffer).
    BN running statistics are updated as a side effect.
    """
    logits, cache = model.forward(x, True)
    loss, dlogits, pred = softmax_cross_entropy(logits, y, label_smoothing)
    if grad_scale != 1.0:
        dlogits *= grad_scale
    model.backward(dlogits, cache)
    return loss, (pred != y).sum()


def eval_step(model, x, y, k: int = 5, crops: int = 1):
    """(number correct top-1, number correct top-k) on one batch, model in eval mode.

    crops > 1: x holds ``crops`` consecutive rows per sample, (N*crops, ...) for y (N,); the
    softmax probabilities of each sample's crops are averaged (ten-crop evaluation)."""
    xp = get_array_module(x)
    logits, _ = model.forward(x, False)
    if crops > 1:
        p = xp.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        logits = p.reshape(-1, crops, p.shape[1]).mean(axis=1)        # (N, classes)
    k = min(k, logits.shape[1])
    topk = xp.argpartition(-logits, k - 1, axis=1)[:, :k]
    top1 = logits.argmax(axis=1)
    return (top1 == y).sum(), (topk == y[:, None]).any(axis=1).sum()
