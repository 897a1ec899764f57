"""``python -m scalesgd`` and the ``scalesgd`` command: training (``cli.py``), ``doctor`` and ``plan``."""
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["plan"]:          # `scalesgd plan`: virtual/plan.py (not through cli.py, which
        from .virtual.plan import main as plan    # virtual/ imports)
        return plan(argv[1:])
    from .cli import main as train    # (`doctor` is dispatched there)
    return train(argv)


if __name__ == "__main__":
    sys.exit(main())
