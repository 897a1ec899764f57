# Two entry points for a fresh machine with Python 3.11+: `make demo` and `make test`.
# Everything is installed into $(VENV) (MPI from the mpich wheel, DALI, h5py, ...), nothing system-wide.
PYTHON ?= python3
VENV   ?= .venv
RANKS  ?= 4
PY     := $(VENV)/bin/python

.PHONY: install demo test test-fast bench experiments model clean

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[mpi,test]'
	touch $@

install: $(VENV)/.installed

# Train ResNet-20 on the built-in digits with 4 MPI ranks and all-reduce SGD (the shards are built
# on first use).  `make demo METHOD=gossip` (or easgd, asgd) runs jobs/digits-METHOD.toml instead.
METHOD ?= allreduce
demo: install
	$(VENV)/bin/mpiexec -n $(RANKS) $(PY) -m src.main --config jobs/digits-$(METHOD).toml

# The whole suite, slow end-to-end training included.
test: install
	$(PY) -m pytest

test-fast: install
	$(PY) -m pytest -m "not slow"

bench: install
	$(PY) benchmarks/bench_cpu.py

# The papers' claims as experiments (docs/results.md; ~50 min on 2 cores), then the cost model:
# calibrate on this machine, validate on the experiment runs, project to a cluster.
EXPERIMENT ?= all
experiments: install
	$(PY) benchmarks/experiments.py $(EXPERIMENT)

model: install
	$(PY) benchmarks/calibrate.py
	$(PY) -m scalesgd.model --json benchmarks/results/model.json
	$(PY) benchmarks/report.py --update docs/results.md

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
