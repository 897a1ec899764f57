"""Writes slurm/<method>_<nodes>.sh (and demo.sh) from slurm/template.sh: ``python slurm/generate.py``.
Each script holds only its #SBATCH lines and defaults, then sources the shared body slurm/run.sh.

* allreduce_N.sh, gossip_N.sh: N nodes, one task (rank) and one GPU per node.
* easgd_N.sh: N workers + the parameter-server rank = N+1 tasks on N nodes; the server shares the
  first node (and its GPU) with worker 1, as the authors ran the centre next to a worker.
* asgd_8.sh: Paine et al.'s 8 clients + server (CONFIG selects n_sync and cold/warm start).
* allreduce_Nx8.sh, gossip_Nx8.sh, easgd_Nx8.sh (N = 8, 16: 64 and 128 GPUs): nodes with 8 GPUs,
  one rank per GPU.  Gossip and EASGD run with ``--hierarchy node`` (their job files
  imagenet-{gossip,easgd}-Nx8.toml): a node's 8 ranks average gradients every step and only its
  leader gossips or talks to the server.  All-reduce runs flat with the 64- or 128-node job file:
  on GPUs its NCCL transport is topology-aware by itself.  easgd_Nx8.sh: 8N workers + the server
  (8N+1 tasks, ``--distribution=cyclic``: 9 on the first node, the server sharing GPU 0).  6 CPUs
  per task, so that 9 tasks fit a 64-core node.
* demo.sh: the built-in digits on 4 CPU ranks of one node, no GPU.
"""
from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCALES = (8, 16, 32, 64, 128)
MULTI_GPU_NODES = (8, 16)          # x 8 GPUs: the 64- and 128-GPU runs on 8-GPU nodes
GPUS_PER_NODE = 8


def wall_time(nodes: int) -> str:
    """90 ImageNet epochs take longer on fewer nodes; a requeue continues past the limit anyway."""
    return "48:00:00" if nodes <= 16 else "24:00:00"


def spec(method: str, nodes: int) -> dict[str, str]:
    if method in ("easgd", "asgd"):
        tasks = f"#SBATCH --ntasks={nodes + 1}"
        title = (f"{method} with {nodes} workers + 1 parameter server ({nodes + 1} ranks) "
                 f"on {nodes} GPU nodes.")
    else:
        tasks = "#SBATCH --ntasks-per-node=1"
        title = f"{method} on {nodes} GPU nodes, one rank and one GPU per node."
    config = ("jobs/imagenet-asgd8-nsync10-cold.toml" if method == "asgd"
              else f"jobs/imagenet-{method}-{nodes}.toml")
    return dict(NAME=f"{method}_{nodes}", TITLE=f"Jin et al.'s ImageNet setup: {title}", NODES=str(nodes),
                TASKS=tasks, CPUS="8", GPUS="#SBATCH --gres=gpu:1", TIME=wall_time(nodes), CONFIG=config)


def multi_gpu_spec(method: str, nodes: int) -> dict[str, str]:
    """``METHOD_NODESx8.sh``: NODES nodes of 8 GPUs, one rank per GPU, the hierarchy for gossip and
    EASGD (their job files), flat all-reduce (the job file of as many single-GPU nodes)."""
    g, ranks = GPUS_PER_NODE, nodes * GPUS_PER_NODE
    tasks = f"#SBATCH --ntasks-per-node={g}"
    if method == "easgd":
        # cyclic: 9 tasks on the first node and 8 on each other, whatever the nodes' CPU count (block
        # distribution could fill the first node up to its CPUs)
        tasks = f"#SBATCH --ntasks={ranks + 1}\n#SBATCH --distribution=cyclic"
        title = (f"easgd with {ranks} workers + 1 parameter server on {nodes} nodes x {g} GPUs; "
                 f"each node's workers average every step and their leader talks to the server.")
    elif method == "gossip":
        title = (f"gossip on {nodes} nodes x {g} GPUs ({ranks} ranks); each node's ranks average "
                 f"every step and only its leader gossips.")
    else:
        title = f"allreduce on {nodes} nodes x {g} GPUs ({ranks} ranks), flat (NCCL is topology-aware)."
    config = (f"jobs/imagenet-allreduce-{ranks}.toml" if method == "allreduce"
              else f"jobs/imagenet-{method}-{nodes}x{g}.toml")
    return dict(NAME=f"{method}_{nodes}x{g}",
                TITLE=f"Jin et al.'s ImageNet setup on multi-GPU nodes: {title}",
                NODES=str(nodes), TASKS=tasks, CPUS="6", GPUS=f"#SBATCH --gres=gpu:{g}",   # 9 x 6 <= 64 cores
                TIME=wall_time(ranks), CONFIG=config)


def demo_spec() -> dict[str, str]:
    return dict(NAME="demo",
                TITLE="The built-in demo: ResNet-20 on the digits, all-reduce SGD on 4 CPU ranks.",
                NODES="1", TASKS="#SBATCH --ntasks=4", CPUS="1", GPUS="# (no GPU)", TIME="00:15:00",
                CONFIG="jobs/digits-allreduce.toml")


def render(template: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        template = template.replace(f"@{key}@", value)
    left = re.findall(r"@[A-Z]+@", template)
    assert not left, f"unfilled placeholders {left} in slurm/template.sh"
    return template


def all_scripts() -> dict[str, str]:
    template = (HERE / "template.sh").read_text()
    specs = [spec(m, n) for m in ("allreduce", "easgd", "gossip") for n in SCALES]
    specs += [multi_gpu_spec(m, n) for m in ("allreduce", "easgd", "gossip") for n in MULTI_GPU_NODES]
    specs += [spec("asgd", 8), demo_spec()]
    return {f"{s['NAME']}.sh": render(template, s) for s in specs}


def main() -> None:
    for name, text in all_scripts().items():
        path = HERE / name
        path.write_text(text)
        path.chmod(0o755)
    print(f"wrote {len(all_scripts())} scripts in {HERE}")


if __name__ == "__main__":
    main()
