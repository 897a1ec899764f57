"""The only package that imports mpi4py."""
