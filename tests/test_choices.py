"""Each vocabulary of the config (methods, augmentations, precisions, ...) is one tuple in
``scalesgd.choices``: the config's choices and the implementing modules' checks are that tuple."""
import dataclasses
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalesgd import backend, choices, config
from scalesgd.data import pipeline
from scalesgd.io import progress
from scalesgd.nn import cudnn_conv

SRC = str(Path(__file__).resolve().parents[1] / "src")


def key_choices(section, name):
    return {f.name: f for f in dataclasses.fields(section)}[name].metadata["choices"]


def test_config_and_the_implementing_modules_share_one_tuple():
    owned = {  # config key -> (its vocabulary, the same names as the implementing module holds them)
        (config.TrainConfig, "method"): (choices.METHODS, None),
        (config.DistConfig, "gossip"): (choices.GOSSIP_VARIANTS, None),
        (config.DataConfig, "augment"): (choices.AUGMENTS, pipeline.AUGMENTS),
        (config.TrainConfig, "device"): (choices.DEVICES, backend.DEVICES),
        (config.ModelConfig, "precision"): (choices.PRECISIONS, backend.PRECISIONS),
        (config.ModelConfig, "conv_impl"): (choices.CONV_IMPLS, cudnn_conv.CONV_IMPLS),
        (config.TrainConfig, "progress"): (choices.PROGRESS_MODES, progress.PROGRESS_MODES),
    }
    for (section, name), (vocab, held) in owned.items():
        assert key_choices(section, name) is vocab, name
        assert held is None or held is vocab, name
    assert cudnn_conv.PRECISIONS is choices.PRECISIONS
    assert set(choices.SERVER_METHODS) <= set(choices.METHODS)


def test_the_implementing_checks_name_the_same_vocabulary():
    with pytest.raises(backend.BackendError, match="expected one of fp32, tf32, bf16, got 'fp16'"):
        backend.set_precision("fp16")
    with pytest.raises(ValueError, match=r"expected one of \('fp32', 'tf32', 'bf16'\)"):
        cudnn_conv.type_names("fp16")
    assert config.workers_of("easgd", 4) == 3 and config.workers_of("gossip", 4) == 4


def test_the_method_registry_is_keyed_by_the_vocabulary():
    """methods/__init__.py maps each name to its class: the same names, in the same order, and the
    server methods are exactly the classes that reserve server ranks."""
    from scalesgd import methods
    assert tuple(methods.METHODS) == choices.METHODS
    assert all(cls.name == name for name, cls in methods.METHODS.items())
    from scalesgd.methods.server import ServerMethod
    serving = tuple(name for name, cls in methods.METHODS.items() if issubclass(cls, ServerMethod))
    assert serving == choices.SERVER_METHODS


def test_importing_config_starts_no_mpi_dali_or_cupy():
    """config is read before MPI starts: ``-X importtime`` lists every module its import loaded."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", "import scalesgd.config"],
                       env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True, timeout=60)
    loaded = [line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if "|" in line]
    assert p.returncode == 0 and "scalesgd.choices" in loaded, p.stderr[-2000:]
    assert [m for m in loaded if m.split(".")[0] in ("mpi4py", "cupy") or m.startswith("nvidia.dali")] == []


def test_rank_counts_a_method_needs_count_its_server_shards():
    """--servers K takes ranks 0..K-1: a server method needs K + 1 ranks, said before any collective."""
    from scalesgd.methods import METHODS as REGISTRY, MethodError  # noqa: PLC0415
    cfg = config.build(overrides={"train": {"method": "easgd"}, "dist": {"servers": 2}})
    REGISTRY["easgd"].check_ranks(3, cfg)
    with pytest.raises(MethodError, match=r"needs at least 3 ranks \(2 server shards and a worker\), got 2"):
        REGISTRY["easgd"].check_ranks(2, cfg)
    assert REGISTRY["easgd"].servers_for(cfg) == 2 and REGISTRY["gossip"].servers_for(cfg) == 0
    assert config.workers_of("asgd", 5, servers=2) == 3 and config.workers_of is choices.workers_of
    # the one source of the worker count, and its inverse, for every method and shard count
    for name, servers, ranks in itertools.product(choices.METHODS, (1, 2, 3), range(4, 9)):
        w = choices.workers_of(name, ranks, servers)
        assert w == (1 if name == "single" else ranks - (servers if name in choices.SERVER_METHODS else 0))
        if name != "single":
            assert choices.ranks_for(name, w, servers) == ranks
            cfg = config.build(overrides={"train": {"method": name}, "dist": {"servers": servers}})
            assert REGISTRY[name].select(cfg).servers_for(cfg) == ranks - w
