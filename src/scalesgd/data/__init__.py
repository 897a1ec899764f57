"""Data: the HDF5 shard format (shards), the built-in digits dataset (demo) and the DALI
input pipelines (pipeline). Importing this package imports neither DALI nor MPI nor CuPy."""
from .shards import DataError, ShardError, ShardSet

__all__ = ["DataError", "ShardError", "ShardSet"]
