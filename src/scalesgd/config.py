"""Typed, frozen, validated configuration: TOML file sections + command-line overrides.

A config has six sections, each a frozen dataclass: ``[model]``, ``[data]``, ``[optim]``,
``[schedule]``, ``[train]``, ``[dist]``.  Every field is also a command-line flag named after it (``--batch-size``,
``--lr``, ``--nesterov/--no-nesterov``...); field names are unique across sections.  Precedence:
defaults < ``--config FILE.toml`` < flags.  Unknown keys, wrong types, non-finite numbers and
out-of-range values raise :class:`ConfigError` naming the key.  The defaults are the built-in demo
(ResNet-20 on the digits).

Derived defaults follow the data and the job, but only for keys nobody set (``Config.explicit`` holds
the keys the job file or the flags set; an explicit value is never changed):

* ``data.scale`` follows ``data.image_size`` and ``data.augment`` (``build``);
* ``data.batch_size`` and, for ``asgd``, ``schedule.lr`` follow the number of workers
  (``fit_to_world``, applied once the rank count is known and logged by rank 0).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

from .choices import (AUGMENTS, CONV_ALGOS, CONV_IMPLS, DEVICES, GOSSIP_GRAPHS, GOSSIP_VARIANTS, METHODS,
                      PRECISIONS, PROGRESS_MODES, workers_of)
from .choices import ALLREDUCE_TRANSPORTS, FAST_PATH_MODES, HIERARCHIES, KERNEL_IMPLS, MPI_PROGRESS
from .errors import ConfigError  # noqa: F401 - re-exported: config.ConfigError
from .nn.resnet import ARCHS
from .optim.schedule import SCHEDULES, ScheduleConfig
from .optim.sgd import SGDConfig

# Derived defaults (used only when the key was not set; see the module docstring).
MULTISCALE_RATIO = (1.0, 1.25)          # multiscale: shorter side ~ image_size x U[1, 1.25] (32 -> 32..40)
RRC_SCALE = (0.08, 1.0)                 # rrc: crop area fraction (Inception / torchvision)
GLOBAL_BATCH = 64                       # the one-rank demo's batch, split over the workers ...
MIN_WORKER_BATCH = 8                    # ... but never below 8 per worker (batch-norm statistics)


def _f(default, help: str, choices=None, lo=None, hi=None, lo_open=False):
    meta = {"help": help, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelConfig:
    model: str = _f("resnet20", "network architecture", choices=tuple(ARCHS))
    width: float = _f(1.0, "multiplier on every stage width", lo=0, lo_open=True)
    zero_init_residual: bool = _f(False, "zero-init the last BN gamma of each residual block")
    dtype: str = _f("float32", "parameter and activation dtype", choices=("float32", "float64"))
    conv_impl: str = _f("auto", "GPU convolutions: im2col (cuBLAS GEMMs, the reference), cudnn (cuDNN "
                        "Frontend graphs), auto (cudnn when it imports and a GPU is present)",
                        choices=CONV_IMPLS)
    conv_algo: str = _f("auto", "convolutions on the xp path: im2col (one im2col matrix and GEMM per layer "
                        "for the whole batch), blocked (im2col + GEMM per block of images sized to the CPU's "
                        "L2 cache), taps (stride-1 3x3 convs image by image: width taps only, one GEMM "
                        "per kernel row), winograd (3x3/1 convs: Winograd F(4x4, 3x3)), auto (per layer "
                        "on NumPy: winograd from 64 channels on 8x8+ images, taps on 16x16+ images, "
                        "blocked for huge im2col matrices, else im2col; im2col on CuPy); see "
                        "docs/benchmarks.md",
                        choices=CONV_ALGOS)
    precision: str = _f("fp32", "GPU math: fp32, tf32 (tensor-core float32 GEMMs/convs), bf16 "
                        "(bf16 activations, float32 master weights)", choices=PRECISIONS)
    kernels: str = _f("fused", "GPU element-wise ops (BN apply, residual add+ReLU, the SGD update): fused "
                      "(one CUDA kernel each) or reference (the plain CuPy twins, to check the fused "
                      "ones); NumPy always runs the reference", choices=KERNEL_IMPLS)
    fast_paths: str = _f("auto", "start-up check of each GPU fast path (cuDNN graphs, fused kernels, device "
                         "all-reduce, DALI GPU decode) against its reference on small inputs: auto (a "
                         "failing one is turned off, with a warning), strict (a failing one is an error), "
                         "off (no check; only the references run); nothing to check on NumPy",
                         choices=FAST_PATH_MODES)


@dataclass(frozen=True)
class DataConfig:
    data: str = _f("", "dataset directory with manifest.json; empty = built-in digits (built on first use)")
    image_size: int = _f(32, "side of the square training/validation crops (pixels)", lo=8)
    batch_size: int = _f(64, "minibatch per worker; when unset, 64 split over the workers "
                         "(at least 8 each)", lo=1)
    augment: str = _f("multiscale", "training augmentation", choices=AUGMENTS)
    scale: tuple[float, float] = _f((32.0, 40.0), "multiscale: shorter side ~ U[lo, hi] pixels "
                                    "(unset: image_size x [1, 1.25]); rrc: crop area fraction ~ U[lo, hi] "
                                    "(unset: [0.08, 1])", lo=0, lo_open=True)
    flip: bool = _f(False, "random horizontal flips in training")
    val_resize: int = _f(0, "validation: shorter side before the centre crop (0 = image_size*256/224)",
                         lo=0)
    mean: tuple[float, float, float] = _f((123.675, 116.28, 103.53), "per-channel mean (0-255 units)")
    std: tuple[float, float, float] = _f((58.395, 57.12, 57.375), "per-channel std (0-255 units)",
                                         lo=0, lo_open=True)
    data_threads: int = _f(0, "DALI CPU threads per rank (0 = cores / ranks on the node)", lo=0)
    cache_mb: int = _f(256, "a split whose shard files total at most this many MiB is read into memory "
                       "once per process, instead of one HDF5 read per sample (0 = never)", lo=0)
    lighting: float = _f(0.0, "AlexNet PCA lighting noise std in training (0 = off; the papers used 0.1)",
                         lo=0)
    ten_crop: bool = _f(False, "validation: average the softmax over 4 corner + centre crops and their flips")
    output_dtype: str = _f("model", "dtype of the input batches (model = model.dtype)",
                           choices=("model", "float32", "float16"))


@dataclass(frozen=True)
class TrainConfig:
    method: str = _f("single", "training method", choices=METHODS)
    epochs: int = _f(12, "epochs to train", lo=1)
    seed: int = _f(0, "seed of the initial weights, data order and augmentation", lo=0)
    device: str = _f("auto", "cpu, gpu, or auto (GPU when CuPy sees one)", choices=DEVICES)
    label_smoothing: float = _f(0.0, "label smoothing of the cross-entropy", lo=0, hi=0.99)
    log_every: int = _f(10, "steps between log lines", lo=1)
    progress: str = _f("auto", "step display: bar (one line redrawn in place), lines (one every log_every "
                       "steps), off, auto (bar on a terminal unless an MPI launcher started the ranks)",
                       choices=PROGRESS_MODES)
    run_dir: str = _f("", "where results go (empty = runs/<time>-<method>-<model>)")
    checkpoint_every: float = _f(0.0, "epochs (of global samples) between checkpoints; 0 = only at the "
                                 "end and on SIGTERM/SIGUSR1", lo=0)
    checkpoint_minutes: float = _f(0.0, "also checkpoint every this many minutes of rank 0's clock "
                                   "(0 = off)", lo=0)
    keep_checkpoints: int = _f(3, "checkpoints kept in RUN_DIR/checkpoints (the newest)", lo=1)
    resume: str = _f("", "continue a run: its RUN_DIR (newest good checkpoint) or a checkpoint file")
    init_from: str = _f("", "warm start: every rank starts from the weights of this checkpoint file "
                        "(or a run directory's newest) with a fresh optimizer")
    stop_timeout: float = _f(180.0, "seconds a stop (SIGTERM/SIGUSR1) may take to checkpoint and end the "
                             "job; past it every rank exits 1 naming the phase it was stuck in "
                             "(0 = wait for ever)", lo=0)
    on_failure: str = _f("abort", "when a rank dies: abort (end the job; --resume continues it) or continue "
                         "(the survivors shrink the job and train on; needs an MPI with ULFM: Open MPI 5 "
                         "started with `mpiexec --with-ft ulfm`)", choices=("abort", "continue"))


@dataclass(frozen=True)
class DistConfig:
    bucket_mb: float = _f(-1.0, "allreduce: gradient bucket size (MB); -1 = auto (the gradients in about "
                          "8 buckets, each at least ranks x 64 KiB and at most 25 MB); 0 = one bucket",
                          lo=-1)
    overlap: bool = _f(True, "allreduce: start each bucket's all-reduce during backward")
    allreduce_transport: str = _f("auto", "allreduce: how GPU gradients are summed: nccl, cuda_aware_mpi "
                                  "(MPI on device memory), host (MPI on pinned host copies), auto "
                                  "(nccl if every rank has it, else cuda_aware_mpi if every MPI says so "
                                  "and a test passes, else host); NumPy gradients always use host",
                                  choices=ALLREDUCE_TRANSPORTS)
    beta: float = _f(0.8, "easgd: moving rate alpha = beta / workers", lo=0, hi=1, lo_open=True)
    tau: int = _f(1, "easgd, gossip and localsgd: local steps between exchanges", lo=1)
    slowmo_beta: float = _f(0.0, "localsgd: SlowMo's slow momentum on the averaged update (0 = plain "
                            "local SGD)", lo=0, hi=1)
    slowmo_lr: float = _f(1.0, "localsgd: SlowMo's outer learning rate alpha (1 with beta 0 = plain "
                          "local SGD)", lo=0, lo_open=True)
    servers: int = _f(1, "easgd and asgd: parameter-server ranks (0..K-1), each holding one contiguous "
                      "shard of the flat buffer; workers exchange with all of them at once", lo=1)
    max_staleness: int = _f(-1, "asgd: a push more than this many server versions stale is rejected (not "
                            "applied; the worker re-fetches); -1: unbounded; one server only", lo=-1)
    n_sync: int = _f(1, "asgd: local steps between push+fetch with the server", lo=1)
    gossip: str = _f("pull", "gossip variant", choices=GOSSIP_VARIANTS)
    gossip_gamma: float = _f(0.5, "gossip pull: x_i <- (1-gamma) x_i + gamma x_j", lo=0, hi=1,
                             lo_open=True)
    gossip_self: bool = _f(True, "gossip: a rank may pick itself as peer (as the authors' code)")
    gossip_graph: str = _f("uniform", "gossip: who a rank exchanges with: uniform (a random peer, as the "
                           "authors), exponential (rank + 2^k, k cycling), ring (rank + 1)",
                           choices=GOSSIP_GRAPHS)
    gossip_overlap: bool = _f(False, "gossip: start each exchange after the local step and complete it "
                              "before the next mix, in a communication thread, so it runs under the "
                              "next step's compute (the peer copy mixed in is one exchange older)")
    hierarchy: str = _f("none", "node: communicate in two levels, inside each node (shared memory) and "
                        "between nodes (one rank per node), nodes as MPI sees them; built so far for "
                        "allreduce (a two-level all-reduce over MPI host buffers); the other methods: "
                        "the ranks of a node average gradients every step and their leader exchanges "
                        "(gossip, local SGD) or talks to the server (easgd, asgd; servers stay alone)", choices=HIERARCHIES)
    mpi_progress: str = _f("auto", "what keeps a rank's MPI progressing while it computes, so that "
                           "one-sided calls aimed at it (gossip) never wait: auto (across nodes a "
                           "progress thread, or overlapped gossip's courier, which polls every 5 ms "
                           "when idle; on one node nothing), "
                           "thread (always), mpi (the MPI library's own asynchronous progress, set "
                           "before MPI_Init), none", choices=MPI_PROGRESS)
    mpi_progress_ms: float = _f(2.0, "milliseconds between two MPI_Iprobe of the progress thread",
                                lo=0, lo_open=True)
    straggler: str = _f("", "RANKS:DELAY_MS[:JITTER_MS], e.g. '1,3:100:50': those ranks sleep after "
                        "each backward pass")
    eval_every: float = _f(1.0, "epochs (of global samples) between validations", lo=0, lo_open=True)


SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": SGDConfig, "schedule": ScheduleConfig,
            "train": TrainConfig, "dist": DistConfig}
# fields of the imported optimizer/schedule dataclasses: help text and ranges live here
EXTRA_META = {
    "momentum": {"help": "momentum coefficient", "lo": 0, "hi": 1},
    "nesterov": {"help": "Nesterov momentum"},
    "weight_decay": {"help": "L2 weight decay", "lo": 0},
    "decay_bn_and_bias": {"help": "also apply weight decay to BN parameters and biases"},
    "lr": {"help": "base learning rate; when unset with asgd, divided by the workers", "lo": 0},
    "schedule": {"help": "learning-rate schedule", "choices": SCHEDULES},
    "milestones": {"help": "step schedule: epochs where lr is multiplied by gamma", "lo": 0},
    "gamma": {"help": "step schedule: decay factor", "lo": 0},
    "warmup_epochs": {"help": "linear warm-up length (epochs)", "lo": 0},
    "warmup_start_factor": {"help": "warm-up starts at this fraction of the peak rate", "lo": 0, "hi": 1},
    "epochs": {"help": "cosine schedule horizon (epochs; 0 = train.epochs)", "lo": 0},
    "final_lr_factor": {"help": "cosine schedule ends at this fraction of the peak", "lo": 0, "hi": 1},
    "linear_scaling": {"help": "scale lr by global batch / reference_batch"},
    "reference_batch": {"help": "batch the base lr is quoted for (linear scaling)", "lo": 1},
}


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: SGDConfig = field(default_factory=SGDConfig)
    schedule: ScheduleConfig = field(default_factory=lambda: ScheduleConfig(schedule="cosine", epochs=0.0))
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    # "section.key" of every key the job file or the flags set (not saved, not compared): derived
    # defaults never replace these
    explicit: frozenset = field(default=frozenset(), compare=False, repr=False)

    def to_dict(self) -> dict:
        return {s: dataclasses.asdict(getattr(self, s)) for s in SECTIONS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def fields_of(section: str):
    """(dataclass field, metadata) for every field of a section (the schedule's 'epochs' is
    exposed as ``cosine_epochs`` on the command line to keep flag names unique)."""
    for f in dataclasses.fields(SECTIONS[section]):
        meta = dict(f.metadata) or EXTRA_META.get(f.name, {})
        yield f, meta


def flag_name(section: str, name: str) -> str:
    return "cosine_epochs" if (section, name) == ("schedule", "epochs") else name


def _coerce(key: str, value, typ):
    """Checks/converts one TOML or flag value to the field's declared type."""
    origin = typing.get_origin(typ)
    if origin is tuple:
        args = typing.get_args(typ)
        if isinstance(value, str):
            value = [v for v in value.replace(" ", "").split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        elem = args[0]
        if args[-1] is not Ellipsis and len(value) != len(args):
            raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}")
        return tuple(_coerce(key, v, elem) for v in value)
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if not math.isfinite(out):          # nan / inf would train (and summarise) garbage
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return out
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {typ} for {key}")


