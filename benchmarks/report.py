"""Markdown tables for docs/results.md and docs/benchmarks.md from results/*.json (no
number typed by hand).

    python benchmarks/report.py [EXPERIMENT ...] [--results results]
    python benchmarks/report.py --update docs/results.md     # rewrite its generated blocks
    python benchmarks/report.py --update docs/benchmarks.md  # the CPU step tables (cpu*.json)

Prose numbers come from the JSON too: ``<!-- v:FILE:PATH[:SPEC] -->TEXT<!-- /v -->`` is rewritten
with the value at PATH (keys joined by dots, list indices as numbers; a key holding dots or
slashes in brackets: ``runs.[allreduce/p16].final_error.mean``) of ``results/FILE``, formatted
with SPEC (a format spec, optionally followed by ``*SCALE``: ``.1f*100`` shows a fraction in
percent; default ``.3g``).  The markers render as nothing, so the reader sees TEXT only.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import tables
from crossover import markdown as M

ROOT = Path(__file__).resolve().parents[1]


def f(x, spec=".2f", none="—"):
    return none if x is None else x if isinstance(x, str) else format(x, spec)


def agg(a, scale=1.0, spec=".1f"):
    if a is None or a.get("mean") is None:
        return "never"
    s = f(a["mean"] * scale, spec)
    if a.get("n", 1) > 1:
        s += f" [{f(a['min'] * scale, spec)}–{f(a['max'] * scale, spec)}]"
    if a.get("missing"):
        s += f" ({a['missing']} of {a['n'] + a['missing']} never)"
    return s


def cores(d):
    return d.get("cores") or 2


def sync(d):
    return "\n".join([
        f"{d['workers']} ranks × batch {d['batch']} (allreduce) vs 1 rank × batch "
        f"{d['workers'] * d['batch']} "
        f"({d['workers']} and 1 processes on {cores(d)} cores)", "",
        "| | value |", "|---|---|",
        f"| largest difference of validation error at the same evaluation | "
        f"{100 * d['max_abs_val_error_diff']:.2f} points |",
        f"| training loss (mean over ranks vs one rank), step 0, relative difference | "
        f"{d['loss_rel_diff_first_step']:.1e} |",
        f"| same, median over the {d['steps_compared']} steps | {d['loss_rel_diff_median']:.3f} |",
        f"| final validation error, 1 rank / allreduce | {100 * d['val_error_single'][-1]:.2f}% / "
        f"{100 * d['val_error_allreduce'][-1]:.2f}% |",
        f"| final weights, ‖w_allreduce − w_1rank‖ / ‖w_1rank‖ | {d['final_param_rel_diff']:.3f} |",
        f"| the same for allreduce with another seed (a different run) | "
        f"{d['other_seed_param_rel_diff']:.3f} |"])


def methods(d):
    rows = [f"| method | workers (ranks on {cores(d)} cores) | epochs | final error % | best error % | "
            f"seconds to {100 * d['target_error']:g}% | epochs to {100 * d['target_error']:g}% | img/s | "
            "s/step |",
            "|---|---|---|---|---|---|---|---|---|"]
    for v in d["runs"].values():
        rows.append(f"| {v['method']} | {v['workers']} ({v['ranks']}) | {v['epochs']} | "
                    f"{agg(v['final_error'], 100)} | {agg(v['best_error'], 100)} | "
                    f"{agg(v['time_to_target'])} | "
                    f"{agg(v['epochs_to_target'], 1, '.2f')} | {agg(v['images_per_second'], 1, '.0f')} | "
                    f"{f(v['step_seconds']['mean'], '.3f')} |")
    return "\n".join(rows) + (f"\n\nMean over {d['seeds']} seeds [min–max]." if d['seeds'] > 1
                              else "\n\nOne seed.")


def methods_net(d):
    """Experiment 2 on emulated nodes: the table, then per run where a step's time went and the
    least bytes any node's interface carried (the proof the traffic used the links)."""
    n = d["net"]
    head = (f"Emulated nodes, one rank each; link rate per p from the papers' ratio r = {n['ratio']:.3f} "
            f"of transfer to step time (× {n['factor']:g})." if n.get("ratio") else
            f"Emulated nodes, one rank each, every link at {n['fixed_rate'] / 1e6:g} Mbit/s.")
    rows = [f"| method | workers (nodes) | link Mbit/s | final error % | "
            f"seconds to {100 * d['target_error']:g}% | "
            f"epochs to {100 * d['target_error']:g}% | s/step | compute / comm / wait ms per step | "
            "server ms per exchange (busy) | least MB sent, received by a node |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for v in d["runs"].values():
        sp, net = v["split_per_step"], v.get("net", {})
        srv = v.get("server_service_ms") or {}
        rows.append(
            f"| {v['method']} | {v['workers']} ({v['ranks']}) | {net.get('rate_bits', 0) / 1e6:.0f} | "
            f"{agg(v['final_error'], 100)} | {agg(v['time_to_target'])} | "
            f"{agg(v['epochs_to_target'], 1, '.2f')} | "
            f"{f(v['step_seconds']['mean'], '.3f')} | {1e3 * (sp['compute'] + sp['data']):.0f} / "
            f"{1e3 * sp['comm']:.0f} / {1e3 * sp['wait']:.0f} | "
            + (f"{srv['mean']:.1f} ({100 * v['server_utilization']['mean']:.0f}%)" if srv.get("mean")
               else "—")
            + f" | {net.get('min_sent_mb', 0):.0f}, {net.get('min_received_mb', 0):.0f} |")
    return head + "\n\n" + "\n".join(rows) + (f"\n\nMean over {d['seeds']} seeds [min–max]."
                                            if d['seeds'] > 1 else "\n\nOne seed.")


def extensions(d):
    rows = ["| run | workers | final error % | seconds to target | epochs to target | s/step | "
            "wait ms per step | server ms per exchange (busy) | pushes served / rejected | staleness max |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for v in d["runs"].values():
        util = v.get("server_utilization")
        srv = (f"{v['server_service_ms']:.1f} ({100 * util:.0f}%)" if v.get("server_service_ms") else "—")
        rows.append(f"| {v['label']} | {v['workers']} | {100 * v['final_error']:.1f} | "
                    f"{f(v['time_to_target'], '.1f')} | "
                    f"{f(v['epochs_to_target'])} | {v['step_seconds']:.3f} | "
                    f"{1e3 * v['split_per_step']['wait']:.0f} | {srv} | "
                    f"{f(v.get('served'), 'd')} / {f(v.get('rejected'), 'd')} | "
                    f"{f(v.get('staleness_max'), 'd')} |")
    return "\n".join(rows) + (f"\n\nOne seed (0); asgd's bound S = {d['max_staleness']}; rows without K are "
                              "one server, rows without a graph name the uniform graph.")


def stragglers(d):
    delays = d["delays_ms"]
    rows = ["| method | " + " | ".join(f"D = {x} ms: throughput ×, time-to-target ×, final err %"
                                      for x in delays)
            + " |", "|---" * (len(delays) + 1) + "|"]
    for m, row in d["runs"].items():
        rows.append(f"| {m} | " + " | ".join(
            f"{r['slowdown_images_per_second']:.2f}, {f(r['slowdown_time_to_target'])}, "
            f"{100 * r['final_error']:.1f}"
            for r in row) + " |")
    return "\n".join(rows) + (f"\n\n{d['workers']} workers; the last worker rank sleeps U[0, D] ms after "
                              "each backward pass. ×: slow-down relative to D = 0 (higher is slower).")


def lr(d):
    rows = ["| method | " + " | ".join(f"lr {x:g}: final err %, s to target" for x in d["lrs"]) + " |",
            "|---" * (len(d["lrs"]) + 1) + "|"]
    for m, row in d["runs"].items():
        rows.append(f"| {m} | " + " | ".join(f"{100 * r['final_error']:.1f}, {f(r['time_to_target'], '.1f')}"
                                             for r in row) + " |")
    return "\n".join(rows) + (f"\n\n{d['workers']} workers, 3 epochs, target {100 * d['target_error']:g}% "
                              "error.")


def consensus(d):
    rows = [f"| variant | graph | ranks (on {cores(d)} cores) | distance after 10 exchanges | "
            "decay per exchange | exchanges to 1e-3 | drift of the mean (relative) |",
            "|---|---|---|---|---|---|---|"]
    for v in d["runs"].values():
        dist = v["distance"]
        rows.append(f"| {v['variant']} | {v.get('graph', 'uniform')} | {v['ranks']} | "
                    f"{dist[min(10, len(dist) - 1)]:.2e} | "
                    f"{v['rate_per_exchange']:.3f} | {f(v['exchanges_to_1e-3'], 'd')} | "
                    f"{v['mean_drift']:.1e} |")
    return "\n".join(rows) + f"\n\nMean over {d['repeats']} repeats; {d['rounds']} exchanges per rank."


def easgd(d):
    rows = ["| β | τ | exchanges | MB through the server | center error % | worker errors % | "
            "mean ‖x_i − center‖ | s to target |", "|---|---|---|---|---|---|---|---|"]
    for row in d["runs"].values():
        for r in row:
            rows.append(f"| {r['beta']:g} | {r['tau']} | {r['exchanges']} | "
                        f"{f(r['comm_megabytes'], '.0f')} | "
                        f"{100 * r['center_error']:.2f} | "
                        f"{', '.join(f'{100 * e:.2f}' for e in r['worker_errors'])} | "
                        f"{f(r['worker_distance'], '.3f')} | {f(r['time_to_target'], '.1f')} |")
    return "\n".join(rows) + (f"\n\n{d['workers']} workers + 1 server ({d['workers'] + 1} ranks on 2 cores), "
                              "3 epochs.")


def asgd(d):
    rows = [f"| n_sync | start | clients (ranks on {cores(d)} cores) | s to the train error target "
            "| speed-up here | minibatches to it | speed-up on k nodes | "
            "final val err % | staleness mean | exchanges |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["runs"].values():
        rows.append(f"| {r['n_sync']} | {r['start']} | {r['k']} ({r['k'] + 1}) | "
                    f"{f(r['time_to_train_target'], '.1f')} | "
                    f"{f(r['speedup'])} | {f(r['minibatches_to_train_target'], 'd')} | "
                    f"{f(r['speedup_k_nodes'])} | "
                    f"{100 * r['final_error']:.1f} | {r['staleness_mean']:.1f} | {r['exchanges']} |")
    tt = d["train_target"]
    return "\n".join(rows) + (f"\n\nTraining error targets: {100 * tt['cold']:g}% (cold), "
                              f"{100 * tt['warm']:g}% (warm). Batch {d['batch']}, lr {d['lr']:g}/k, training "
                              f"error smoothed over {d['window']} merged minibatches (all clients'); "
                              "\"speed-up on k nodes\" = k × minibatches(1 client) / minibatches(k): the "
                              "speed-up if each client ran as fast as the lone one and the server kept up; "
                              f"warm start = 1 rank trained {d['warm_epochs']} epoch (validation error "
                              f"{100 * d['warm_val_error']:.1f}%).")


def virtual(d):
    """The virtual cluster's predictions against the emulated-cluster runs (virtual_validation.py):
    seconds per epoch, comm + wait per step (with the goal: within 2x, or both under 5% of
    the step), time to target."""
    out = ["| method | p | s/epoch predicted | measured | error | comm + wait ms/step predicted | "
           "measured | ratio | goal | time to target predicted | measured | error | "
           "reached (virtual / real) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        cw = [1000 * (sp["comm"] + sp["wait"]) for sp in (r["predicted_split"], r["measured_split"])]
        ratio = r.get("comm_wait_ratio")
        goal = "—" if "comm_wait_ok" not in r else "met" if r["comm_wait_ok"] else "**missed**"
        out.append(f"| {r['method']} | {r['workers']} | {f(r['predicted_epoch_seconds'])} | "
                   f"{f(r['measured_epoch_seconds'])} | {pct(r['epoch_seconds_error'])} | "
                   f"{cw[0]:.1f} | {cw[1]:.1f} | {'—' if ratio is None else f'{ratio:.2f}'} | {goal} | "
                   f"{f(r['predicted_time_to_target'])} | {f(r['measured_time_to_target'])} | "
                   f"{pct(r['time_to_target_error'])} | {r['predicted_reached']} / {r['measured_reached']} |")
    s = d["summary"]
    cwg = s.get("comm_wait")
    out += ["", "Absolute errors, seconds per epoch: median "
            f"{pct(s['epoch_seconds']['median'], sign=False)}, "
            f"worst {pct(s['epoch_seconds']['worst'], sign=False)} ({s['epoch_seconds']['n']} settings); "
            f"time to {100 * d['target_error']:.0f}% error: median "
            f"{pct(s['time_to_target']['median'], sign=False)}, worst "
            f"{pct(s['time_to_target']['worst'], sign=False)} ({s['time_to_target']['n']} settings "
            "reached by both)."
            + (f" Comm + wait per step within the goal in {cwg['met']} of {cwg['n']} rows." if cwg else "")
            + (" Not simulated: " + "; ".join(x["run"] for x in d["skipped"])
               + f" ({d['skipped'][0]['why']})." if d["skipped"] else "")]
    return "\n".join(out)


# ----------------------------------------------------------------------------- CPU step (bench_cpu.py)
CPU_NAMES = {"resnet20": "ResNet-20 32×32 b64", "resnet18": "ResNet-18 64×64 b16",
             "proxy": "proxy: ResNet-8 ×0.5 16×16 b8"}


def _img_s(r):
    return f"{r['median_img_s']:.0f} [{r['range_img_s'][0]:.0f}–{r['range_img_s'][1]:.0f}]"


def cpu_step(results: Path) -> str:
    """scalesgd (conv_algo auto, and im2col in the same run) against PyTorch per configuration and
    thread count (cpu.json), beside the same script's run of the code before (cpu-before.json)."""
    d = json.loads((results / "cpu.json").read_text())
    before = {}
    if (results / "cpu-before.json").exists():
        for r in json.loads((results / "cpu-before.json").read_text())["results"]:
            before[(r["model"], r["threads"])] = r
    out = ["| configuration | threads | scalesgd img/s | scalesgd im2col | torch NCHW | "
           "torch channels_last | ratio (goal) | ratio im2col | before: scalesgd / torch best, ratio | "
           "other-procs CPU |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["results"]:
        b = before.get((r["model"], r["threads"]))
        bt = (f"{b['scalesgd']['median_img_s']:.0f} / {b['torch_best_median_img_s']:.0f}, {b['ratio']:.2f}"
              if b else "— (not in that run)")
        out.append(f"| {CPU_NAMES[r['model']]} | {r['threads']} | {_img_s(r['scalesgd'])} | "
                   f"{_img_s(r['scalesgd_im2col'])} | {_img_s(r['torch_nchw'])} | "
                   f"{_img_s(r['torch_channels_last'])} | **{r['ratio']:.2f}** "
                   f"({d['targets'][r['model']]}) | "
                   f"{r['ratio_scalesgd_im2col']:.2f} | {bt} | {f(r['foreign_cpu'])} |")
    met = [r for r in d["results"] if r["ratio"] >= d["targets"][r["model"]]]
    missed = [r for r in d["results"] if r not in met]

    def names(rows):
        return "; ".join(f"{CPU_NAMES[r['model']]} at {r['threads']} thread{'s' * (r['threads'] > 1)} "
                         f"({r['ratio']:.2f} vs {d['targets'][r['model']]})" for r in rows) or "none"
    out += ["", f"Goal met (median ratio ≥ goal): {names(met)}. Not met: {names(missed)}."]
    i = d["info"]
    out += ["", f"Run {i['date']}: {i['cpu_model']} ×{i['cpus']}, Python {i['python']}, NumPy {i['numpy']}, "
            f"BLAS {i['blas']}, torch {i['torch']}; {i['repeats']} interleaved blocks of {i['steps']} steps "
            f"after {i['warmup']} warm-up steps per runner; median of block medians "
            "[range of block medians]."]
    return "\n".join(out)


def cpu_profile(results: Path) -> str:
    """Where a step's time goes (cpu.json profiles): per configuration, then per conv geometry."""
    profs = json.loads((results / "cpu.json").read_text())["profiles"]
    keys = list(next(iter(profs.values()))["summary"])
    out = ["| ms per step (1 thread) | " + " | ".join(CPU_NAMES[k] for k in profs) + " |",
           "|---|" + "---|" * len(profs)]
    out.append("| whole step, profiled (unprofiled) | " + " | ".join(
        f"{p['ms_per_step']:.1f} ({p['ms_per_step_unprofiled']:.1f})" for p in profs.values()) + " |")
    for k in keys:
        out.append(f"| {k} | " + " | ".join(f"{p['summary'].get(k, 0.0):.2f}" for p in profs.values()) + " |")
    for name, p in profs.items():
        out += ["", f"{CPU_NAMES[name]}, per conv geometry (k×k/stride, input H×W, channels; fwd and bwd "
                "passes):",
                "", "| conv | calls | GEMM ms | GFLOP/s | OpenBLAS alone ms | GFLOP/s | im2col ms | "
                "col2im ms | Winograd ms | conv Python ms |", "|---|---|---|---|---|---|---|---|---|---|"]
        for c in p["convs"]:
            out.append(f"| {c['conv']} | {c['calls_per_step']:.0f} | {c['gemm_ms']:.2f} | "
                       f"{f(c['gemm_gflops'], '.0f')} | "
                       f"{c['openblas_alone_ms']:.2f} | {f(c['openblas_alone_gflops'], '.0f')} | "
                       f"{c['im2col_ms']:.2f} | {c['col2im_ms']:.2f} | {c['winograd_ms']:.2f} | "
                       f"{c['own_python_ms']:.2f} |")
    return "\n".join(out)


def cpu_end_to_end(results: Path) -> str:
    """make demo and a one-rank run, before (cpu-e2e-before.json) and after (cpu-e2e.json)."""
    runs = {tag: json.loads((results / f"cpu-e2e{tag}.json").read_text())["end_to_end"]
            for tag in ("-before", "") if (results / f"cpu-e2e{tag}.json").exists()}
    out = ["| run | before: img/s | top-1 | peak RSS MiB | after: img/s | top-1 | peak RSS MiB | speed-up |",
           "|---|---|---|---|---|---|---|---|"]
    for name, a in runs[""].items():
        b = runs.get("-before", {}).get(name)
        cells = (f"{b['images_per_second']:.0f} | {b['val_top1_accuracy']:.4f} | "
                 f"{b['peak_rss_mib_largest_process']:.0f}" if b else "— | — | —")
        out.append(f"| {name}, {a['epochs']} epochs | {cells} | {a['images_per_second']:.0f} | "
                   f"{a['val_top1_accuracy']:.4f} | {a['peak_rss_mib_largest_process']:.0f} | "
                   + (f"{a['images_per_second'] / b['images_per_second']:.2f}× |" if b else "— |"))
    return "\n".join(out)


def conv_candidates(results: Path) -> str:
    """Forward + backward ms of the shipped algorithms with auto's pick, then forward-only ms with the
    two Winograd tile sizes (conv_candidates.py); bold: the fastest in its group."""
    d = json.loads((results / "conv-candidates.json").read_text())
    fb = list(d["rows"][0]["fwd_bwd_ms"])
    order = ("im2col", "blocked", "taps", "winograd_f2", "winograd_f4")
    fw = [k for k in order if any(k in r["ms"] for r in d["rows"])]

    def cells(vals, names):
        best = min(v for v in vals.values())
        return " | ".join("—" if k not in vals else f"**{vals[k]:.2f}**" if vals[k] == best
                          else f"{vals[k]:.2f}" for k in names)
    out = ["| geometry (N, H×W, C→F) | " + " | ".join(f"{k} fwd+bwd" for k in fb) + " | auto picks | "
           + " | ".join(f"{k} fwd" for k in fw) + " |", "|---|" + "---|" * (len(fb) + 1 + len(fw))]
    for r in d["rows"]:
        out.append(f"| {r['geometry']} | {cells(r['fwd_bwd_ms'], fb)} | {r['auto']} | {cells(r['ms'], fw)} |")
    out.append("| max error / max output (vs float64), forward | " + " | ".join("" for _ in fb) + " | | "
               + " | ".join(f"{max(r['max_rel_error'].get(k, 0.0) for r in d['rows']):.1e}" for k in fw)
               + " |")
    return "\n".join(out)


def buckets(results: Path) -> str:
    """The all-reduce's bucket settings on emulated nodes (buckets.json, benchmarks/buckets.py)."""
    d = json.loads((results / "buckets.json").read_text())
    return (f"{d['nodes']} emulated nodes, 1 rank each; median of {d['rounds']} interleaved rounds of "
            f"{d['steps']} steps\n\n" + tables.buckets(d["results"]))


def survival(results: Path) -> str:
    """A lost rank survived, per method (survival.json, benchmarks/survival.py)."""
    d = json.loads((results / "survival.json").read_text())
    text = (f"{d['what']}; {d['epochs']} epochs, {d['seeds']} seeds; the killed runs end with one worker "
            f"fewer (a server method: 2 workers)\n\n" + tables.survival(d))
    if d.get("across_nodes"):
        text += ("\n\n3 emulated nodes of 2 ranks (1 Gbit/s, TCP), the digits, 1 epoch; the "
                 "ranks of node 2 SIGKILLed at step 5, or everything on node 2 killed after the first "
                 "checkpoint:\n\n" + tables.survival_nodes(d))
    return text


def mpi_progress(results: Path) -> str:
    """Gossip across emulated nodes per --mpi-progress setting, MPICH then Open MPI
    (mpi_progress.json, mpi_progress_openmpi.json: benchmarks/rma_progress.py --train)."""
    parts = []
    for name in ("mpi_progress.json", "mpi_progress_openmpi.json"):
        d = json.loads((results / name).read_text())
        ref = (f"; the one-node reference runs the same {d['nodes']} ranks on one node with the "
               "default setting" if d.get("one_node") else "; no one-node reference")
        parts.append(f"**{d.get('library', 'MPI library not recorded')}**: {d['nodes']} emulated nodes, "
                     f"1 rank each, at {d['rate']} "
                     f"({d['cpus_per_node']} CPU per node); `{d['train_args']}`; seconds per step, mean "
                     f"over the ranks{ref}\n\n" + tables.mpi_progress(d))
    return "\n\n".join(parts)


def hierarchy(results: Path) -> str:
    """Flat against --hierarchy node on emulated nodes (hierarchy.json, benchmarks/hierarchy.py)."""
    d = json.loads((results / "hierarchy.json").read_text())
    return (f"{d['nodes']} emulated nodes × {d['ranks_per_node']} ranks at {d['rate']} (one CPU per node), "
            f"`{d['job']}`, {d['epochs']} epochs, target {100 * d['target_error']:.0f}% validation error\n\n"
            + tables.hierarchy(d))


def fair_study(results: Path) -> tuple[dict, bool]:
    """The fair crossover study's analysis (benchmarks/crossover/report.py): crossover.json once
    complete, else crossover-progress.json; and whether it is final."""
    final = results / "crossover.json"
    if final.exists():
        return json.loads(final.read_text()), True
    return json.loads((results / "crossover-progress.json").read_text()), False


def crossover_map(results: Path) -> str:
    """The fastest method (or the tied set) by p and condition, per network, with each
    condition's crossover bracket and its bootstrap shares (crossover/markdown.py: map_markdown)."""
    d, final = fair_study(results)
    left = d["left"]
    state = "The study is complete" if final else "**Provisional** (the study is still running)"
    more = "" if final else (f"; {left['ready']} more runs can start now, and the tuning still to come "
                             "decides the rest; a p without runs reads "
                             "\"not run yet\", one whose runs are not all in \"so far\", and the crossovers "
                             "use the complete cells")
    return (f"{state}: {d['runs']} runs, {d['machine_hours_total']:.1f} machine-hours (one core per run) "
            f"at commit {', '.join(c[:12] for c in d['commits'])}{more}.\n\n" + M.map_markdown(d))


def crossover_answer(results: Path) -> str:
    """The map in one paragraph (crossover/markdown.py: answer_markdown)."""
    d, final = fair_study(results)
    return M.answer_markdown(d, final)


def crossover_claims(results: Path) -> str:
    """The papers' claims judged on the fair study by benchmarks/crossover/claims.py's rules."""
    return M.claims_markdown(fair_study(results)[0])


def crossover_tuning(results: Path) -> str:
    """Per method and p: the grid points tried (tuning runs) and the configuration chosen by time
    to target under each network."""
    d, _ = fair_study(results)
    ps = [p for p in d["workers"] if p > 1]
    methods = list(dict.fromkeys(k.split("/")[0] for k in d["tuning"] if not k.startswith("single")))
    rows = ["| method | " + " | ".join(f"p = {p}" for p in ps) + " |", "|---|" + "---|" * len(ps)]
    for m in methods:
        cells = []
        for p in ps:
            t = d["tuning"][f"{m}/p{p}"]
            done = sum(c["done"] for c in t["configs"].values())
            if not done:
                cells.append("—")
                continue
            by: dict = {}
            for n, c in t["chosen"].items():
                c = c or t.get("chosen_so_far", {}).get(n) or "pending"
                by.setdefault(c, []).append(n.split("-")[0])
            chosen = "; ".join(f"{c} ({', '.join(ns)})" if len(by) > 1 else c for c, ns in by.items())
            edge = (f" (on an edge of its rates: {', '.join(n.split('-')[0] for n in t['edge'])})"
                    if t.get("edge") else "")
            cells.append(f"{len(t['configs'])} points, {done} run{'' if done == 1 else 's'}: {chosen}{edge}"
                         + (" (so far)" if done < t["runs"] or None in t["chosen"].values() else ""))
        rows.append(f"| {M.SHORT.get(m, m)} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n\n" + M.tuning_counts_words(d)


def crossover_cells(results: Path) -> str:
    """Every method's time to target in every cell, per network: method by p, each cell its mean
    seconds under none / typical / stragglers (bold: the cell's fastest), or, where it missed the
    target in a seed, the seeds that reached it and the mean error the seeds that missed ended at
    ("cap" where each of those was stopped at the cap, not run to its horizon)."""
    d, _ = fair_study(results)
    ps = [p for p in d["workers"] if p > 1]
    out = []

    def one(cl: dict | None, m: str) -> str:
        r = cl and cl["methods"].get(m)
        if not r:
            return "·"
        if r["reached_all"]:
            t = M.secs(r["mean_seconds"])
            return f"**{t}**" if cl["fastest"] == m else t
        missed = [v["final_error"] for v in r["seeds"].values() if v["seconds"] is None]
        if not missed:                       # (every seed run so far reached it; seeds to come)
            t = M.secs(sum(v["seconds"] for v in r["seeds"].values()) / len(r["seeds"]))
            return f"{t} (so far: {len(r['seeds'])} of {len(M.X.SEEDS)} seeds)"
        cap = ", cap" if M.X.stops(r) == "cap" else ""
        return f"{len(r['seeds']) - len(missed)}/{len(r['seeds'])} ({sum(missed) / len(missed):.0%}{cap})"
    for n in d["networks"]:
        methods = list(dict.fromkeys(m for k, cl in d["cells"].items() if k.startswith(n + "/")
                                     for m in cl["methods"] if m != "single"))
        out += [f"**{n}**", "", "| method | " + " | ".join(f"p = {p}" for p in ps) + " |",
                "|---|" + "---|" * len(ps)]
        for m in methods:
            out.append(f"| {M.SHORT.get(m, m)} | " + " | ".join(
                " / ".join(one(d["cells"].get(f"{n}/{c}/p{p}"), m) for c in d["conditions"])
                for p in ps) + " |")
        out.append("")
    return "\n".join(out).rstrip()


def cells_word(n: int) -> str:
    return f"{n} cell{'s' * (n != 1)}"


def crossover_localsgd(results: Path) -> str:
    """Local SGD's cells re-timed with the code whose workers wait for each other only at an
    average (crossover-localsgd.json, from a one-off re-timing): per network and condition its mean
    seconds by p, the change against the study's records, the cells whose calls change, and the
    check that the same clock-only runs with the code before the fix give the recorded seconds."""
    f = results / "crossover-localsgd.json"
    if not f.exists():
        return "Not measured: no crossover-localsgd.json."
    d = json.loads(f.read_text())
    study, _ = fair_study(results)
    cells = d["cells"]
    done = {k: c for k, c in cells.items() if "after" in c}
    want = [k for k, c in study["cells"].items() if c["methods"].get("localsgd", {}).get("seeds")]
    ps = sorted({int(k.rsplit("/p", 1)[1]) for k in want})
    codes = sorted({c["retimed_code"][:7] for c in done.values()})
    out = [f"Re-timed with the code of {', '.join(codes) or '-'} (the study's runs: "
           f"{', '.join(c[:7] for c in d['study_commits'])}): {len(done)} of {len(want)} cells with local SGD"
           f"{'' if len(done) == len(want) else ' so far'}. Local SGD's mean seconds to target, re-timed, "
           "and the change against the study's records:", "",
           "| network | condition | " + " | ".join(f"p = {p}" for p in ps) + " |",
           "|---|---|" + "---|" * len(ps)]
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    for n in study["networks"]:
        for c in study["conditions"]:
            row = []
            for p in ps:
                x = cells.get(f"{n}/{c}/p{p}", {})
                rec, new = x.get("recorded", {}), x.get("retimed", {})
                both = [s for s in new if new[s] is not None and rec.get(s) is not None]
                if not both or len(both) < len(rec):
                    row.append("·" if not new else "missed")
                    continue
                a, b = mean([rec[s] for s in both]), mean([new[s] for s in both])
                row.append(f"{M.secs(b)} ({(b - a) / a:+.1%})")
            out.append(f"| {n} | {c} | " + " | ".join(row) + " |")
    changed = []
    for k, c in done.items():
        b, a = c["before"], c["after"]
        what = []
        if a["fastest"] != b["fastest"]:
            what.append(f"fastest {M.SHORT.get(b['fastest'], b['fastest'])} -> "
                        f"{M.SHORT.get(a['fastest'], a['fastest'])}")
        if set(a["tied_set"]) != set(b["tied_set"]):
            what.append("tied set {" + ", ".join(M.SHORT.get(m, m) for m in b["tied_set"]) + "} -> {"
                        + ", ".join(M.SHORT.get(m, m) for m in a["tied_set"]) + "}")
        if (b["family"] or {}).get("first") != (a["family"] or {}).get("first"):
            what.append(f"families first: {(b['family'] or {}).get('first')} -> "
                        f"{(a['family'] or {}).get('first')}")
        if what:
            changed.append(f"{k}: " + "; ".join(what))
    verb = "changes" if len(done) == 1 else "change"
    out += ["", ("With the study's paired rule applied again (the other methods' times as recorded, local "
                 "SGD's settings as tuned), "
                 + (f"{len(changed)} of {cells_word(len(done))} {verb}: " + " · ".join(sorted(changed))
                    if changed else "no cell's fastest method, tied set or family call changes "
                    f"({cells_word(len(done))})") + ".")]
    checked = {k: c for k, c in cells.items() if "check" in c}
    if checked:
        pairs = [(v, c["recorded"][s]) for c in checked.values() for s, v in c["check"].items()]
        before = ", ".join(sorted({c["check_code"][:7] for c in checked.values()}))
        out.append(f"The check: with the code before the fix ({before}), {sum(v == r for v, r in pairs)} of "
                   f"{len(pairs)} seeds' clock-only runs ({cells_word(len(checked))}) give the study's "
                   "recorded seconds bit for bit.")
    return "\n".join(out)


def crossover_noise(results: Path) -> str:
    """The gradient noise scale fitted to the tuned all-reduce's steps to target, and what p of this
    task stands for in ImageNet GPUs under the stated assumption (crossover/report.py: noise_scale,
    workload)."""
    d, _ = fair_study(results)
    ns, w = d["noise_scale"], d["workload"]
    pts = ", ".join(f"B = {x['batch']}: {x['steps']:.0f}" for x in ns["data"])
    if ns["points"] < 3:
        return (f"Not fitted yet: the fit needs steps to target at 3 or more global batches, the study has "
                f"{ns['points']} ({pts or 'none'} steps).")
    gpus = ", ".join(f"p = {p}: {g:.2g}" if g < 10 else f"p = {p}: {g:,.0f}"
                     for p, g in (w.get("imagenet_gpus") or {}).items())
    if ns.get("b_noise"):
        hi = f"{ns['b_noise_hi']:.0f}" if ns.get("b_noise_hi") else "∞"
        lo = f"{ns['b_noise_lo']:.0f}" if ns.get("b_noise_lo") else "—"
        misfit = (f", which counts the seeds' variation only, not the fit's misses of single batches, up to "
                  f"{ns['misfit']:.0%}" if ns.get("misfit") else "")
        fitted = (f"Fitted B_crit ≈ {ns['b_noise']:.0f} (McCandlish et al.'s critical batch E_min / S_min, "
                  f"the noise scale as the whole run averages it; 95% bootstrap interval {lo}–{hi}{misfit}), "
                  f"S_min ≈ {ns['s_min']:.0f} steps.")
    elif ns.get("b_noise_fit"):
        lo = f"{ns['b_noise_lo']:.0f}" if ns.get("b_noise_lo") else "—"
        fitted = (f"B_noise is **not resolved**: the point fit gives {ns['b_noise_fit']:.0f}, but "
                  f"{ns['unresolved_share']:.0%} of the bootstrap resamples find no noise scale at all "
                  "(steps falling as fast as 1/B or faster), so its 95% interval is "
                  f"{lo}–∞ and only the lower bound, {lo}, is read below.")
    else:
        lo = f"{ns['b_noise_lo']:.0f}" if ns.get("b_noise_lo") else None
        fitted = ("B_noise is **not resolved**: steps to target fall as fast as 1/B or faster over every "
                  f"batch measured (no positive S_min fits; {ns.get('unresolved_share', 1):.0%} of the "
                  "bootstrap resamples neither): the data are consistent with every batch measured "
                  "lying below the noise scale"
                  + (f"; its lower bound (2.5th percentile of the resamples) is {lo}." if lo else
                     ", so p here reads only as ImageNet below its noise scale (taking ImageNet's B_noise "
                     f"as {w['assumed_imagenet_b_noise']:,}, an assumption: fewer than "
                     f"{w['assumed_imagenet_b_noise'] // w['imagenet_batch_per_gpu']} GPUs at "
                     f"{w['imagenet_batch_per_gpu']} images each)."))
    if ns.get("so_far"):
        fitted += (f" (So far: the search at p = {', '.join(map(str, ns['so_far']))} is still open, and its "
                   "choice so far stands in.)")
    m, ps = ns.get("measured"), sorted(int(p) for p in d["workers"])
    if m:
        seeds = m["seeds"]
        near, width = m.get("near"), max(e["hi"] - e["lo"] for e in seeds)
        moves = ("" if not near or near["checkpoints"] < 2 else
                 f"over the {near['checkpoints']} checkpoints within 0.05 of the target's error "
                 f"({near['errors'][0]:.2f}–{near['errors'][1]:.2f}) it moves between {near['low']:.0f} and "
                 f"{near['high']:.0f}, " + ("more than those intervals: the weights' own variation dominates"
                                            if near["high"] - near["low"] > width
                                            else "within those intervals")
                 + (f" ({near['unresolved']} more not resolved)" if near.get("unresolved") else ""))
        equal = all((e.get("same_as_study_run") or {}).get("equal") for e in seeds)
        runs = (f"seed {seeds[0]['seed']}" if len(seeds) == 1 else
                "seeds " + ", ".join(str(e["seed"]) for e in seeds[:-1]) + f" and {seeds[-1]['seed']}")
        one = [f"{e['b_simple']:.0f} ({e['lo']:.0f}–{e['hi']:.0f})" for e in seeds]
        how = ("interpolated between the checkpoints around the target, with a 95% jackknife interval over "
               "the gradients at each")
        if len(seeds) == 1:
            value = (f"**B_simple ≈ {m['b_simple']:.0f}** at the target ({m['lo']:.0f}–{m['hi']:.0f}: "
                     f"both {how})"
                     + (f"; {moves}" if moves else ""))
        else:
            spread = max(e["b_simple"] for e in seeds) - min(e["b_simple"] for e in seeds)
            value = (f"**B_simple ≈ {m['b_simple']:.0f}** at the target, the mean of {', '.join(one[:-1])} "
                     f"and {one[-1]} over the seeds (each {how}): the seed moves it "
                     + ("more than those intervals" if spread > width else "within those intervals")
                     + (f"; in seed {m['seed']}'s run, {moves}" if moves else ""))
        spans = (f"8p / B_simple = {8 * ps[0] / m['b_simple']:.2g} (p = {ps[0]}) to "
                 f"{8 * ps[-1] / m['b_simple']:.2g}")
        if ns.get("b_noise"):
            spans += (f", 8p / B_crit = {8 * ps[0] / ns['b_noise']:.2g} to {8 * ps[-1] / ns['b_noise']:.2g}")
        fitted += (" Measured directly (`benchmarks/noise_scale.py`: B_simple = tr(Σ) / |G|², McCandlish "
                   f"et al.'s appendix A, from {m['gradients']:,} gradients of {m['batch']} training images "
                   f"at each checkpoint of the study's own one-worker run, {m['config']}, {runs}"
                   + (f", whose validations equal the study's record{'' if len(seeds) == 1 else 's'}"
                      if equal else "")
                   + f"): {value}; along the whole run"
                   + ("" if len(seeds) == 1 else f" of seed {m['seed']}")
                   + f" it ranges over {m['along'][0]:.0f}–{m['along'][1]:.0f}"
                   + (f" ({m['unresolved']} checkpoints not resolved)" if m.get("unresolved") else "")
                   + f". The study's global batches span {spans} (p = {ps[-1]}).")
        if ns.get("b_noise"):
            r = ns["b_noise"] / m["b_simple"]
            apart = ns["b_noise_lo"] > max(e["hi"] for e in seeds) \
                or ns["b_noise_hi"] < min(e["lo"] for e in seeds)
            fitted += (f" The two differ by {max(r, 1 / r):.1f}×"
                       + (", more than their intervals allow" if apart else ", within their intervals")
                       + ("; they are not the same quantity: B_crit is a property of the whole run (along "
                          "which B_simple ranges as above), and B_simple leaves out the curvature that "
                          "B_noise = tr(HΣ) / GᵀHG weighs in." if apart else "."))
    if not gpus:
        return f"Steps to target (mean over seeds) by global batch: {pts}. {fitted}"
    bound = "at most " if w.get("bound") else ""
    src = (" (from the lower bound of B_noise)" if w.get("bound") else
           " (from the measured B_simple, taken as B_noise: an assumption too)"
           if w.get("source") == "measured" else
           " (from the fitted B_crit, taken as B_noise)")
    return (f"Steps to target (mean over seeds) by global batch: {pts}. {fitted} "
            f"With ImageNet's B_noise taken as {w['assumed_imagenet_b_noise']:,} (an assumption) and "
            f"{w['imagenet_batch_per_gpu']} images per GPU, p workers here train at the global batch to "
            f"noise scale ratio (8p / B_noise) of {bound}{w['factor']:.2g} p ImageNet GPUs{src}: {gpus}.")


VIEWS = {"crossover-answer": crossover_answer, "crossover-map": crossover_map,
         "crossover-claims": crossover_claims,
         "crossover-tuning": crossover_tuning, "crossover-noise": crossover_noise,
         "crossover-cells": crossover_cells, "crossover-localsgd": crossover_localsgd,
         "cpu-step": cpu_step, "cpu-profile": cpu_profile, "cpu-e2e": cpu_end_to_end,
         "conv-candidates": conv_candidates, "buckets": buckets, "survival": survival,
         "mpi-progress": mpi_progress,
         "hierarchy": hierarchy}   # blocks drawn from several files or parts of one


def pct(x, sign=True):
    return "—" if x is None else f"{100 * x:+.0f}%" if sign else f"{100 * x:.0f}%"


def anchors(d):
    """Published clusters against the virtual cluster's predictions (anchors.py): seconds per
    iteration, the ratio and the goal, and the compute a step would need for the prediction to
    match (published minus the predicted communication and waiting) beside the profile's."""
    out = ["| row | source | network | method | GPUs | published ms/it | predicted ms/it (compute + comm "
           "+ wait) | ratio | within 25% | compute it implies, ms (profile's) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        sp = r["split_per_step"]
        implied = 1000 * r["implied_compute"]
        goal = "not comparable" if r["goal_met"] is None else "met" if r["goal_met"] else "**missed**"
        out.append(f"| {r['key']} | {r['source']} | {r['network']} | {r['method']} | {r['gpus']} | "
                   f"{1000 * r['published']:.0f} | {1000 * r['predicted']:.0f} ({1000 * sp['compute']:.0f} + "
                   f"{1000 * sp['comm']:.0f} + {1000 * sp['wait']:.0f}) | {r['ratio']:.2f} | {goal} | "
                   f"{implied:.0f} ({1000 * sp['compute']:.0f}) |")
    comp = [r for r in d["rows"] if r["goal_met"] is not None]
    out += ["", f"{sum(r['goal_met'] for r in comp)} of {len(comp)} comparable rows within "
            f"{100 * d['goal']:.0f}% of the published figure; {d['steps']} clock-only steps a row "
            f"(commit {d['commit']})."]
    if d.get("differences"):
        out += ["", "All-reduce's time less each method's, same table and cluster (the GPU's step cancels):",
                "", "| row | against | published, ms/it | predicted, ms/it | predicted - published |",
                "|---|---|---|---|---|"]
        for x in d["differences"]:
            out.append(f"| {x['key']} | {x['against']} | {1000 * x['published']:.0f} | "
                       f"{1000 * x['predicted']:.0f} | {1000 * (x['predicted'] - x['published']):+.0f} |")
    acc = d.get("accuracy") or []
    if acc:
        delta = 100 * d.get("delta", 0.01)
        out += ["", f"Accuracy after a fixed budget: the published difference in top-1 error against the "
                f"proxy's for the same pair (final_study.py's runs; full schedules of E epochs), and the "
                f"verdict: within {delta:.0f} point of the reference (the quality), and so first to it.", "",
                "| row | source | method | against | published: points, verdict | proxy: points at E = 8 / "
                "16 / 32 | proxy's verdict (longest E) | same verdict |", "|---|---|---|---|---|---|---|---|"]
        for r in acc:
            pub = (f"{100 * r['published_gap']:+.2f}, " + ("reaches the quality" if r["published_reaches"]
                                                           else "misses it")
                   + (", first" if r["published_first"] else ""))
            if r["proxy_gaps"] is None:
                prox, verdict, same = "—", r["proxy_said"], "—"
            else:
                gaps = r["proxy_gaps"]
                prox = " / ".join("—" if gaps.get(e) is None else f"{100 * gaps[e]:+.2f}"
                                  for e in ("8", "16", "32"))
                verdict = (f"E = {r['proxy_budget']}: " + ("reaches" if r["proxy_reaches"] else "misses")
                           + f" ({100 * r['miss_points']:+.2f} points from the published)")
                same = "yes" if r["agrees"] else "**no**"
            out.append(f"| {r['key']} | {r['source']} | {r['method']} | {r['reference']} | {pub} | {prox} | "
                       f"{verdict} | {same} |")
    return "\n".join(out)


def final_study(d):
    """Time to final quality (final_study.py): each budget's mean final error (per seed) for one
    worker and all-reduce, the plateau measured and fitted; the pilot's table at the study's E and
    its verdict there and at the check budgets (twice and half E)."""
    budgets = sorted({int(e) for v in d["epochs"].values() for e in v})
    out = ["| method | p | " + " | ".join(f"E = {e}" for e in budgets) + " | plateau | fit: asymptote, "
           "plateau |", "|---|---|" + "---|" * (len(budgets) + 2)]
    for m, per in d["epochs"].items():
        cells = []
        for e in budgets:
            v = per.get(str(e))
            cells.append("—" if v is None else f"{100 * v['mean']:.2f}% ("
                         + ", ".join(f"{100 * x:.2f}" for x in v["seeds"]) + ")")
        plateau, ft, fr = d["plateau"][m], (d.get("fit") or {}).get(m), (d.get("fit_range") or {}).get(m)
        fitted = "—" if ft is None else f"{100 * ft['asymptote']:.1f}%, E = {ft['plateau']}"
        if fr is not None:
            fitted += (f" (seed resamples: {100 * fr['asymptote'][0]:.1f}–{100 * fr['asymptote'][1]:.1f}%, "
                       f"E = {fr['plateau'][0]:.0f}–{fr['plateau'][1]:.0f})")
        out.append(f"| {m} | {d['methods'][m]['workers']} | " + " | ".join(cells)
                   + f" | {'not reached' if plateau is None else plateau} | {fitted} |")
    hours = f"{d['runs']} runs, {d['machine_hours']:.2f} machine-hours"
    out += ["", f"Final top-1 error on the tune split after a full schedule of E epochs (mean; each seed); "
            f"the fit: a + b E^-c, its asymptote a and where the plateau rule would stop, and their 5th-95th "
            f"percentiles over every bootstrap resample of the seeds; the study's "
            f"E = {d['E']}, checked at {d['check_E']}" + (f" and {d['short_E']}" if d.get("short_E") else "")
            + f"; {hours} (commit {d['commit'][:7]})."]
    pilot = d.get("pilot")
    if pilot and pilot.get("table"):
        f = pilot["fstar"]
        out += ["", f"Pilot at p = {pilot['workers']}, {pilot['network']} / {pilot['condition']}, "
                f"E = {d['E']}: "
                f"F* = {'not yet' if f is None else f'{100 * f:.2f}%'} (all-reduce's best final error); "
                f"time to quality: to F* + {100 * d['delta']:.0f} point(s), simulated seconds.", "",
                "| method | peak rule | final error % (each seed) | s to quality (each seed) | s to quality "
                "(mean curve) | s to 40% | chosen |",
                "|---|---|---|---|---|---|---|"]

        def fmt(xs, k=0):
            return ", ".join("—" if x is None else f"{x:.{k}f}" for x in xs)
        for m, v in pilot["table"].items():
            for r, row in v["rates"].items():
                mark = "yes" if float(r) == v["chosen"] else ""
                out.append(f"| {m} | L{r} | {fmt([100 * x for x in row['final_error']], 2)} | "
                           f"{fmt(row['to_quality'])} | {fmt([row.get('mean_to_quality')])} | "
                           f"{fmt(row['to_target'])} | {mark} |")
        ck = pilot.get("check") or {}
        rows = [ck.get("short"), ck.get("budget"), ck.get("check")]
        if any(rows):
            out += ["", "The verdict at the chosen rates, at E and at the checks (the seeds' mean curves):",
                    "",
                    "| E | F* | method | rate | final error | s to quality | s to 40% | faster to quality "
                    "| push-sum's time / all-reduce's |", "|---|---|---|---|---|---|---|---|---|"]
            for v in rows:
                if v is None:
                    continue
                ratio = "—" if v["time_ratio"] is None else f"{v['time_ratio']:.2f}"
                for m, x in v["methods"].items():
                    t = "—" if x["to_quality"] is None else f"{x['to_quality']:.0f}"
                    t40 = "—" if x["to_target"] is None else f"{x['to_target']:.0f}"
                    out.append(f"| {v['epochs']} | {100 * v['fstar']:.2f}% | {m} | L{x['rate']:g} | "
                               f"{100 * x['final_error']:.2f}% | {t} | {t40} | {v['faster'] or 'neither'} "
                               f"| {ratio} |")
            for v in rows:
                if v is not None and v["time_ratio"] is None and v["end_ratio"] is not None:
                    x = 1 / v["end_ratio"]
                    out += ["", f"At E = {v['epochs']} push-sum misses the quality; its whole schedule takes "
                            f"{v['end_ratio']:.2f}x the time all-reduce takes to push-sum's final error ("
                            + (f"{x:.2f}x faster" if x >= 1 else f"{1 / x:.2f}x slower")
                            + f"), and it ends {100 * v['error_gap']:+.2f} points from all-reduce's final "
                            "error."]
            for h, e in ((ck.get("holds"), d["check_E"]), (ck.get("holds_short"), d.get("short_E"))):
                if h is not None:
                    out += ["", f"The verdict at E = {d['E']} {'holds' if h else '**does not hold**'} "
                            f"at E = {e}."]
    return "\n".join(out)


def final_map(d):
    """The map by time to final quality (final_map.py): per network and condition, the family call
    at each p (and p in noise-scale units); then every cell's methods."""
    cells = d.get("cells") or []
    if not cells:
        return (f"No cell has all its reported runs yet: {d['runs']} runs, {d['machine_hours']:.2f} "
                f"machine-hours (E = {d['E']}, commit {(d['commit'] or 'unpinned')[:7]}).")
    ps = sorted({c["p"] for c in cells})
    out = ["| network | condition | "
           + " | ".join(f"p = {p} ({8 * p / d['b_noise']:.2f} B_noise)" for p in ps) + " |",
           "|---|---|" + "---|" * len(ps)]

    def said(c):
        k = c["call"]
        if k["outcome"] == "not run":      # (typical: push-sum ran under none and stragglers only)
            return f"{c.get('sync_pick', '?')} first of the synchronous (no push-sum here)"
        if k["outcome"] == "neither":
            return k["outcome"]
        ps_ = c["methods"].get("pushsum-ov", {})
        word = {"sync": "**sync**", "async": "**async**", "tie": "tie"}[k["outcome"]]
        if ps_.get("to_quality") is None:
            end = ps_.get("end_ratio")
            return word + (f"; push-sum misses ({100 * ps_['error_gap']:+.1f} pts" +
                           (f", its end {end:.2f}×)" if end else ")"))
        return word + f" ({ps_['to_quality'] / c['methods'][c['sync_pick']]['to_quality']:.2f}×)"
    rows = {}
    for c in cells:
        rows.setdefault((c["network"], c["condition"]), {})[c["p"]] = said(c)
    for (n, cond), got in rows.items():
        out.append(f"| {n} | {cond} | " + " | ".join(got.get(p, "—") for p in ps) + " |")
    out += ["", f"The family first to within {100 * d['delta']:.0f} point of the best synchronous final "
            f"error (F*) after E = {d['E']} epochs, by its seeds' mean curve; the call's 95% interval over "
            f"{len(d['seeds'])} paired seeds, F* and each family's pick redone in every resample; "
            "(×): push-sum's time to quality over the synchronous pick's. B_noise: the task's noise "
            f"scale at the early target ({d['b_noise']:.0f} images). {d['runs']} runs, "
            f"{d['machine_hours']:.2f} machine-hours (commit {(d['commit'] or 'unpinned')[:7]}).", "",
            "| network | condition | p | F* | method (configuration) | final error % (mean) | s to quality "
            "| s to 40% | s to its end | call [interval] |", "|---|---|---|---|---|---|---|---|---|---|"]
    def word(outcome):                     # no family call without push-sum in the cell
        return "— (no push-sum)" if outcome == "not run" else outcome
    for c in cells:
        k = c["call"]
        iv = call_interval(k)
        for m, v in c["methods"].items():
            out.append(f"| {c['network']} | {c['condition']} | {c['p']} | {100 * c['fstar']:.2f}% | {m} "
                       f"({v['config']}) | {100 * v['final_error']:.2f} | {f(v['to_quality'], '.0f')} | "
                       f"{f(v['to_target'], '.0f')} | {v['end']:.0f} | {word(k['outcome'])}{iv} |")
    return "\n".join(out)


def call_interval(k: dict) -> str:
    """The family call's interval (synchronous - asynchronous seconds to quality), in words where
    push-sum misses the quality: in every resample the difference is -inf, in some the lower end."""
    if "lo" not in k:
        return ""
    share = k.get("async_misses") or 0.0
    if share == 1.0:
        return " (push-sum misses it in every resample)"
    ends = [("−∞" if x == "-inf" else "+∞" if x == "inf" else format(x, "+.3g")) for x in (k["lo"], k["hi"])]
    return f" [{ends[0]}, {ends[1]}]" + (f"; push-sum misses it in {100 * share:.0f}% of resamples" if share
                                        else "")


def rejudge(d):
    """P1 and P3 judged again with no cap and A-SGD's rate searched per n_sync (rejudge.py)."""
    out = ["| claim | network | condition | evidence | verdict |", "|---|---|---|---|---|"]
    for r in d["rows"]:
        out.append(f"| {r['claim']} | {r.get('network', '—')} | {r.get('condition', '—')} | "
                   f"{r.get('evidence', '—')} | **{r['verdict']}** |")
    out += ["", "A-SGD's searches (configuration: mean seconds or samples to 40%, mean final error; "
            "— while a seed is still to run; ∞: a seed missed the target):", ""]
    for name, t in d["tuning"].items():
        cfgs = ", ".join(f"{c} ({'—' if v is None else ('∞' if v[0] is None else f'{v[0]:.4g}')}"
                         + ("" if v is None else f", {100 * v[1]:.1f}%") + ")"
                         for c, v in t["configs"].items())
        out.append(f"- {name}: {cfgs}; " + (f"chosen **{t['chosen']}**" if t["over"] else "open"))
    out += ["", f"{d['runs']} runs, {d['machine_hours']:.2f} machine-hours (commit "
            f"{(d['commit'] or 'unpinned')[:7]}){'' if d['complete'] else '; in progress'}."]
    return "\n".join(out)


TABLES = {"sync": sync, "methods": methods, "stragglers": stragglers, "lr": lr, "consensus": consensus,
          "easgd": easgd, "asgd": asgd, "extensions": extensions, "virtual": virtual, "anchors": anchors,
          "final": final_study,          # results/final-study.json
          "final-map": final_map, "rejudge": rejudge}
NET_TABLES = {"methods": methods_net}          # a sweep on emulated nodes (--net): with the time split


def update(doc: Path, results: Path) -> list[str]:
    """Rewrites every block ``<!-- begin:NAME -->`` .. ``<!-- end:NAME -->`` of ``doc`` with the
    table of ``results/NAME.json`` (NAME = an experiment, or a view); returns the names updated."""
    text, done = doc.read_text(), []

    def repl(m):
        name = m.group(1)
        if name in VIEWS:
            done.append(name)
            return f"<!-- begin:{name} -->\n{VIEWS[name](results)}\n<!-- end:{name} -->"
        p = results / f"{name}.json"
        if not p.exists():
            return m.group(0)
        done.append(name)
        base = name if name in TABLES else name.split("-")[0]    # methods-textures: a rerun of methods
        data = json.loads(p.read_text())
        fn = NET_TABLES.get(base, TABLES[base]) if data.get("net") else TABLES[base]
        return f"<!-- begin:{name} -->\n{fn(data)}\n<!-- end:{name} -->"
    new = re.sub(r"<!-- begin:([\w-]+) -->.*?<!-- end:\1 -->", repl, text, flags=re.S)
    cache: dict = {}

    def value(m):
        name, path, spec = m.group(1), m.group(2), m.group(3) or ".3g"
        if name not in cache:
            cache[name] = json.loads((results / name).read_text())
        v = lookup(cache[name], path)
        spec, _, scale = spec.partition("*")
        scale = scale or "1"
        done.append(f"{name}:{path}")
        shown = "—" if v is None else format(v * float(scale), spec) if isinstance(v, (int, float)) \
            and not isinstance(v, bool) else str(v)
        return f"<!-- v:{name}:{path}{':' + m.group(3) if m.group(3) else ''} -->{shown}<!-- /v -->"
    new = VALUE.sub(value, new)
    doc.write_text(new)
    return done


VALUE = re.compile(r"<!-- v:([\w.-]+\.json):((?:\[[^\]]+\]|[\w-])+(?:\.(?:\[[^\]]+\]|[\w-]+))*)"
                                 r"(?::([^ ]+))? -->.*?<!-- /v -->", re.S)


def lookup(doc, path: str):
    """The value at ``path`` (dotted keys, ``[key with dots or slashes]``, list indices) of ``doc``;
    a missing key is an error naming it."""
    cur = doc
    for part in re.findall(r"\[([^\]]+)\]|([^.\[\]]+)", path):
        key = part[0] or part[1]
        if isinstance(cur, list):
            cur = cur[int(key)]
        elif isinstance(cur, dict) and key in cur:
            cur = cur[key]
        else:
            raise KeyError(f"{path}: no {key!r} "
                           f"(have {', '.join(map(str, cur)) if isinstance(cur, dict) else cur})")
    return cur


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("experiments", nargs="*", default=list(TABLES))
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--update", type=Path, default=None,
                    help="rewrite the <!-- begin:NAME --> blocks of this markdown file (docs/results.md)")
    a = ap.parse_args()
    if a.update:
        print("updated:", ", ".join(update(a.update, a.results)))
        return 0
    for name in a.experiments:
        p = a.results / f"{name}.json"
        if p.exists():
            print(f"### {name}\n\n{TABLES[name](json.loads(p.read_text()))}\n")
        else:
            print(f"### {name}\n\n(no {p})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
