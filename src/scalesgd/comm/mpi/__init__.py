"""The MPI half of ``comm/``: the modules that load mpi4py (the transport ``MPITransport``, the
collectives, the parameter-server protocol, the one-sided windows, the gradient all-reducers, the
launch-time probes, abort and ULFM).  ``comm/`` itself holds the MPI-free vocabulary."""