def _check_range(key: str, value, meta: dict):
    vals = value if isinstance(value, tuple) else (value,)
    choices, lo, hi = meta.get("choices"), meta.get("lo"), meta.get("hi")
    for v in vals:
        if choices and v not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(map(str, choices))}, got {v!r}")
        if lo is not None and (v <= lo if meta.get("lo_open") else v < lo):
            raise ConfigError(f"{key}: must be {'>' if meta.get('lo_open') else '>='} {lo}, got {v!r}")
        if hi is not None and v > hi:
            raise ConfigError(f"{key}: must be <= {hi}, got {v!r}")


def _section(name: str, values: dict):
    hints = typing.get_type_hints(SECTIONS[name])
    known = {f.name: meta for f, meta in fields_of(name)}
    out = {}
    for k, v in values.items():
        if k not in known:
            raise ConfigError(f"{name}.{k}: unknown key (known: {', '.join(sorted(known))})")
        v = _coerce(f"{name}.{k}", v, hints[k])
        _check_range(f"{name}.{k}", v, known[k])
        out[k] = v
    return dataclasses.replace(getattr(Config(), name), **out)   # the demo's defaults underneath


def build(file_values: dict | None = None, overrides: dict | None = None) -> Config:
    """Config from nested ``{section: {key: value}}`` dicts: file values, then overrides on top."""
    merged: dict[str, dict] = {s: {} for s in SECTIONS}
    for source in (file_values or {}), (overrides or {}):
        for sec, vals in source.items():
            if sec not in SECTIONS:
                raise ConfigError(f"{sec}: unknown section (known: {', '.join(SECTIONS)})")
            if not isinstance(vals, dict):
                raise ConfigError(f"{sec}: expected a table of keys, got {vals!r}")
            merged[sec].update(vals)
    explicit = frozenset(f"{s}.{k}" for s, vals in merged.items() for k in vals)
    cfg = Config(**{s: _section(s, v) for s, v in merged.items()}, explicit=explicit)
    return _cross_checks(_derive_scale(cfg))


