"""Published clusters as the test of the virtual cluster's clock: each row is one end-to-end
measurement of these methods on a real cluster, the cluster as a profile, the published number,
the virtual cluster's prediction for it and their ratio.

    python benchmarks/anchors.py [--only KEY ...] [--steps 24] [--json results/anchors.json]
    python benchmarks/anchors.py --accuracy-only    # the accuracy rows again (final-study, final-map)
    python benchmarks/report.py --update docs/results.md      # the table (block "anchors")

A prediction is a clock-only virtual run (``virtual/clockonly.py``: the methods' own code, every
message and collective on the simulated clock, no arithmetic) of ``--steps`` steps of the row's
method on the row's GPUs, timed as the published workload (the profile's ``stands_for``: a step
is that model's at that batch, every byte that model's); its seconds per iteration are the run's
training seconds over its steps.  A row's GPU speed and network come from the row's sources, or
are stated as assumptions where the source gives none (``CLUSTERS``: each profile's
``compute_source``).

**Accuracy after a fixed budget** (``ACCURACY``): a published difference in top-1 error between two
methods trained for the same epochs on one cluster, beside the difference the glyph proxy gives
for the same pair after full schedules of 8, 16 and 32 epochs (``final_study.py``'s runs, read
from ``results/final-study.json``), or of the map's 8 (local SGD: ``final_map.py``'s cell at p = 32
on the 10 GbE profile, ``results/final-map.json``, once complete); no run here.  The verdict
compared is the study's: is the method within δ = 1 point of the reference (it reaches the
quality), and so which is first to it.  The
proxy is a 20k-parameter network on 16-pixel glyphs with 8 images a worker, not ResNet-50 on
ImageNet: a row that misses says how many points the statistics miss by.

Rows whose published implementation is not comparable (a slow backend) are kept with the reason
and no goal; the goal of the others is a prediction within 25% of the published figure.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import sys
import tempfile
from pathlib import Path

from benchlib import git_commit

from scalesgd.choices import SERVER_METHODS
from scalesgd.launch import make_parser, resolve_config
from scalesgd.virtual import profile as P
from scalesgd.virtual.run import run as vrun

ROOT = Path(__file__).resolve().parents[1]
IMAGENET_TRAIN = 1_281_167
GOAL = 0.25                      # |predicted / published - 1| within this: the goal met
RESNET50 = {"model": "resnet50", "image_size": 224}
RESNET101 = {"model": "resnet101", "image_size": 224}
HOROVOD = ("Horovod's README of 2017-09-05 (github.com/horovod/horovod, commit d54e3a8), first table "
           "(16 GPUs)")
HOROVOD64 = HOROVOD.replace("first table (16 GPUs)", "second table (64 GPUs)")


def per_iteration(hours: float, epochs: int, global_batch: int) -> float:
    """Seconds per iteration of ``epochs`` ImageNet epochs at ``global_batch`` in ``hours``."""
    return hours * 3600 / (epochs * IMAGENET_TRAIN / global_batch)


# Goyal et al.'s baseline: 8 P100 in one server, 32 images a GPU, 90 epochs in 29 hours (section 1)
P100_STEP = per_iteration(29.0, 90, 256)

# The clusters, as profiles of the virtual cluster (docs/virtual.md#profiles).  A GPU's speed is an
# independent measurement on the same hardware, never one of the rows under test.
CLUSTERS = {
    "dgx1-v100-10gbe": dict(
        description="NVIDIA DGX-1 nodes (8 V100 on NVLink), 10 Gbit/s Ethernet between nodes at 80% "
                    "efficiency: SlowMo's and SGP's cluster",
        images_per_second=363.1, reference=RESNET50, stands_for={**RESNET50, "batch_size": 32},
        compute_source="NVIDIA DeepLearningExamples, ResNet-50 v1.5 in PyTorch (README of 2018-10, "
                       "pytorch-18.09 container), DGX-1 with V100 16 GB: one GPU trains at 363.1 images/s "
                       "in FP32 (8 GPUs: 2857.9), at 128 or 256 images a GPU (the table does not say; the "
                       "rows ran 32); NVLink taken as 150 GB/s a GPU",
        link_gbps=8, latency_us=25, ranks_per_node=8, intra_gbps=1200, mem_gbps=900),
    "p100x8-50gbe": dict(
        description="Big Basin servers (8 P100 on NVLink), 50 Gbit/s Ethernet at 80% efficiency: "
                    "Goyal et al.'s cluster",
        images_per_second=32 / P100_STEP, reference=RESNET50, stands_for={**RESNET50, "batch_size": 32},
        compute_source="Goyal et al. 2017, section 1: the 8-GPU baseline (one server, 32 images a GPU) "
                       "trains 90 epochs in 29 hours, 0.232 s an iteration, the same end-to-end clock as "
                       "the 'one hour' row (its node's own all-reduce and data loading included; figure "
                       "7's training iterations alone: an epoch in over 16 minutes, >= 0.19 s); NVLink "
                       "taken as 80 GB/s a GPU",
        link_gbps=40, latency_us=10, ranks_per_node=8, intra_gbps=640, mem_gbps=732),
}
CLUSTERS["p100x8-fdr2"] = {
    **CLUSTERS["p100x8-50gbe"],
    "description": "MN-1 nodes (8 P100), two FDR InfiniBand links (2 x 56 Gbit/s) a node at 80% "
                   "efficiency: Akiba et al.'s cluster",
    "compute_source": "as p100x8-50gbe: Goyal et al.'s 8-GPU P100 baseline (Caffe2; this row's ChainerMN "
                      "publishes no single-server speed); PCIe between a node's GPUs taken as 16 GB/s",
    "link_gbps": 89.6, "latency_us": 2, "intra_gbps": 128}

# Horovod's two benchmarks: ResNet-101 at 64 images a GPU (TensorFlow), each table's own one-GPU
# baseline the GPU's speed (the rows under test are its multi-GPU rows)
PASCAL = dict(reference=RESNET101, stands_for={**RESNET101, "batch_size": 64}, ranks_per_node=4,
              intra_gbps=128, mem_gbps=732)
CLUSTERS["pascal4-25gbe"] = dict(
    PASCAL, description="4 servers of 4 Pascal GPUs, RoCE-capable 25 Gbit/s Ethernet at 80% efficiency: "
                        "Horovod's first benchmark",
    images_per_second=119.4,
    compute_source=HOROVOD + ": 'Baseline single-GPU (batch size=64)', ResNet-101, 119.4 images/s; "
                   "the Pascal model is not named (P100's memory taken) nor the link inside a server "
                   "(PCIe, 16 GB/s, taken)",
    link_gbps=20, latency_us=5)
CLUSTERS["pascal4-40gbe"] = dict(
    PASCAL, description="16 servers of 4 Pascal GPUs, plain 40 Gbit/s Ethernet (TCP) at 80% efficiency: "
                        "Horovod's second benchmark",
    images_per_second=136.0,
    compute_source=HOROVOD64 + ": 'Baseline single-GPU (batch size=64)', ResNet-101, 136.0 images/s; "
                   "the rest as pascal4-25gbe",
    link_gbps=32, latency_us=25)


def per_image(images_per_second: float, gpus: int, batch: int = 64) -> float:
    """Seconds per iteration of ``gpus`` GPUs at ``batch`` images each, from images/s."""
    return gpus * batch / images_per_second


SGP = "--method gossip --gossip push --gossip-graph exponential --hierarchy node"
# The rows: (key, source, cluster, GPUs, flags, published seconds per iteration, what the
# source says, comparable?, note)
ROWS = [
    dict(key="slowmo-allreduce", cluster="dgx1-v100-10gbe", gpus=256, flags="--method allreduce",
         published=0.420, source="Wang et al. 2020, SlowMo (ICLR), Table 2(a): AR-SGD 420 ms an iteration",
         network="10 GbE", method="all-reduce (AR-SGD)", comparable=True,
         note="ResNet-50, 32 nodes x 8 V100, batch 8192; the backend is not stated"),
    dict(key="slowmo-sgp", cluster="dgx1-v100-10gbe", gpus=256, flags=SGP, published=0.304,
         source="Wang et al. 2020, SlowMo (ICLR), Table 2(a): SGP 304 ms an iteration",
         network="10 GbE", method="push-sum gossip (SGP), a node an agent", comparable=True,
         note="one peer a step on a directed exponential graph, between nodes (each node's 8 GPUs "
              "reduced inside it)"),
    dict(key="slowmo-osgp", cluster="dgx1-v100-10gbe", gpus=256, flags=SGP + " --gossip-overlap",
         published=0.271, source="Wang et al. 2020, SlowMo (ICLR), Table 2(a): OSGP 271 ms an iteration",
         network="10 GbE", method="overlapped push-sum (OSGP), a node an agent", comparable=True,
         note="as SGP, the exchange overlapped with the next step"),
    dict(key="slowmo-localsgd", cluster="dgx1-v100-10gbe", gpus=256,
         flags="--method localsgd --tau 12 --hierarchy node", published=0.294,
         source="Wang et al. 2020, SlowMo (ICLR), Table 2(a): Local SGD (tau = 12) 294 ms an iteration",
         network="10 GbE", method="local SGD, tau = 12, a node an agent", comparable=True,
         note="the nodes average every 12 steps; inside a node the gradients every step"),
    dict(key="sgp-sgp", cluster="dgx1-v100-10gbe", gpus=256, flags=SGP,
         published=per_iteration(1.6, 90, 8192),
         source="Assran et al. 2019, SGP (ICML), abstract: 90 epochs in around 1.6 hours",
         network="10 GbE", method="push-sum gossip (SGP), a node an agent", comparable=True,
         note="ResNet-50, 32 nodes x 8 GPUs, batch 8192; 'around 1.6 hours' over 14,075 iterations "
              "(evaluation included, if the authors' clock had it)"),
    dict(key="sgp-allreduce", cluster="dgx1-v100-10gbe", gpus=256, flags="--method allreduce",
         published=per_iteration(5.0, 90, 8192),
         source="Assran et al. 2019, SGP (ICML), abstract: all-reduce SGD takes over 5 hours",
         network="10 GbE", method="all-reduce", comparable=False,
         note="not comparable: the all-reduce ran on PyTorch 0.5's TCP backend (the authors' "
              "scripts), far slower than NCCL; 'over 5 hours' is a lower bound"),
    dict(key="goyal-allreduce", cluster="p100x8-50gbe", gpus=256, flags="--method allreduce",
         published=per_iteration(1.0, 90, 8192),
         source="Goyal et al. 2017, abstract and section 5: ResNet-50, batch 8192, 256 GPUs, 90 epochs in "
                "one hour", network="50 GbE", method="all-reduce", comparable=True,
         note="Gloo's halving/doubling between servers, NCCL inside; 'one hour' is the headline clock"),
    dict(key="akiba-allreduce", cluster="p100x8-fdr2", gpus=1024, flags="--method allreduce",
         published=per_iteration(0.25, 90, 32768),
         source="Akiba et al. 2017, abstract: ResNet-50, 90 epochs in 15 minutes on 1024 P100, batch 32k",
         network="2 x FDR InfiniBand", method="all-reduce", comparable=True,
         note="ChainerMN's ring all-reduce; the precision of the compute is not stated in the abstract"),
    dict(key="horovod-nccl-16", cluster="pascal4-25gbe", gpus=16, flags="--method allreduce",
         published=per_image(1746.2, 16), source=HOROVOD + ": RDMA Horovod (allreduce on GPU with NCCL), "
         "ResNet-101, 1,746.2 images/s", network="25 GbE (RoCE)", method="all-reduce", comparable=True,
         note="NCCL's all-reduce with Horovod's tensor fusion, under backward as this program's buckets "
              "are; the TCP row of the same table (1,685.1 images/s) has the same prediction"),
    dict(key="horovod-nccl-64", cluster="pascal4-40gbe", gpus=64, flags="--method allreduce",
         published=per_image(7741.6, 64), source=HOROVOD64 + ": TCP Horovod (allreduce on GPU with NCCL), "
         "ResNet-101, 7,741.6 images/s", network="40 GbE", method="all-reduce", comparable=True,
         note="as horovod-nccl-16, over plain TCP"),
    dict(key="tf-ps-16", cluster="pascal4-25gbe", gpus=16, flags="--method asgd --n-sync 1 --servers 4",
         published=per_image(1168.8, 16), source=HOROVOD + ": Distributed TensorFlow (variables on CPU), "
         "ResNet-101, 1,168.8 images/s", network="25 GbE (RoCE)",
         method="parameter servers (A-SGD, n_sync = 1, 4 shards)", comparable=False,
         note="not comparable: TensorFlow's gRPC parameter servers (the same table has VGG-16 on 16 GPUs "
              "at 0.6x one GPU), synchronous, their number and placement not stated; predicted as this "
              "program's A-SGD pushing and fetching every step through 4 server shards, which as ranks "
              "0-3 fill a node of their own (TensorFlow puts a server beside each server's workers)"),
    dict(key="tf-ps-64", cluster="pascal4-40gbe", gpus=64, flags="--method asgd --n-sync 1 --servers 16",
         published=per_image(4269.2, 64), source=HOROVOD64 + ": Distributed TensorFlow (variables on "
         "CPU), ResNet-101, 4,269.2 images/s", network="40 GbE",
         method="parameter servers (A-SGD, n_sync = 1, 16 shards)", comparable=False,
         note="as tf-ps-16, with 16 shards on 4 nodes of their own"),
]


DELTA = 0.01                     # the study's quality: within 1 point of the reference's final error
SLOWMO_T1 = ("Wang et al. 2020, SlowMo (ICLR), Table 1, ImageNet rows (the OpenReview text): best top-1 "
             "validation accuracy after 90 epochs, 32 nodes x 8 V100, 10 GbE, batch 8192")
# Published accuracy differences: (key, source, the method and its reference, published top-1 error
# of each in %, the proxy's pair: ("epochs", method, reference) of final_study's budget runs or
# ("pilot", method, reference) of its pilot at p = 32 on the 10 GbE profile; None: not run yet)
# final_map.py's cell for the DGX-1s on 10 GbE as 32 agents (the synchronous errors: any condition's)
MAP_CELL = "v100-10gbe-resnet50/typical/p32"
ACCURACY = [
    dict(key="goyal-accuracy", cluster="p100x8-50gbe",
         source="Goyal et al. 2017, Table 1: ResNet-50, 90 epochs, top-1 error (mean of 5 runs)",
         method="all-reduce, 256 GPUs, batch 8k (gradual warm-up)", error=23.74,
         reference="one server, 8 GPUs, batch 256", reference_error=23.60,
         proxy=("epochs", "allreduce", "single"),
         proxy_said="all-reduce at p = 32 (global batch 256) against one worker (batch 8), the same epochs",
         published_time_ratio=1.0 / 29.0,
         note="the 256-GPU run takes 1 hour, the baseline 29 (section 1): first to the quality if within it"),
    dict(key="slowmo-osgp-accuracy", cluster="dgx1-v100-10gbe", source=SLOWMO_T1,
         method="overlapped push-sum (OSGP), tau = 48 in Table 1's setting", error=100 - 74.96,
         reference="all-reduce (AR-SGD)", reference_error=100 - 76.00,
         proxy=("pilot", "pushsum-ov", "allreduce"),
         proxy_said="overlapped push-sum against all-reduce at p = 32 on the 10 GbE profile (typical), each "
                    "at its rate chosen at 16 epochs",
         published_time_ratio=0.271 / 0.420, note="Table 2(a): 271 against 420 ms an iteration"),
    dict(key="slowmo-sgp-accuracy", cluster="dgx1-v100-10gbe", source=SLOWMO_T1,
         method="push-sum (SGP)", error=100 - 75.15, reference="all-reduce (AR-SGD)",
         reference_error=100 - 76.00, proxy=None,
         proxy_said="not run: the pilot ran the overlapped form only",
         published_time_ratio=0.304 / 0.420, note="Table 2(a): 304 against 420 ms an iteration"),
    dict(key="slowmo-localsgd-accuracy", cluster="dgx1-v100-10gbe", source=SLOWMO_T1,
         method="local SGD, tau = 12", error=100 - 69.94, reference="all-reduce (AR-SGD)",
         reference_error=100 - 76.00, proxy=("map", "localsgd", "allreduce", MAP_CELL),
         proxy_said="local SGD against all-reduce in final_map.py's cell at p = 32 on the 10 GbE profile "
                    "(each at its own search's choice, 5 seeds; E = 8)",
         published_time_ratio=0.294 / 0.420, note="Table 2(a): 294 against 420 ms an iteration"),
]


def map_gap(fmap: dict | None, cell: str, m: str, ref: str) -> dict[str, float]:
    """{E: ``m``'s mean final error less ``ref``'s} in final_map.py's ``cell`` (network/condition/p)
    of ``fmap`` (results/final-map.json); empty while the cell is not complete."""
    net, cond, p = cell.split("/")
    for c in (fmap or {}).get("cells", []):
        here = (c["network"], c["condition"], f"p{c['p']}") == (net, cond, p)
        if here and {m, ref} <= set(c["methods"]):
            return {str(fmap["E"]): c["methods"][m]["final_error"] - c["methods"][ref]["final_error"]}
    return {}


def accuracy(final: dict | None, fmap: dict | None = None) -> list[dict]:
    """``ACCURACY`` beside the proxy's differences (``final``: results/final-study.json; ``fmap``:
    results/final-map.json, for a row read from one of its cells): per row the published difference
    in points and whether the method reaches the quality (within DELTA of the reference), and first
    to it (also quicker); the proxy's difference at each budget and its verdicts; ``agrees``: the
    same verdict at the longest budget (the nearest to the papers' 90 epochs), None where the proxy
    has no such runs."""
    out = []
    for row in ACCURACY:
        gap = (row["error"] - row["reference_error"]) / 100
        reaches = gap <= DELTA
        got = dict(row, published_gap=gap, published_reaches=reaches,
                   published_first=reaches and row["published_time_ratio"] < 1, proxy_gaps=None, agrees=None)
        gaps = {}
        if row["proxy"] is not None and row["proxy"][0] == "map":
            gaps = map_gap(fmap, row["proxy"][3], row["proxy"][1], row["proxy"][2])
            if not gaps:
                got["proxy_said"] += ": the cell is not complete yet"
        elif final is not None and row["proxy"] is not None:
            kind, m, ref = row["proxy"]
            if kind == "epochs":
                gaps = {e: final["epochs"][m][e]["mean"] - final["epochs"][ref][e]["mean"]
                        for e in final["epochs"][m] if e in final["epochs"][ref]}
            else:
                ck = final["pilot"]["check"]
                gaps = {str(v["epochs"]): v["methods"][m]["final_error"] - v["methods"][ref]["final_error"]
                        for v in (ck.get("short"), ck.get("budget"), ck.get("check")) if v}
        if gaps:
            longest = max(gaps, key=int)
            got.update(proxy_gaps=gaps, proxy_budget=int(longest), proxy_gap=gaps[longest],
                       proxy_reaches=gaps[longest] <= DELTA,
                       agrees=(gaps[longest] <= DELTA) == reaches,
                       miss_points=gaps[longest] - gap)
        out.append(got)
    return out


def profile(name: str, tmp: Path) -> P.Profile:
    """``CLUSTERS[name]`` as a validated profile (through a file, as a user's would be loaded)."""
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"name": name, **CLUSTERS[name]}))
    return P.load(str(path))


