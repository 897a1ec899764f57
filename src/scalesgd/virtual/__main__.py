"""``python -m scalesgd.virtual``: see ``virtual/run.py`` and docs/virtual.md."""
import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
