"""The configuration's schema: six frozen sections, each field with its default, help text, choices
and range (``_f``), the ``Config`` that holds them, and the defaults that follow the data and the
world (the constants below).  The package's doc (``config/__init__.py``) says how a config is made.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from ..choices import (AUGMENTS, CONV_ALGOS, CONV_IMPLS, DEVICES, GOSSIP_GRAPHS, GOSSIP_VARIANTS, METHODS,
                       PRECISIONS, PROGRESS_MODES)
from ..choices import ALLREDUCE_TRANSPORTS, FAST_PATH_MODES, HIERARCHIES, KERNEL_IMPLS, MPI_PROGRESS
from ..nn.resnet import ARCHS
from ..optim.schedule import SCHEDULES, ScheduleConfig
from ..optim.sgd import SGDConfig


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
                        "Frontend graphs), auto (cudnn when it imports, a GPU is present and dtype is "
                        "float32)",
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
    cuda_graph: bool = _f(False, "GPU: capture forward, loss and backward in a CUDA graph once the batch's "
                          "shapes are fixed, and replay it every step (the gradient sum then starts after "
                          "backward; checked against the uncaptured step at start-up; never yet run on a "
                          "GPU)")
    log_every: int = _f(10, "steps between log lines", lo=1)
    progress: str = _f("auto", "step display: bar (one line redrawn in place), lines (one every log_every "
                       "steps), off, auto (bar on a terminal unless an MPI launcher started the ranks)",
                       choices=PROGRESS_MODES)
    run_dir: str = _f("", "where results go (empty = runs/<time>-<method>-<model>; a virtual run: "
                          "runs/<time>-virtual-<method>-<workers>; .2, .3, ... after it for a run "
                          "started in the same second as another)")
    checkpoint_every: float = _f(0.0, "epochs (of global samples) between checkpoints; 0 = only at the "
                                 "end and on SIGTERM/SIGUSR1", lo=0)
    checkpoint_minutes: float = _f(0.0, "also checkpoint every this many minutes of rank 0's clock "
                                   "(0 = off)", lo=0)
    keep_checkpoints: int = _f(3, "checkpoints kept in RUN_DIR/checkpoints (the newest)", lo=1)
    resume: str = _f("", "continue a run: its RUN_DIR (newest good checkpoint) or a checkpoint file")
    init_from: str = _f("", "warm start: every rank starts from the weights of this checkpoint file "
                        "(or a run directory's newest) with a fresh optimizer")
    stop_at_error: float = _f(0.0, "end the run at the first validation whose top-1 error is at or below "
                              "this (a final checkpoint, as at the last epoch); 0 = train every epoch",
                              lo=0, hi=1)
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
                                  "(nccl if every rank has it and no two ranks of a node share a GPU, else "
                                  "cuda_aware_mpi if every MPI says so and a test passes, else host; "
                                  "with hierarchy = node the two-level host sum); NumPy gradients always "
                                  "use host",
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
                        "between nodes (one rank per node), nodes as MPI sees them (a virtual run: its "
                        "profile's ranks_per_node); built so far for "
                        "allreduce (a two-level all-reduce over MPI host buffers); the other methods: "
                        "the ranks of a node average gradients every step and their leader exchanges "
                        "(gossip, local SGD) or talks to the server (easgd, asgd; servers stay alone)",
                        choices=HIERARCHIES)
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