def predict(row: dict, steps: int, tmp: Path) -> dict:
    """Seconds per iteration of ``row`` on its cluster: a clock-only virtual run of ``steps``
    steps (a proxy job timed as the cluster's ``stands_for``: ResNet-50 at 32 images a GPU, or
    Horovod's ResNet-101 at 64)."""
    prof = profile(row["cluster"], tmp)
    workers, batch = row["gpus"], prof.stands_for["batch_size"]
    run_dir = tmp / f"run-{row['key']}"
    argv = ["--model", "resnet20", "--width", "0.25", "--image-size", "32", "--batch-size", str(batch),
            "--epochs", "1", "--eval-every", "1", "--run-dir", str(run_dir), *row["flags"].split()]
    cfg = resolve_config(make_parser().parse_args(argv))
    log = logging.getLogger("scalesgd")
    level = log.level
    log.setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            s = vrun(cfg, workers, prof, threads=1,
                     clock_only=dict(train=workers * batch * steps, val=workers, classes=10))
    finally:
        log.setLevel(level)
    seconds = s["train_seconds"] / steps
    split = {k: v / steps for k, v in s["time_split_rank0"].items() if k != "data"}
    if cfg.train.method in SERVER_METHODS:       # rank 0 serves: a worker's step is the profile's,
        step = P.Compute(prof, cfg, 10).seconds  # the rest of its time exchanging or waiting
        split = dict(compute=step, comm=seconds - step, wait=0.0)
    return dict(predicted=seconds, steps=steps, split_per_step=split)


