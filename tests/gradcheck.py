"""Float64 central finite differences, the oracle for every backward pass."""
from __future__ import annotations

import numpy as np


def numeric_grad(f, x: np.ndarray, idx=None, eps: float = 1e-6) -> np.ndarray:
    """Central differences of scalar ``f()`` w.r.t. entries ``idx`` of ``x`` (all if None); x
    changed in place."""
    flat = x.reshape(-1)
    idx = np.arange(flat.size) if idx is None else idx
    out = np.empty(len(idx))
    for k, i in enumerate(idx):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        out[k] = (fp - fm) / (2 * eps)
    return out


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    """||a - b|| / max(||a|| + ||b||, tiny): scale-free, robust for entries near zero."""
    a, b = np.ravel(a), np.ravel(b)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a) + np.linalg.norm(b), 1e-30))


def sample_idx(size: int, k: int, seed: int = 0) -> np.ndarray:
    """At most k distinct entries, chosen with a fixed seed (keeps big checks fast)."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(size, size=min(k, size), replace=False))
