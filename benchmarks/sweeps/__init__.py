"""The sweeps of ``benchmarks/experiments.py``: launching training runs
(``benchmarks/sweeps/runner.py``), the measures of finished runs (``benchmarks/sweeps/stats.py``),
figures and number formats (``benchmarks/sweeps/figures.py``), the base of a sweep
(``benchmarks/sweeps/base.py``) and one module per experiment."""
