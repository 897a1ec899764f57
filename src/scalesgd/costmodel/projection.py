"""The cost model's projection to a GPU cluster: time per epoch, efficiency, the answers, a figure."""
from __future__ import annotations

from pathlib import Path

from . import cost, sim
from .workloads import IMAGENET_TRAIN, METHOD_OF, PARAMS, RESNET18_GMAC, RESNET50_GMAC


def cluster_workloads(a) -> list[cost.Work]:
    t50 = a.batch / a.gpu_img_s_resnet50
    t18 = t50 * RESNET18_GMAC / RESNET50_GMAC
    return [cost.Work("resnet18", t18, a.batch, PARAMS["resnet18"] * 4),
            cost.Work("resnet50", t50, a.batch, PARAMS["resnet50"] * 4)]


def project(w: cost.Work, net: cost.Net, workers: list[int], straggle: sim.Straggle, steps: int) -> dict:
    out = {}
    single = w.batch / w.step_seconds
    for m in ("allreduce", "easgd", "asgd", "gossip-pull", "gossip-push"):
        method, variant = METHOD_OF[m]
        rows = []
        for p in workers:
            an = cost.step_seconds(method, p, w, net, variant=variant)
            st = sim.simulate(method, p, w, net, steps=steps, variant=variant, straggle=straggle,
                              seed=p)
            rows.append(dict(workers=p, step=an["step"], comm=an["comm"],
                             samples_per_second=an["samples_per_second"],
                             efficiency=an["samples_per_second"] / (p * single),
                             epoch_minutes=IMAGENET_TRAIN / an["samples_per_second"] / 60,
                             server_utilization=an.get("server_utilization"),
                             sim_samples_per_second=st.samples_per_second,
                             sim_efficiency=st.samples_per_second / (p * single),
                             sim_epoch_minutes=IMAGENET_TRAIN / st.samples_per_second / 60,
                             sim_server_utilization=st.server_utilization if method in ("easgd", "asgd")
                             else None, sim_staleness_mean=st.staleness_mean,
                             sim_wait=st.wait_mean))
        out[m] = rows
    return out


def answers(w: cost.Work, net: cost.Net, proj: dict) -> dict:
    ts = cost.server_service_seconds(w.param_bytes, net)
    sat = cost.saturation_workers(w.step_seconds, ts)
    crossover = None
    for ar, es in zip(proj["allreduce"], proj["easgd"]):
        if ar["samples_per_second"] > es["samples_per_second"]:
            crossover = ar["workers"]
            break
    # finer: the smallest p (1..1024) where all-reduce's analytic throughput beats the server's
    fine = next((p for p in range(2, 1025)
                 if cost.step_seconds("allreduce", p, w, net)["samples_per_second"]
                 > cost.step_seconds("easgd", p, w, net)["samples_per_second"]), None)
    g = proj["gossip-pull"]
    return dict(server_service_ms=1e3 * ts, server_saturates_at_workers=sat,
                allreduce_overtakes_server_at_workers=fine, allreduce_overtakes_in_table_at=crossover,
                gossip_step_ms={r["workers"]: 1e3 * r["step"] for r in g},
                gossip_sim_step_ms={r["workers"]: 1e3 * w.batch * r["workers"] / r["sim_samples_per_second"]
                                    for r in g},
                allreduce_comm_ms={r["workers"]: 1e3 * r["comm"] for r in proj["allreduce"]},
                easgd_tau_to_keep_up={r["workers"]: cost.tau_to_keep_up(r["workers"], w.step_seconds, ts)
                                      for r in proj["easgd"]},
                **extensions(w, net, [r["workers"] for r in g]))


def extensions(w: cost.Work, net: cost.Net, workers: list[int], bound: int = 4) -> dict:
    """Issue 15's extensions projected (tau = 1): where K server shards saturate and the shards a
    server needs at p workers; the fraction of pushes asgd rejects with --max-staleness ``bound``
    (simulated, FIFO server); overlapped gossip's ms per step next to blocking gossip's."""
    sat = {k: cost.step_seconds("easgd", 1, w, net, shards=k)["saturation_workers"] for k in (1, 2, 4, 8, 16)}
    need = {p: next((k for k in range(1, 257)
                     if cost.step_seconds("easgd", 1, w, net, shards=k)["saturation_workers"] >= p), None)
            for p in workers}
    rejected = {}
    for p in workers:
        r = sim.simulate("asgd", p, w, net, steps=100, max_staleness=bound, seed=p)
        rejected[p] = r.rejected / max(r.exchanges, 1)
    return dict(shards_saturate_at_workers=sat, shards_to_keep_up=need, max_staleness=bound,
                asgd_rejected_fraction=rejected,
                gossip_overlap_step_ms={p: 1e3 * cost.step_seconds("gossip", p, w, net, overlap=True)["step"]
                                        for p in workers})


# ----------------------------------------------------------------------------- output
def draw(path: Path, projections: dict, workers: list[int]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415
    fig = Figure(figsize=(4.4 * len(projections), 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(projections), squeeze=False)[0]
    colors = {"allreduce": "#4C72B0", "easgd": "#DD8452", "asgd": "#55A868", "gossip-pull": "#C44E52",
              "gossip-push": "#8172B3"}
    for ax, (name, proj) in zip(axes, projections.items()):
        for m, rows in proj.items():
            if m == "asgd":                        # same server cost as easgd at tau = n_sync = 1
                continue
            label = "easgd = asgd (tau 1)" if m == "easgd" else m
            ax.plot(workers, [r["efficiency"] for r in rows], "-", color=colors[m], label=label)
            ax.plot(workers, [r["sim_efficiency"] for r in rows], "o--", ms=3, color=colors[m])
        ax.set(xscale="log", xlabel="workers (GPUs)", ylabel="scaling efficiency", ylim=(0, 1.05),
               title=name)
        ax.set_xticks(workers, [str(p) for p in workers])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("solid: analytic, no stragglers; dashed: simulated with stragglers", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
