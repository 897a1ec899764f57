"""The network.  This package holds the MPI-free vocabulary (topology, the wire's tags and
headers, the transport's contract, staging, progress, the watchdog, /dev/shm); ``comm.mpi`` holds
every module that imports mpi4py, behind the transport."""
