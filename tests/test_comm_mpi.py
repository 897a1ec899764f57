"""comm/ under real mpiexec where the method launches do not reach: a one-rank job (every check
that means something there, in one launch) and the collectives helpers at an odd world size.
Every launch has a timeout."""
import pytest

from mpirun import check, needs_mpi, run_mpi

pytestmark = [pytest.mark.mpi, needs_mpi]
COLLECTIVES = 4                    # checks in tests/mpi/collectives_check.py
ONE_RANK = COLLECTIVES + 4         # ... and in tests/mpi/one_rank_check.py (windows, all-reduce)


def test_one_rank_invariants():
    """Collectives, RMA windows aimed at oneself, the all-reduce method: -n 1, one launch."""
    out = check(run_mpi(1, ["tests/mpi/one_rank_check.py"], timeout=90))
    assert out.count(": ok") == ONE_RANK, out


def test_collectives_invariants():
    """Broadcasts, gathers of uneven lengths, reductions, the checkpoint funnel: 3 ranks."""
    out = check(run_mpi(3, ["tests/mpi/collectives_check.py"], timeout=60))
    assert out.count(": ok") == COLLECTIVES, out


def test_the_default_bucket_size_overlaps_small_models_and_stays_large_for_big_ones():
    """Issue 24, item 3: ``bucket_mb = 25`` put ResNet-20 in one bucket (nothing overlapped); the
    default (-1) is gradient bytes / 8, at least ranks x 64 KiB, at most 25 MB."""
    import types

    from scalesgd import config as C
    from scalesgd.comm.mpi.buckets import auto_bucket_bytes, make_buckets
    from scalesgd.comm.mpi.device import bucket_bytes_of
    from scalesgd.nn.resnet import ResNet
    assert C.build(None, {}).dist.bucket_mb == -1
    with pytest.raises(C.ConfigError, match="dist.bucket_mb: -1 \\(auto\\) or a size >= 0"):
        C.build(None, {"dist": {"bucket_mb": -0.5}})
    r20 = ResNet("resnet20", 10, seed=None).ps
    b = bucket_bytes_of(C.build(None, {}).dist, r20.grads, 4)
    assert b == 4 * 64 * 1024 and len(make_buckets(r20.layout, b, 4)) == 4
    assert len(make_buckets(r20.layout, 25_000_000, 4)) == 1           # the former default
    assert bucket_bytes_of(types.SimpleNamespace(bucket_mb=0.5), r20.grads, 4) == 500_000
    r50 = 25_557_032 * 4
    assert auto_bucket_bytes(r50, 64) == r50 // 8                      # 12.8 MB, 7 buckets
    assert auto_bucket_bytes(r50, 256) == 256 * 64 * 1024              # the floor from 195 ranks
    assert auto_bucket_bytes(10 ** 10, 8) == 25_000_000                 # the cap
