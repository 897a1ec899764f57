"""Thin entry so that ``python -m src.main`` (and ``mpirun -n 8 python -m src.main``) works from the
repository root without installing the package.

A Python without the dependencies gets one line naming the interpreter and what it lacks (printed by
the launcher's rank 0 only), not a traceback per rank."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def _missing_dependency(exc: ImportError) -> int:
    if all(os.environ.get(v, "0") == "0" for v in RANK_VARS):
        print(f"scalesgd: error: {sys.executable} (Python {sys.version.split()[0]}) cannot import "
              f"'{exc.name}', which scalesgd needs: run with the project's environment "
              "(.venv/bin/python after 'make install'), or install it: pip install -e .",
              file=sys.stderr, flush=True)
    return 1


def _entry() -> int:
    try:
        import numpy, mpi4py, h5py  # noqa: E401, F401 - the dependencies every run needs
        from scalesgd.cli import main
    except ImportError as exc:
        if (exc.name or "scalesgd").split(".")[0] == "scalesgd":
            raise                           # our own module: a bug, keep the traceback
        return _missing_dependency(exc)
    return main()


if __name__ == "__main__":
    sys.exit(_entry())
