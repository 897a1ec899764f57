"""Everything about continuing a run, in one place: which run and checkpoint ``--resume`` means,
what may change (the config keys that define a run may not), whether a checkpoint fits this job
(rank count, method, model layout) and the ``Origin`` each rank resumes from (``origin``: the
saved state it continues, in this job's terms; ``rankstate.py``); also ``--init-from`` (warm start),
which reads the same files.

Called by the composition root (``train/assemble.py``: the checks and the warm start, for MPI runs
and virtual ones alike), the loop (``Run.resume``) and the command line (``launch.resolve_config``: the
config a resumed run continues with).  Writing a
checkpoint is ``checkpointing.py``; the file format ``io/checkpoint.py``.  What is resumable bitwise
is in docs/cli.md ("Checkpoints, resume, warm start, preemption").
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from .. import config as C
from ..errors import CheckpointError
from ..io import checkpoint as ckpt
from .checkpointing import layout_signature
from .rankstate import LoopState, Origin, RankState

# Keys a resumed run must keep: they define the model, the data order and the method's state.
RESUME_IDENTITY = {"model": None, "data": ("data", "image_size", "batch_size"),
                   "train": ("method", "seed"), "dist": ("gossip", "gossip_graph", "servers", "hierarchy")}


def resumed_config(cfg: C.Config, file_values: dict, overrides: dict) -> C.Config:
    """The config a resumed run continues with (``cfg.train.resume`` set): its saved config.json
    replaces the defaults, then the job file and the flags apply; keys that define the run
    (``RESUME_IDENTITY``) may not change (the error names them)."""
    run_dir = resume_run_dir(Path(cfg.train.resume))
    saved = C.load_json_config(run_dir / "config.json")
    base = {sec: {**saved.get(sec, {}), **file_values.get(sec, {})} for sec in C.SECTIONS}
    cfg = C.build(base, {**overrides, "train": {**overrides.get("train", {}), "run_dir": str(run_dir),
                                                  "resume": cfg.train.resume}})
    check_identity(C.build(saved), cfg, run_dir)
    return cfg


def resume_run_dir(path: Path) -> Path:
    """RUN_DIR given directly, or the RUN_DIR of RUN_DIR/checkpoints/ckpt-*.h5.  Anything else is
    a ConfigError naming the path as the user gave it (not a directory derived from it)."""
    if path.is_dir():
        run_dir = path
    elif path.is_file():            # RUN_DIR/checkpoints/ckpt-*.h5 (absolute when given as ckpt.h5)
        run_dir = (path if len(path.parts) >= 2 else path.absolute()).parent.parent
    else:
        raise C.ConfigError(f"--resume {path}: no such run directory or checkpoint file")
    if not (run_dir / "config.json").is_file():
        raise C.ConfigError(f"--resume {path}: not a run directory (no config.json in it)"
                            if run_dir == path else f"--resume {path}: no config.json in {run_dir} "
                            f"(a checkpoint file must lie in RUN_DIR/checkpoints/)")
    return run_dir


def check_identity(saved: C.Config, new: C.Config, run_dir: Path) -> None:
    diffs = []
    for sec, keys in RESUME_IDENTITY.items():
        a, b = getattr(saved, sec), getattr(new, sec)
        for k in keys or [f.name for f, _ in C.fields_of(sec)]:
            if getattr(a, k) != getattr(b, k):
                diffs.append(f"{sec}.{k} was {getattr(a, k)!r}, now {getattr(b, k)!r}")
    if diffs:
        raise C.ConfigError(f"cannot resume {run_dir}: " + "; ".join(diffs))


# Methods whose checkpoints resume on another rank count: every replica is the same model
# (allreduce), each new rank starts from the average of the saved replicas (gossip, localsgd), or
# the server shards keep their center/master and the workers start from it (easgd, asgd)
RESHAPEABLE = ("allreduce", "gossip", "localsgd", "easgd", "asgd")


def find_checkpoint(resume: str, ranks: int, method: str, job: str = "this job") -> Path:
    """The checkpoint ``--resume`` names (a file, or a run directory's newest good one), verified
    (digests) and written by ``method`` on ``ranks`` ranks (any rank count for ``RESHAPEABLE``
    methods); else CheckpointError naming it."""
    given = Path(resume)
    path = ckpt.latest_good(ckpt.checkpoint_dir(given)) if given.is_dir() else given
    meta = ckpt.verify(path)
    if meta["method"] != method or (meta["ranks"] != ranks and method not in RESHAPEABLE):
        raise CheckpointError(f"{path}: written by {meta['ranks']} ranks of '{meta['method']}', {job} "
                              f"has {ranks} ranks of '{method}'" + ("" if meta["method"] != method else
                                                                   " (resume with the same rank count)"))
    return path


def origin(s, path: Path) -> tuple[dict, Origin]:
    """Collective, after ``method.start``: the ``Origin`` this rank resumes from, checkpoint
    ``path`` (digests checked), and rank 0's metadata.  The same ranks in the same node groups
    continue their own saved states ("same"); another rank count, or the same ranks in other node
    groups, continue a saved rank each ("reshape"; ``source_rank``), with the replica the method
    asks for (``traits.reshape_replica``)."""
    m = s.method
    old_p = ckpt.read_meta(path)["ranks"]
    split = m.node_split                             # (node groups; all-reduce: flat)
    leaders = None
    # another rank count, or the same ranks split into other nodes: each rank continues a saved one
    reshape = old_p != s.topo.size or (split is not None and groups_moved(s, path))
    if reshape and split is not None:
        leaders = saved_leaders(s, path, old_p)
        if leaders is None:
            raise CheckpointError(f"{path}: written by a --hierarchy node run before checkpoints "
                                  f"recorded node groups: resume it on the same {old_p} ranks, "
                                  f"split into nodes alike")
    source = source_rank(s, old_p, leaders, reshape)   # the saved rank this rank continues
    meta, own = RankState.read(path, source)
    k = s.roles.num_servers
    old_workers = old_p - k if leaders is None else sum(j >= k for j in leaders)
    if not reshape:
        return meta, Origin("same", own, int(own.method["global_samples"]), old_p, old_workers, path)
    own.method.pop("node_group", None)              # (new node groups, by design)
    total = saved_total(path)
    o = Origin("reshape", own, total, old_p, old_workers, path)
    replica = "source" if s.roles.is_server else m.traits.reshape_replica
    if replica == "average":                         # every rank: the average of the saved replicas
        o = o.with_replica(*average_replicas(s, path, old_p, leaders))
    elif replica == "center":                        # a worker starts from the center / master
        o = o.with_replica(saved_center(s, path), np.zeros_like(own.momentum), own.buffers)
    o.own.loop = reshaped(s, o, source, leaders)
    return meta, o


def saved_total(path: Path) -> int:
    """The global count of checkpoint ``path``: saved rank 0's (gossip: its sample counter's true
    value; a server method: the first server's; the others: every rank's alike)."""
    st = RankState.read(path, 0, arrays=False)[1].method
    return int(st.get("counter_total", st["global_samples"]))


def groups_moved(s, path: Path) -> bool:
    """Collective: whether some rank now sits in another node group (``dist.hierarchy = node``)
    than the one checkpoint ``path`` recorded for its rank (the same ranks, split into other
    nodes: another -N / --ntasks-per-node)."""
    saved = RankState.read(path, s.topo.rank, arrays=False)[1].method.get("node_group")
    split = s.method.node_split
    moved = int(saved is not None and list(saved) != [split.leader_rank, split.node.size])
    return bool(s.topo.transport.allreduce_sum_host(np.array([moved], np.int64))[0])


def source_rank(s, old_p: int, leaders: list[int] | None = None, reshape: bool = True) -> int:
    """The saved rank whose state this rank continues: itself unless ``reshape`` (another rank
    count, or the same ranks in other node groups); else a
    replica (rank mod p_old), and for the server methods shard k for shard k and saved worker
    (w mod W_old) for worker w (the shard count cannot change: ``dist.servers`` defines the run).
    A checkpoint of node groups (``leaders``: its saved leaders, ``saved_leaders``): every rank of
    worker group g (``NodeSplit.group_index`` - K) continues saved worker leader g mod their count
    (a member's state is not its method's; the groups keep their saved order)."""
    if not reshape:
        return s.topo.rank
    k = s.roles.num_servers
    if leaders is not None and not s.roles.is_server:
        workers = [j for j in leaders if j >= k]
        return workers[(s.method.node_split.group_index - k) % len(workers)]
    if not k:
        return s.topo.rank % old_p
    return s.topo.rank if s.roles.is_server else k + s.roles.worker_index % (old_p - k)


def saved_leaders(s, path: Path, old_p: int) -> list[int] | None:
    """Collective: the saved ranks that led a node group (``dist.hierarchy = node``: their state
    is the method's, the members' only the base's), read by rank 0 from each rank's
    ``node_group``; None for a checkpoint of a flat run."""
    led = np.full(old_p, -1, np.int64)
    if s.topo.is_root:
        for j in range(old_p):
            group = ckpt.read_rank(path, j, arrays=False)[2]["method"].get("node_group")
            led[j] = -1 if group is None else int(group[0] == j)
    s.method.comm.broadcast(led, 0)
    return None if led[0] < 0 else [j for j in range(old_p) if led[j] == 1]


def saved_center(s, path: Path):
    """The server methods' center (easgd) or master weights (asgd) of checkpoint ``path``, whole:
    shard k's slice from saved rank k (the first ``dist.servers`` ranks)."""
    from ..comm.wire import shard_bounds  # noqa: PLC0415
    k = s.roles.num_servers
    parts = []
    for j in range(k):
        params = ckpt.read_rank(path, j)[1]["params"]
        bounds = shard_bounds(params.size, k)
        parts.append(params[bounds[j]:bounds[j + 1]])
    return np.concatenate(parts)


def average_replicas(s, path: Path, old_p: int, leaders: list[int] | None = None) -> tuple:
    """Collective: rank 0 reads every saved replica and averages params, momentum and BN buffers
    (push-sum: ``sum w_i x_i / sum w_i``, the de-biased average the weights conserve; pull: the
    plain mean), in float64; every rank gets them by broadcast.  Node groups: the saved
    ``leaders``' replicas only (a member's is its leader's copy).  Returns (params, momentum,
    buffers), host arrays of the run's dtypes."""
    flats = (s.model.ps.params, s.opt.momentum, s.model.ps.buffers)
    sums = [np.zeros(f.size, np.float64) for f in flats]
    if s.topo.is_root:
        weights = 0.0
        for j in (range(old_p) if leaders is None else leaders):
            saved = RankState.read(path, j)[1]
            w = float(saved.method.get("weight", 1.0))      # push-sum's weight; pull: 1
            for acc, arr in zip(sums, (saved.params, saved.momentum, saved.buffers)):
                acc += w * arr.astype(np.float64)
            weights += w
        for acc in sums:
            acc /= weights
    out = []
    for flat, acc in zip(flats, sums):
        host = acc.astype(flat.dtype)
        s.method.comm.broadcast(host, 0)
        out.append(host)
    return tuple(out)


def reshaped(s, o: Origin, source: int, leaders: list[int] | None = None) -> LoopState:
    """The loop counters of a rank of a run resumed on another rank count or into other node
    groups (``o``: its origin): the data position continues from the global count in this job's
    epochs (``Setup.samples_per_epoch``), as if this job had run from the start; the times are
    those of the saved rank it continues (``source``); the bad samples every saved worker counted
    are counted once (by new worker ``v mod W`` of saved worker ``v``: ``o.own.bad_samples``).
    Not bitwise: the data order depends on p."""
    p, k, loop = s.topo.size, s.roles.num_servers, o.own.loop
    gs, spe = o.global_samples, s.samples_per_epoch
    if s.topo.is_root:
        logging.getLogger("scalesgd").info(
            "resuming %s, written by %d ranks, on %d%s: continuing from %d global samples (epoch "
            "%.2f); not bitwise: the data order depends on the rank count and the node groups",
            o.path, o.old_size, p, " split into other node groups" if o.old_size == p else "", gs,
            gs / spe if spe else 0.0)
    if s.roles.is_server:                           # a server's counters are its own (no data)
        return loop
    step_batch = s.cfg.data.batch_size * s.roles.num_workers
    loop.local_epoch, loop.step_in_epoch = data_position(gs, spe, step_batch)
    loop.step = gs // step_batch
    loop.local_samples = loop.step * s.cfg.data.batch_size
    owned, w = 0, s.roles.worker_index
    for v in range(w, o.old_size - k, s.roles.num_workers):     # saved workers v with v mod W == w
        j = k + v
        st = o.own if j == source else RankState.read(o.path, j, arrays=False)[1]
        owned += int((st.bad_samples or {}).get("owned", 0))
    if o.own.bad_samples:
        o.own.bad_samples = {**o.own.bad_samples, "owned": owned}
    return loop


def data_position(gs: int, spe: int, step_batch: int) -> tuple[int, int]:
    """(epoch, step within it) of a worker's data order at global count ``gs``, for epochs of
    ``spe`` global samples and global batches of ``step_batch`` (a resume onto another rank count,
    a shrunk job: ``survive.py``)."""
    epoch, within = divmod(gs, spe) if spe else (0, 0)
    return epoch, within // step_batch


def warm_start(s, path: Path) -> None:
    """Every rank takes the weights and BN statistics of ``path``'s rank 0 (the replica, or the
    server's center/master), before ``method.start``; the optimizer state stays fresh.  ``path``
    is a checkpoint file or a run directory (its newest good checkpoint)."""
    if path.is_dir():                                 # a run directory: its newest good checkpoint
        path = ckpt.latest_good(ckpt.checkpoint_dir(path))
    meta, arrays, _ = ckpt.read_rank(path, 0)
    _check_layout(s, path, meta)
    ps = s.model.ps
    ps.params[...] = s.backend.xp.asarray(arrays["params"])
    ps.buffers[...] = s.backend.xp.asarray(arrays["buffers"])


def check_fits(s, path: Path) -> None:
    """Refuses a checkpoint written for another model (before anything is written or changed)."""
    _check_layout(s, path, ckpt.read_meta(path))


def _check_layout(s, path: Path, meta: dict) -> None:
    if meta.get("layout") != layout_signature(s.model.ps):
        n = meta.get("num_params")
        raise CheckpointError(
            f"{path}: its model ({meta.get('model')}, {n:,} parameters) is not this run's "
            f"({s.cfg.model.model}, {s.model.num_params:,} parameters)" if isinstance(n, int) else
            f"{path}: written for another model than this run's ({s.cfg.model.model})")
