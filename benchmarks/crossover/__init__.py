"""The crossover study: which distributed SGD method reaches a target error first, by p, network
and variability, every method at its best after the same search, on the virtual cluster.

- ``study``: the design (axes, grids, seeds, horizons) and ``Study``, the plan from the records;
- ``store``: the run records (loose files while a study runs, packed once it is done);
- ``driver``: a resumable piece of runs from the pinned commit, the status, the pin;
- ``report``: the analysis (tuning, cells, crossovers, the noise scale) and its markdown;
- ``claims``: the papers' claims judged on it.

Its command line is ``python benchmarks/crossover_study.py``; its results are ``results/crossover/``
(the records), ``results/crossover.json`` (the analysis) and the study file ``scalesgd plan`` reads.
"""
