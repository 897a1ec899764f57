import sys

if sys.argv[1:2] == ["plan"]:          # `python -m scalesgd plan`: virtual/plan.py (not through cli.py,
    from .virtual.plan import main    # which virtual/ imports)
    sys.exit(main(sys.argv[2:]))

from .cli import main  # noqa: E402

sys.exit(main())
