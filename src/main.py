"""Thin entry so that ``python -m src.main`` (and ``mpirun -n 8 python -m src.main``) works from the
repository root without installing the package."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scalesgd.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
