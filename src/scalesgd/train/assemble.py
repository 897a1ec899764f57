"""The composition root: the one place a run is put together, for an MPI job (``cli.run``) and a
virtual cluster's ranks (``virtual/run.py``) alike:

    config -> topology and roles (``methods.create``) -> backend (the caller's) -> data (``open_splits``)
    -> model, optimizer, loaders (``build``) -> resume check or warm start (``resuming``)
    -> the gradient role's ``attach`` -> the fast-path check -> a ``Setup`` for ``loop.train``

Everything is validated before anything is written to disk.  What differs between the two callers
is passed in, not branched on: the backend, the data threads, shared splits (the virtual ranks share
one copy), ``settle`` (the MPI job's ``cli.together``: a user error on any rank ends every rank with
one report) and ``share_with`` (a virtual rank reuses rank 0's im2col buffers).
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import fastpaths
from ..config import Config
from ..data.pipeline import Loader, train_steps
from ..data.shards import ShardSet
from ..errors import DataError
from ..methods import create
from ..nn.kernels import Kernels
from ..nn.resnet import ResNet
from ..optim.sgd import SGD
from . import resuming
from .control import Control
from .graphstep import graph_components


@dataclass
class Setup:
    """Everything a run needs, built (and validated) before anything is written to disk."""

    cfg: Config
    topo: object
    backend: object
    method: object                 # the exchange strategy (methods/)
    control: Control               # signals and phase counters
    model: ResNet
    opt: SGD
    train_data: Loader | None      # None on a server rank
    val_data: Loader | None
    data_root: Path
    train_samples: int             # size of the training split
    fast_paths: fastpaths.Report = field(default_factory=fastpaths.Report)   # set by fastpaths.check
    splits: tuple = ()             # the (train, val) ShardSets the loaders read (a shrunk job's new
    data_threads: int = 1          # loaders read them too: train/survive.py)
    blas_threads: tuple | None = None   # (fewest, most) BLAS threads of this allocation's ranks
                                        # (None: not recorded, the virtual cluster's)
    metrics_observer: Callable | None = None   # sees each metrics row written (MetricsWriter's
                                               # observe: a virtual rank's tape, for a re-timing)

    @property
    def roles(self):
        return self.method.roles

    @property
    def samples_per_epoch(self) -> int:
        """Global samples per epoch: whole global batches of the training split."""
        return samples_per_epoch(self.train_samples, self.cfg.data.batch_size, self.roles.num_workers)


def samples_per_epoch(train_samples: int, batch_size: int, workers: int) -> int:
    """Global samples per epoch: ``data.pipeline.train_steps`` global batches; 0 if none fits."""
    return train_steps(train_samples, batch_size, workers) * batch_size * workers


def require_one_step(n: int, batch_size: int, workers: int, data_root) -> int:
    """``train_steps``, refusing with a DataError a global batch larger than the training split
    (the real program, the virtual cluster and both dry runs say it the same way)."""
    steps = train_steps(n, batch_size, workers)
    if steps < 1:
        raise DataError(f"data.batch_size: {batch_size} x {workers} workers exceeds the "
                        f"{n} training samples in {data_root} (a smaller --batch-size, or fewer workers)")
    return steps


def open_splits(data_root: Path, cache_mb: int) -> tuple[ShardSet, ShardSet]:
    """The train and val ShardSets of ``data_root``, each read into memory when its files total at
    most ``cache_mb`` MiB (``data.cache_mb``)."""
    sets = ShardSet.open(data_root, "train"), ShardSet.open(data_root, "val")
    for s in sets:
        if cache_mb and s.disk_bytes <= cache_mb * 2**20:
            s.load()
    return sets


def build(cfg: Config, topo, backend, method, control: Control, data_root: Path,
          data_threads: int, splits: tuple[ShardSet, ShardSet] | None = None, make_loaders=None) -> Setup:
    """Opens the shards (or uses ``splits``, as ``open_splits`` returns: the virtual cluster's
    ranks share one copy), builds the model (identical init from the seed), optimizer and loaders."""
    train_shards, val_shards = splits or open_splits(data_root, cfg.data.cache_mb)
    m, d = cfg.model, cfg.data
    if getattr(backend, "is_gpu", False):          # GPU only: precision and conv path (logged once)
        from .. import backend as backend_mod  # noqa: PLC0415
        from ..nn import cudnn_conv  # noqa: PLC0415
        backend_mod.set_precision(m.precision)
    model = ResNet(m.model, train_shards.num_classes, m.width, m.zero_init_residual, backend.xp, m.dtype,
                   seed=cfg.train.seed, conv_algo=m.conv_algo, kernels=Kernels(m.kernels))
    if getattr(backend, "is_gpu", False):
        cudnn_conv.attach(model, m.conv_impl, m.precision, backend, m.dtype)
    elif topo.is_root:
        gpu_only = [f"model.{k} = {v}" for k, v in (("conv_impl", m.conv_impl), ("precision", m.precision))
                    if v not in ("auto", "im2col", "fp32")]
        gpu_only += ["train.cuda_graph = true"] * cfg.train.cuda_graph
        if gpu_only:       # a GPU job file run on CPUs: kept (the same file serves both), but said once
            logging.warning("warning: %s: GPU only; on NumPy (%s) this changes nothing",
                            ", ".join(gpu_only), "CPU convolutions follow model.conv_algo")
    opt = SGD(model.ps.params, cfg.optim, model.ps.decay_mask(), model.kernels)
    roles, n = method.roles, train_shards.num_samples
    steps = require_one_step(n, d.batch_size, roles.num_workers, data_root)
    if steps < 10 and topo.is_root:            # warned once; an explicit batch is kept as set
        logging.warning("warning: an epoch is only %d step(s) (%d training samples / global batch %d "
                        "= %d workers x data.batch_size %d): too few updates to train well; a smaller "
                        "--batch-size gives more", steps, n, d.batch_size * roles.num_workers,
                        roles.num_workers, d.batch_size)
    train, val = (make_loaders or loaders)(cfg, (train_shards, val_shards), roles, backend, data_threads)
    return Setup(cfg, topo, backend, method, control, model, opt, train, val, data_root, n,
                 splits=(train_shards, val_shards), data_threads=data_threads)


def loaders(cfg: Config, splits, roles, backend, data_threads: int) -> tuple[Loader | None, Loader | None]:
    """This worker's (train, val) loaders over ``splits``, its part by ``roles``; (None, None) on a
    server rank."""
    if roles.is_server:
        return None, None
    d = cfg.data
    common = dict(batch_size=d.batch_size, image_size=d.image_size, mean=d.mean, std=d.std,
                  num_threads=data_threads, device_id=backend.device_id, dtype=_input_dtype(cfg),
                  val_resize=d.val_resize or None, rank=roles.worker_index,
                  world=roles.num_workers, seed=cfg.train.seed)
    train = Loader(splits[0], train=True, augment=d.augment, scale=d.scale, flip=d.flip,
                   lighting=d.lighting, **common)
    val = Loader(splits[1], train=False, augment="center", flip=False, ten_crop=d.ten_crop, **common)
    return train, val


def _input_dtype(cfg: Config) -> str:
    """data.output_dtype, or the model's dtype when it is 'model' (float32 unless float16)."""
    want = cfg.data.output_dtype
    return want if want != "model" else ("float16" if cfg.model.dtype == "float16" else "float32")


