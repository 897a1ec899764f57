"""A study run's clock and exchange order without its arithmetic, in one process:
``python clock_trace.py ARGS`` (the virtual cluster's arguments, ``--data``, ``--run-dir``,
``--workers``, ``--profile`` and ``--condition`` among them), run with the pinned tree's ``src`` on
``PYTHONPATH``.  It runs the configuration as a clock-only virtual run (``virtual/clockonly.py``:
the real run's clock, its models computing nothing) and prints one JSON line: ``history`` (global
samples, training seconds at every validation) and ``trace`` (``trace_digest`` of the run's event
order, ``RUN_DIR/trace``).

Two push-sum runs of one configuration and seed whose event orders are equal compute the same
numbers (a replay redoes a run from its order alone, ``io/trace.py``): ``final_map.py`` uses
this to re-time a run instead of repeating its arithmetic."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import sys
from pathlib import Path


def trace_digest(run_dir: Path) -> str:
    """sha256 over every rank's trace file, in rank order (each file's name and bytes)."""
    h = hashlib.sha256()
    files = sorted((Path(run_dir) / "trace").glob("rank-*.jsonl"), key=lambda p: int(p.stem[5:]))
    if not files:
        raise FileNotFoundError(f"{run_dir}: no trace")
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def main(argv: list[str]) -> int:
    from scalesgd.launch import make_parser, resolve_config
    from scalesgd.virtual import profile as P
    from scalesgd.virtual.run import add_arguments
    from scalesgd.virtual.run import run as vrun
    ap = make_parser()
    add_arguments(ap)
    args = ap.parse_args(argv)
    cfg = resolve_config(args)
    manifest = json.loads((Path(cfg.data.data) / "manifest.json").read_text())
    prof = P.load(args.profile)
    logging.getLogger("scalesgd").setLevel(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        s = vrun(cfg, args.workers, prof, threads=1, condition=P.condition_of(prof, args.condition),
                 clock_only=dict(train=manifest["splits"]["train"]["count"],
                                 val=manifest["splits"]["val"]["count"], classes=manifest["num_classes"]))
    print(json.dumps(dict(history=[[h["global_samples"], h["train_seconds"]] for h in s["history"]],
                          trace=trace_digest(Path(cfg.train.run_dir)))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
