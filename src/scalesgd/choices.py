"""The names an enumerated config key may take: each vocabulary is written once, here.

``config.py`` takes its ``choices`` from these tuples, and the modules that implement the names
(the method registry, the DALI pipeline, the backend, the cuDNN path, the progress line) check their
arguments against the same tuples, so a new name is added in one place.  This module imports
nothing: ``config`` is read before MPI starts and must not pull in mpi4py, DALI or CuPy.
"""

# train.method: the registry in methods/__init__.py maps each name to its class (a test checks
# that the two agree, and that SERVER_METHODS are exactly the classes with ``uses_server``).
METHODS = ("single", "allreduce", "easgd", "asgd", "gossip", "localsgd")
SERVER_METHODS = ("easgd", "asgd")      # rank 0 is a parameter server: workers = ranks - 1
GOSSIP_VARIANTS = ("pull", "push")      # dist.gossip
GOSSIP_GRAPHS = ("uniform", "exponential", "ring")   # dist.gossip_graph (methods/mixing.py)

AUGMENTS = ("multiscale", "rrc", "center")         # data.augment (data/pipeline.py)
DEVICES = ("cpu", "gpu", "auto")                   # train.device (backend.select)
PRECISIONS = ("fp32", "tf32", "bf16")              # model.precision (backend, nn/cudnn_conv.py)
CONV_IMPLS = ("im2col", "cudnn", "auto")           # model.conv_impl (nn/cudnn_conv.py)
CONV_ALGOS = ("auto", "im2col", "blocked", "taps", "winograd")   # model.conv_algo (nn/conv.py)
PROGRESS_MODES = ("auto", "bar", "lines", "off")   # train.progress (io/progress.py)
KERNEL_IMPLS = ("fused", "reference")              # model.kernels (nn/kernels.py)
FAST_PATH_MODES = ("auto", "strict", "off")        # model.fast_paths (fastpaths.py)
ALLREDUCE_TRANSPORTS = ("auto", "host", "cuda_aware_mpi", "nccl")   # dist.allreduce_transport (comm/device.py)
