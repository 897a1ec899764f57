"""The names an enumerated config key may take: each vocabulary is written once, here.

``config/schema.py`` takes its ``choices`` from these tuples, and the modules that implement the names
(the method registry, the DALI pipeline, the backend, the cuDNN path, the progress line) check their
arguments against the same tuples, so a new name is added in one place.  This module imports
nothing: ``config`` is read before MPI starts and must not pull in mpi4py, DALI or CuPy.
"""

# train.method: the registry in methods/__init__.py maps each name to its class (a test checks
# that the two agree, and that SERVER_METHODS are exactly the classes derived from ServerMethod).
METHODS = ("single", "allreduce", "easgd", "asgd", "gossip", "localsgd")
SERVER_METHODS = ("easgd", "asgd")      # ranks 0..dist.servers-1 are parameter-server shards
GOSSIP_VARIANTS = ("pull", "push")      # dist.gossip
GOSSIP_GRAPHS = ("uniform", "exponential", "ring")   # dist.gossip_graph (methods/mixing.py)
MPI_PROGRESS = ("auto", "thread", "mpi", "none")    # dist.mpi_progress (comm/progress.py)
HIERARCHIES = ("none", "node")                      # dist.hierarchy (comm/mpi/hierarchy.py)

AUGMENTS = ("multiscale", "rrc", "center")         # data.augment (data/pipeline.py)
DEVICES = ("cpu", "gpu", "auto")                   # train.device (backend.select)
PRECISIONS = ("fp32", "tf32", "bf16")              # model.precision (backend, nn/cudnn_conv.py)
CONV_IMPLS = ("im2col", "cudnn", "auto")           # model.conv_impl (nn/cudnn_conv.py)
CONV_ALGOS = ("auto", "im2col", "blocked", "taps", "winograd")   # model.conv_algo (nn/conv.py)
PROGRESS_MODES = ("auto", "bar", "lines", "off")   # train.progress (io/progress.py)
KERNEL_IMPLS = ("fused", "reference")              # model.kernels (nn/kernels.py)
FAST_PATH_MODES = ("auto", "strict", "off")        # model.fast_paths (fastpaths/)
# dist.allreduce_transport (comm/mpi/device.py)
ALLREDUCE_TRANSPORTS = ("auto", "host", "cuda_aware_mpi", "nccl")


# ----------------------------------------------------------------------------- ranks and workers
# The one source of the worker count: the config's rank-count defaults (config.fit_to_world), the
# method's roles (methods.base.Exchange.servers_for), the virtual cluster and the benchmarks use these.
def servers_of(method: str, servers: int = 1) -> int:
    """Ranks ``method`` gives to parameter-server shards with ``dist.servers = servers``."""
    return servers if method in SERVER_METHODS else 0


def workers_of(method: str, ranks: int, servers: int = 1) -> int:
    """Ranks that train: all but the server shards; at least 1, and 1 for ``single`` (which
    refuses more ranks when the method is created)."""
    if method == "single":
        return 1
    return max(1, ranks - servers_of(method, servers))


def ranks_for(method: str, workers: int, servers: int = 1) -> int:
    """Ranks a job of ``workers`` training ranks of ``method`` needs (the inverse of workers_of)."""
    return workers + servers_of(method, servers)