def _derive_scale(cfg: Config) -> Config:
    """An unset ``data.scale`` follows the augmentation and the crop size (as ``val_resize`` does)."""
    d = cfg.data
    if "data.scale" in cfg.explicit:
        return cfg
    lo, hi = RRC_SCALE if d.augment == "rrc" else (d.image_size * r for r in MULTISCALE_RATIO)
    return dataclasses.replace(cfg, data=dataclasses.replace(d, scale=(float(lo), float(hi))))


def fit_to_world(cfg: Config, ranks: int, worker_nodes: int | None = None) -> Config:
    """The defaults that depend on the rank count, for keys nobody set; each change is logged (only
    rank 0 logs at INFO).  An explicit value is kept as given.

    * ``data.batch_size``: the demo's global batch of 64 split over the workers, at least 8 per
      worker (4 workers: 16, as jobs/digits-*.toml), so an epoch keeps the step count of one rank.
    * ``schedule.lr`` for ``asgd``: the base rate / the pushers (workers; ``dist.hierarchy = node``:
      node groups), since the server adds every update (jobs/digits-asgd.toml: 0.033).
    """
    workers = workers_of(cfg.train.method, ranks, cfg.dist.servers)
    log = logging.getLogger("scalesgd")
    data, sched = cfg.data, cfg.schedule
    if "data.batch_size" not in cfg.explicit:
        batch = max(MIN_WORKER_BATCH, GLOBAL_BATCH // workers)
        if batch != data.batch_size:
            log.info("data.batch_size not set: %d per worker (global batch %d over %d workers); "
                     "--batch-size sets it", batch, batch * workers, workers)
            data = dataclasses.replace(data, batch_size=batch)
    grouped = cfg.dist.hierarchy == "node" and worker_nodes is not None
    pushers, who = (worker_nodes, "worker node group") if grouped else (workers, "worker")
    if cfg.train.method == "asgd" and "schedule.lr" not in cfg.explicit and pushers > 1:
        lr = sched.lr / pushers
        log.info("schedule.lr not set: asgd uses %g / %d %ss = %.4g (its server adds every "
                 "%s's update); --lr sets it", sched.lr, pushers, who, lr, who)
        sched = dataclasses.replace(sched, lr=lr)
    return dataclasses.replace(cfg, data=data, schedule=sched)


def _cross_checks(cfg: Config) -> Config:
    lo, hi = cfg.data.scale
    if lo > hi:
        raise ConfigError(f"data.scale: lower bound {lo} is above upper bound {hi}")
    if cfg.data.augment == "rrc" and hi > 1:
        raise ConfigError(f"data.scale: rrc takes area fractions in (0, 1], got {cfg.data.scale}")
    if cfg.data.augment == "multiscale" and lo < cfg.data.image_size:
        raise ConfigError(f"data.scale: multiscale shorter side {lo} is below data.image_size "
                          f"{cfg.data.image_size}")
    if cfg.dist.straggler:
        parse_straggler(cfg.dist.straggler)            # raises ConfigError naming dist.straggler
    if -1 < cfg.dist.bucket_mb < 0:
        raise ConfigError(f"dist.bucket_mb: -1 (auto) or a size >= 0 in MB, got {cfg.dist.bucket_mb}")
    if cfg.dist.hierarchy == "node" and cfg.train.on_failure == "continue":
        raise ConfigError("dist.hierarchy: 'node' cannot survive a lost rank yet (train.on_failure = "
                          "continue): use one or the other")
    if cfg.dist.hierarchy == "node" and cfg.dist.allreduce_transport not in ("auto", "host"):
        raise ConfigError(f"dist.hierarchy: 'node' sums through MPI on host buffers; "
                          f"dist.allreduce_transport = {cfg.dist.allreduce_transport} is a device "
                          "transport (NCCL is topology-aware by itself): use one or the other")
    if cfg.dist.max_staleness >= 0 and cfg.dist.servers > 1 and cfg.train.method == "asgd":
        # each shard would judge a push by its own version: one update applied to some slices only
        raise ConfigError(f"dist.max_staleness: needs dist.servers = 1 (got {cfg.dist.servers}): each "
                          "shard would judge staleness by its own version and could apply a push to some "
                          "slices of the model only")
    if list(cfg.schedule.milestones) != sorted(cfg.schedule.milestones):
        raise ConfigError(f"schedule.milestones: must be increasing, got {cfg.schedule.milestones}")
    if cfg.schedule.epochs == 0:        # cosine horizon defaults to the training length
        cfg = dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule,
                                                                    epochs=float(cfg.train.epochs)))
    return cfg


