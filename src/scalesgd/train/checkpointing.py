"""What a run writes into a checkpoint (reading it back, and every resume check: ``resuming.py``).

The file format (one HDF5 file, every rank's arrays and JSON state, digests) is ``io/checkpoint.py``;
this module decides the content.  Per rank, its ``RankState`` (``rankstate.py``): ``params``,
``momentum``, ``buffers`` and the method's arrays; the JSON ``state`` holds the loop's counters
(``LoopState``), the method's scalars, the straggler's generator, the bad samples and the trace's
length.  Rank 0 adds the run's metadata (config, history, the last boundary
processed, the checkpoint generation).
"""
from __future__ import annotations

import hashlib
import logging
import time

from ..io import checkpoint as ckpt
from .rankstate import RankState


def layout_signature(ps) -> str:
    """A short hash of the parameter layout (names and shapes): checkpoints fit only its model."""
    text = ";".join(f"{sp.name}:{sp.shape}" for sp in ps.layout.specs)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def save(run, boundary_done: int, reason: str) -> None:
    """Collective (inside a phase): every rank's ``RankState`` into one file (rank 0 writes), then
    keep the newest ``train.keep_checkpoints``.  ``run``: the rank's ``loop.Run``."""
    s, run_dir, history = run.s, run.run_dir, run.history
    m, ps, c = s.method, s.model.ps, s.control
    m.codec.quiesce(ps)
    run.trace.record("checkpoint", reason=reason, boundary=boundary_done)
    run.trace.flush()
    g = int(c.max_over_ranks([m.global_samples])[0])
    arrays, state = RankState.of_run(run, copies=False).to_record(m.global_samples)
    writer = None
    if s.topo.is_root:
        cfg = s.cfg
        meta = dict(config=cfg.to_dict(), method=m.name, ranks=s.topo.size, model=cfg.model.model,
                    num_params=s.model.num_params, layout=layout_signature(ps), global_samples=g,
                    boundary_done=boundary_done, ckpt_done=int(c.signals.seen[1]), reason=reason,
                    history=history, created=time.strftime("%Y-%m-%dT%H:%M:%S"))
        writer = ckpt.Writer(ckpt.checkpoint_dir(run_dir), g, meta)
    try:
        c.funnel(arrays, state, writer.add_rank if writer else None)
        if writer:
            path = writer.commit()
            ckpt.prune(path.parent, s.cfg.train.keep_checkpoints)
            logging.getLogger("scalesgd").info("checkpoint %s (%s)", path, reason)
    except BaseException:
        if writer:
            writer.abort()
        raise
