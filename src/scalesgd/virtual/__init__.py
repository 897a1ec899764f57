"""The virtual cluster: p workers of the real method code stepped in one process (``world.py``),
over an in-process transport (``transport.py``), timed by a hardware profile (``profile.py``) or
replaying a real run's recorded order (``replay.py``); ``python -m scalesgd.virtual`` (``run.py``)."""
