"""Validation error of every replica stored in a checkpoint (one process, no MPI).

    python benchmarks/replicas.py RUN_DIR_OR_CHECKPOINT

A checkpoint holds every rank's parameters and BN statistics (docs/cli.md).  This evaluates each
rank's replica on the whole validation split, the way the run's own evaluation does for the
evaluated model: for easgd/asgd rank 0 is the server's center/master, evaluated with the workers'
mean BN statistics (as ``ServerMethod.load_eval_model``); for the other methods, rank i's own
parameters and statistics.  Used by experiments 6 (EASGD: the center against the workers).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from scalesgd import config as C
from scalesgd.data.pipeline import Loader
from scalesgd.data.shards import ShardSet
from scalesgd.io import checkpoint as ckpt
from scalesgd.nn.resnet import ResNet
from scalesgd.train.loop import evaluate_local


def evaluate_checkpoint(path: str | Path) -> dict:
    """{"path", "method", "errors": [rank 0, rank 1, ...]} (top-1 validation error of each replica)."""
    path = Path(path)
    if path.is_dir():
        path = ckpt.latest_good(ckpt.checkpoint_dir(path))
    meta = ckpt.read_meta(path)
    cfg = C.build(meta["config"])
    data_root = Path(json.loads((path.parents[1] / "summary.json").read_text())["dataset"]) \
        if (path.parents[1] / "summary.json").exists() else None
    if data_root is None:
        raise FileNotFoundError(f"{path}: no summary.json beside its checkpoints (dataset unknown)")
    val = ShardSet.open(data_root, "val")
    m, d = cfg.model, cfg.data
    model = ResNet(m.model, val.num_classes, m.width, m.zero_init_residual, np, m.dtype, seed=None)
    loader = Loader(val, train=False, batch_size=64, image_size=d.image_size, mean=d.mean, std=d.std,
                    augment="center", flip=False, val_resize=d.val_resize or None, seed=cfg.train.seed,
                    dtype=m.dtype, num_threads=1)
    ranks = [ckpt.read_rank(path, r)[1] for r in range(meta["ranks"])]
    server = meta["method"] in ("easgd", "asgd")
    errors = []
    for r, arrays in enumerate(ranks):
        model.ps.params[...] = arrays["params"]
        if server and r == 0:
            model.ps.buffers[...] = np.mean([a["buffers"] for a in ranks[1:]], axis=0)
        else:
            model.ps.buffers[...] = arrays["buffers"]
        c1, _, n = evaluate_local(model, loader)
        errors.append(1.0 - c1 / n)
    return dict(path=str(path), method=meta["method"], global_samples=meta["global_samples"],
                errors=errors)


if __name__ == "__main__":
    print(json.dumps(evaluate_checkpoint(sys.argv[1])))
