"""What every survival of a lost rank shows in its run directory, real (``test_survival.py``,
ULFM) or virtual (``test_survival_virtual.py``)."""
import json
from pathlib import Path

from scalesgd.io import checkpoint as ckpt


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def records(run_dir: Path, rank: int, kind: str) -> list[dict]:
    lines = (run_dir / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def lines(run_dir: Path, rank: int) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()]


def check_survived(run_dir: Path, dead: list[int], workers_after: int, ranks: int = 4) -> dict:
    """What every survival shows; returns the summary."""
    s = summary(run_dir)
    # (ranks that die close together may be survived in one recovery or in two)
    assert sorted(r for f in s["failures"] for r in f["ranks"]) == sorted(dead)
    for i, f in enumerate(s["failures"]):
        assert f["recovery_seconds"] > 0 and f["shrink_seconds"] > 0 and f["global_samples"] >= 0
        if f["global_samples"] == 0:     # only if no survivor had trained a step before it: a rank
            for rank in set(range(ranks)) - set(dead):    # that ran ahead alone may die with its
                recs = lines(run_dir, rank)               # count (push-sum's counter host)
                first = [j for j, r in enumerate(recs) if r["kind"] == "failure"][i]
                assert not [r for r in recs[:first] if r["kind"] == "step"], (rank, f)
    assert s["ranks"] == ranks - len(dead) and s["workers"] == workers_after
    h = s["history"]
    assert [r["global_samples"] for r in h] == sorted({r["global_samples"] for r in h})  # each once
    last = s["failures"][-1]["global_samples"]
    assert any(r["global_samples"] > last for r in h)              # evaluated after the failure
    assert all(r["workers"] == workers_after for r in h if r["global_samples"] > last)
    for rank in set(range(ranks)) - set(dead):                    # every survivor recorded it
        assert [r["ranks"] for r in records(run_dir, rank, "failure")] == [f["ranks"] for f in s["failures"]]
        recs = lines(run_dir, rank)                               # ... and trained on after it
        after = [r for r in recs[max(i for i, r in enumerate(recs) if r["kind"] == "failure"):]
                 if r["kind"] in ("step", "server")]
        assert after, f"rank {rank} did nothing after the failure"
    later = sorted((p for p in ckpt.checkpoint_dir(run_dir).glob("ckpt-*.h5")
                    if ckpt.read_meta(p)["global_samples"] > last), key=lambda p: p.name)
    assert later and all(ckpt.read_meta(p)["ranks"] == ranks - len(dead) for p in later)  # survivors'
    if len(dead) == 1:              # (one death at step 8 of about 18: a periodic one follows it)
        assert ckpt.read_meta(later[0])["reason"] == "scheduled"
    return s
