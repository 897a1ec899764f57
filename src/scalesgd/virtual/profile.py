"""Hardware profiles of the virtual cluster: compute per step, links, ranks per node.

A profile is a JSON file (``profiles/*.json`` ship with the package; ``--profile FILE.json`` reads
a user's own) with these keys:

===================  ==========================================================================
``name``             what ``--profile NAME`` selects
``description``      one line, shown by ``--list-profiles``
``images_per_second`` training images per second of one rank on ``reference`` (model,
                     image_size); other models and sizes are scaled by their multiply-accumulates
                     per image (``model_macs``).  ``null`` (and no ``step_seconds``): **measured** —
                     each virtual step costs the real seconds it took on this machine (data,
                     forward, backward, update)
``step_seconds``     instead of ``images_per_second``: the seconds of one local step of the job
                     the profile is used with (e.g. a step measured on the real cluster)
``reference``        ``{"model": "resnet50", "image_size": 224}``
``compute_source``   where the compute figure comes from (a citation, or "measured")
``link_gbps``        usable bandwidth of one node's NIC, Gbit/s, each way
``latency_us``       one message's latency across nodes, microseconds
``ranks_per_node``   consecutive ranks share a node (and its NIC; ``--hierarchy node``'s groups)
``intra_gbps``       bandwidth between ranks of one node, Gbit/s
``mem_gbps``         device memory bandwidth, GB/s (a server's update, a gossip mix: 3 passes)
``jitter_cv``        every step's compute x max(0.5, 1 + cv N(0, 1)) (0: none); a shorthand for a
                     condition with normal noise, used when the condition has no noise of its own
``stands_for``       ``{"model": "resnet18", "image_size": 224, "batch_size": 32}``: time the job
                     as if it were that workload (a small proxy task standing in for a real one):
                     a step costs that workload's step (its batch at ``images_per_second``, scaled
                     by MACs from ``reference``), and every byte the job sends or mixes costs that
                     model's parameter bytes over the job's (1000 classes); needs
                     ``images_per_second``.  The statistics stay the job's own
``allreduce_progress`` how the gradient all-reduce progresses: ``async`` (default; NCCL, or an MPI
                     with a progress thread): it runs under backward, and only what does not fit
                     there is exposed; ``host`` (host MPI over TCP without a progress thread): it
                     moves only while the rank is inside MPI, so it starts after backward and costs
                     its whole time, ``host_allreduce_factor`` x the ring formula
``host_allreduce_factor`` ``host`` only: measured all-reduce seconds over the ring formula's (the
                     algorithm, per-message and TCP costs the formula leaves out; 1 by default)
``host_hidden_fraction`` ``host`` with ``--overlap``: the share of the all-reduce that the rank's
                     own MPI calls during backward (each bucket's launch) still move, measured
                     (``benchmarks/buckets.py``: exposed over pure transfer); 0 by default
``variability``      the condition the profile runs under unless ``--condition`` names another: a
                     shipped condition's name (``none``, ``typical``, ``stragglers``), a JSON
                     file, or an inline object (``variability.py``); default ``none``
``variability_note`` why the profile's default condition is what it is
``rma_progress``     ``target`` (default): a one-sided call to a rank on another node completes
                     only once that rank is next inside MPI (not computing a step), as MPICH and
                     Open MPI do across nodes without a progress thread (docs/cluster.md);
                     ``async``: at once (an asynchronous progress engine)
===================  ==========================================================================

Stragglers also come from the job's own ``dist.straggler`` (the same option as a real run; the
virtual rank's clock advances by the delay instead of sleeping).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from . import jsonfile
from . import variability as V

PROFILE_DIR = Path(__file__).parent / "profiles"
REQUIRED = ("link_gbps", "latency_us")           # (besides name; the rest have defaults)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str = ""
    images_per_second: float | None = None
    step_seconds: float | None = None
    reference: dict | None = None
    compute_source: str = ""
    link_gbps: float = 80.0
    latency_us: float = 5.0
    ranks_per_node: int = 1
    intra_gbps: float = 2400.0
    mem_gbps: float = 1555.0
    jitter_cv: float = 0.0
    rma_progress: str = "target"
    stands_for: dict | None = None
    allreduce_progress: str = "async"
    host_allreduce_factor: float = 1.0
    host_hidden_fraction: float = 0.0
    variability: str | dict = "none"
    variability_note: str = ""

    @property
    def measured(self) -> bool:
        return self.images_per_second is None and self.step_seconds is None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def available() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PROFILE_DIR.glob("*.json"))}


def load(spec: str) -> Profile:
    """``spec``: a shipped profile's name or a JSON file's path."""
    raw, origin = jsonfile.read(spec, available(), "profile", "--profile")
    path = origin.split(" ", 1)[1]
    jsonfile.refuse_unknown(raw, Profile, origin)
    jsonfile.refuse_mistyped(raw, Profile, origin)
    if not raw.get("name"):                   # (its type: refuse_mistyped)
        raise ConfigError(f"--profile {path}: a profile needs a name (a string: it labels the output)")
    prof = Profile(**raw)
    for key in ("link_gbps", "intra_gbps", "mem_gbps"):
        if not getattr(prof, key) > 0:
            raise ConfigError(f"--profile {path}: {key} must be > 0")
    if prof.rma_progress not in ("target", "async"):
        raise ConfigError(f"--profile {path}: rma_progress is 'target' or 'async'")
    if prof.allreduce_progress not in ("async", "host") or not prof.host_allreduce_factor > 0 \
            or not 0 <= prof.host_hidden_fraction < 1:
        raise ConfigError(f"--profile {path}: allreduce_progress is 'async' or 'host', "
                          "host_allreduce_factor > 0, 0 <= host_hidden_fraction < 1")
    V.load(prof.variability, f"--profile {path}: variability")
    if prof.ranks_per_node < 1 or prof.latency_us < 0 or prof.jitter_cv < 0:
        raise ConfigError(f"--profile {path}: ranks_per_node >= 1, latency_us >= 0, jitter_cv >= 0")
    if prof.step_seconds is not None:
        if not prof.step_seconds > 0 or prof.images_per_second is not None:
            raise ConfigError(f"--profile {path}: step_seconds > 0, and not with images_per_second")
    elif not prof.measured and (prof.images_per_second <= 0 or not prof.reference):
        raise ConfigError(f"--profile {path}: images_per_second > 0 needs a reference "
                          "{\"model\": ..., \"image_size\": ...}")
    if prof.stands_for is not None:
        need = {"model", "image_size", "batch_size"}
        if not isinstance(prof.stands_for, dict) or set(prof.stands_for) != need:
            raise ConfigError(f"--profile {path}: stands_for is {{\"model\": ..., \"image_size\": ..., "
                              "\"batch_size\": ...}")
        if prof.images_per_second is None:
            raise ConfigError(f"--profile {path}: stands_for needs images_per_second (and reference)")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:                               # (a network left out would be timed as the defaults')
        raise ConfigError(f"--profile {path}: the network is required: {', '.join(missing)} "
                          "(a node's usable Gbit/s each way, one message's latency in µs)")
    return prof


def model_params(model: str, num_classes: int = 1000, width: float = 1.0) -> int:
    """Trainable parameters of one model (what a method sends, in float32 units)."""
    from ..nn import resnet as R  # noqa: PLC0415
    return int(R.ResNet(model, num_classes, width, seed=None).num_params)


def byte_scale(prof: Profile, cfg, num_classes: int) -> float:
    """Wire bytes per byte the job sends: 1, or with ``stands_for`` its model's parameters over
    the job's."""
    if prof.stands_for is None:
        return 1.0
    return (model_params(prof.stands_for["model"])
            / model_params(cfg.model.model, num_classes, cfg.model.width))