def parse_straggler(spec: str) -> tuple[tuple[int, ...], float, float]:
    """'1,3:100:50' -> ((1, 3), 100.0, 50.0): ranks, delay ms, jitter ms (uniform +-jitter)."""
    parts = spec.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        ranks = tuple(int(r) for r in parts[0].split(",") if r)
        delay = float(parts[1])
        jitter = float(parts[2]) if len(parts) == 3 else 0.0
        if not ranks or min(ranks) < 0 or delay < 0 or jitter < 0 or jitter > delay:
            raise ValueError
    except ValueError:
        raise ConfigError(f"dist.straggler: expected RANKS:DELAY_MS[:JITTER_MS] with jitter <= delay, "
                          f"e.g. '1,3:100:50', got {spec!r}") from None
    return ranks, delay, jitter


def load_json_config(path: str | Path) -> dict:
    """A run's saved config.json (for --resume); a missing or unreadable file names the path."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: not found (is this a run directory?)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{p}: unreadable ({exc})") from None


def load_toml(path: str | Path) -> dict:
    """Reads a TOML job file; a missing file or bad syntax is a ConfigError naming the file."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, not a TOML config file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: malformed TOML: {exc}") from None


def reference_markdown() -> str:
    """The table of every key and flag, as included in docs/cli.md (a test keeps them equal):
    ``python -c "from scalesgd.config import reference_markdown as r; print(r())"``."""
    defaults, out = Config(), []
    for sec, cls in SECTIONS.items():
        out += [f"### [{sec}]", "", "| key | flag | type | default | meaning |", "|---|---|---|---|---|"]
        hints = typing.get_type_hints(cls)
        for f, meta in fields_of(sec):
            flag = flag_name(sec, f.name).replace("_", "-")
            typ = hints[f.name]
            flags = f"`--{flag}` / `--no-{flag}`" if typ is bool else f"`--{flag}`"
            value = getattr(getattr(defaults, sec), f.name)
            shown = "[" + ", ".join(map(str, value)) + "]" if isinstance(value, tuple) else \
                ('""' if value == "" else str(value))
            text = meta.get("help", "")
            if meta.get("choices"):
                text += " (" + " \\| ".join(map(str, meta["choices"])) + ")"
            tname = getattr(typ, "__name__", str(typ).replace("typing.", ""))
            out.append(f"| `{f.name}` | {flags} | {tname} | `{shown}` | {text} |")
        out.append("")
    return "\n".join(out)