def differences(rows: list[dict]) -> list[dict]:
    """Each comparable row against the comparable all-reduce row of the same source and cluster
    (SlowMo's Table 2(a): one table, one cluster): the published difference in seconds per
    iteration beside the predicted one.  The GPU's step is the same on both sides, so it cancels:
    what is left tests the clock's communication and waiting alone, whatever the compute."""
    out = []
    for r in rows:
        base = next((b for b in rows if b is not r and b["comparable"] and r["comparable"]
                     and b["cluster"] == r["cluster"] and b["flags"] == "--method allreduce"
                     and b["source"].split(":")[0] == r["source"].split(":")[0]), None)
        if base is None:
            continue
        out.append(dict(key=r["key"], against=base["key"], published=base["published"] - r["published"],
                        predicted=base["predicted"] - r["predicted"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="row keys (default: every row)")
    ap.add_argument("--steps", type=int, default=24, help="steps of each clock-only run (24: two "
                    "periods of local SGD's tau = 12)")
    ap.add_argument("--json", type=Path, default=ROOT / "results" / "anchors.json")
    ap.add_argument("--accuracy-only", action="store_true", help="recompute the accuracy rows from "
                    "results/final-study.json and results/final-map.json, and keep the throughput rows of "
                    "--json as they are")
    a = ap.parse_args(argv)
    final_path = ROOT / "results" / "final-study.json"
    final = json.loads(final_path.read_text()) if final_path.exists() else None
    map_path = ROOT / "results" / "final-map.json"
    fmap = json.loads(map_path.read_text()) if map_path.exists() else None
    if a.accuracy_only:
        res = json.loads(a.json.read_text())
        res["accuracy"] = accuracy(final, fmap)
        a.json.write_text(json.dumps(res, indent=1) + "\n")
        return 0
    unknown = set(a.only or ()) - {r["key"] for r in ROWS}
    if unknown:
        ap.error(f"--only: no row {', '.join(sorted(unknown))} (rows: {', '.join(r['key'] for r in ROWS)})")
    out = []
    with tempfile.TemporaryDirectory() as d:
        for row in ROWS:
            if a.only is not None and row["key"] not in a.only:
                continue
            got = predict(row, a.steps, Path(d))
            ratio = got["predicted"] / row["published"]
            sp = got["split_per_step"]             # the compute a step would need for a match
            implied = row["published"] - sp["comm"] - sp["wait"]
            out.append({**row, **got, "ratio": ratio, "implied_compute": implied,
                        "goal_met": abs(ratio - 1) <= GOAL if row["comparable"] else None})
            print(f"{row['key']}: predicted {1000 * got['predicted']:.0f} ms an iteration, published "
                  f"{1000 * row['published']:.0f} ms: {ratio:.2f}x"
                  + ("" if row["comparable"] else " (not comparable)"), flush=True)
    res = {"experiment": "anchors", "commit": git_commit(), "goal": GOAL, "steps": a.steps,
           "clusters": CLUSTERS, "rows": out, "differences": differences(out), "delta": DELTA,
           "accuracy": accuracy(final, fmap)}
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