def model_macs(model: str, image_size: int, num_classes: int = 1000, width: float = 1.0) -> int:
    """Multiply-accumulates of one image's forward pass (convolutions and the classifier), counted
    on a batch-1 forward of the real network whose convolutions only return zeros of their output
    shape (the count needs shapes, not arithmetic: ResNet-50 at 224 in 0.1 s, not 6)."""
    from ..nn import resnet as R  # noqa: PLC0415
    net = R.ResNet(model, num_classes, width, seed=None)
    total = [0]
    convs = [m for m in R._leaves(net.net) if isinstance(m, R.Conv)]
    for c in convs:
        def counting(x, train, c=c):
            n, h, w, _ = x.shape
            ho, wo = (h + 2 * c.pad - c.k) // c.stride + 1, (w + 2 * c.pad - c.k) // c.stride + 1
            total[0] += n * ho * wo * c.k * c.k * c.cin * c.cout
            return np.zeros((n, ho, wo, c.cout), x.dtype), None
        c.forward = counting
    net.forward(np.zeros((1, image_size, image_size, 3), np.float32), False)
    head = [m for m in R._leaves(net.net) if isinstance(m, R.Head)][0]
    return total[0] + int(np.prod(head.w.shape))


def condition_of(prof: Profile, spec=None) -> V.Condition:
    """The condition a run uses: ``spec`` (``--condition``) or the profile's ``variability``; a
    profile's ``jitter_cv`` is its normal noise when the condition has none."""
    cond = V.load(spec if spec is not None else prof.variability,
                  "--condition" if spec is not None else f"--profile {prof.name}: variability")
    if prof.jitter_cv and not cond.noise.get("cv"):
        cond = V.Condition(**{**cond.to_dict(), "noise": {"dist": "normal", "cv": prof.jitter_cv}})
    return cond


class Compute:
    """Simulated seconds of one local step: from the profile (scaled by MACs and batch), or the
    real seconds it took (``measured``), then disturbed as the condition says (noise, delays, slow
    nodes: ``variability.Variability``).  ``workers``: the world ranks that compute steps,
    ``node_of``: a rank's node."""

    def __init__(self, prof: Profile, cfg, num_classes: int, seed: int = 0,
                 condition: V.Condition | None = None, workers=(), node_of=lambda r: r):
        self.prof = prof
        self.condition = condition if condition is not None else condition_of(prof)
        self.vary = None if self.condition.none else V.Variability(self.condition, seed, workers, node_of)
        self.seconds = None
        if prof.step_seconds is not None:
            self.seconds = prof.step_seconds
        elif prof.stands_for is not None:
            ref, job = prof.reference, prof.stands_for
            ratio = (model_macs(job["model"], int(job["image_size"]))
                     / model_macs(ref["model"], int(ref["image_size"])))
            self.seconds = int(job["batch_size"]) * ratio / prof.images_per_second
        elif not prof.measured:
            ref = prof.reference
            ratio = (model_macs(cfg.model.model, cfg.data.image_size, num_classes, cfg.model.width)
                     / model_macs(ref["model"], int(ref["image_size"])))
            self.seconds = cfg.data.batch_size * ratio / prof.images_per_second

    def __call__(self, rank: int, step: int, real: float) -> float:
        t = real if self.seconds is None else self.seconds
        return t if self.vary is None else self.vary(rank, t)