def assemble(cfg: Config, topo, backend, data_root: Path, data_threads: int, resume: Path | None = None,
             *, splits: tuple[ShardSet, ShardSet] | None = None, settle=contextlib.nullcontext,
             share_with: Setup | None = None, check_fast_paths: bool = True, make_loaders=None) -> Setup:
    """Collective: this rank's whole run (``cfg`` already fitted to the world), ready for
    ``loop.train(setup, run_dir, resume)``.  The method refuses a wrong rank count first (on every
    rank alike, before any collective); inside ``settle()``: the data, model, optimizer and
    loaders, then the checkpoint ``resume`` is checked to fit this model, or ``train.init_from`` is
    loaded (warm start).  Then the gradient role's ``attach`` (a collective: the all-reduce's
    transport) and the GPU fast-path check (``check_fast_paths``; a collective over
    ``topo.comm``).  ``make_loaders``: instead of ``loaders`` (the virtual cluster's clock-only
    runs: ``virtual/clockonly.py``)."""
    control = Control(topo.transport, topo.size)
    method = create(cfg, topo, control.signals, control.trace)
    with settle():
        setup = build(cfg, topo, backend, method, control, data_root, data_threads, splits, make_loaders)
        if resume is not None:
            resuming.check_fits(setup, resume)
        elif cfg.train.init_from:
            resuming.warm_start(setup, Path(cfg.train.init_from))
    if share_with is not None:
        setup.model.share_workspaces(share_with.model)     # one replica computes at a time
    method.gradients.attach(setup.model)
    if check_fast_paths:
        setup.fast_paths = fastpaths.check(
            cfg, topo, setup.model, backend, (setup.train_data, setup.val_data), method,
            then=(lambda: graph_components(setup.model, backend, cfg, cfg.data.batch_size))
            if cfg.train.cuda_graph else None)
    return setup
