"""Markdown tables of the measured results, one function a result file: what a benchmark prints
when it finishes and what ``report.py`` writes into the docs are the same table.  JSON in, text
out; nothing here measures, launches or imports a benchmark script."""
from __future__ import annotations

import statistics


def buckets(results: dict) -> str:
    """The all-reduce's bucket settings per model and link (buckets.json's results)."""
    rows = ["| model | link | setting | buckets | step (ms) | exposed comm (ms) |",
            "|---|---|---|---|---|---|"]
    for name, r in results.items():
        link = r["rate"] or "local"
        pure = f" (pure transfer {1000 * r['pure_transfer_s']:.0f} ms)" if r.get("pure_transfer_s") else ""
        for s, v in r["settings"].items():
            exp = "-" if s == "no all-reduce" else f"{1000 * v['exposed_s']:.0f}"
            rows.append(f"| {name} ({r['grad_bytes'] / 1e6:.2f} MB) | {link}{pure} | {s} | {v['buckets']} | "
                        f"{1000 * v['median_s']:.0f} | {exp} |")
    return "\n".join(rows)


def _median(values: list[float]) -> float | None:
    v = sorted(x for x in values if x is not None)
    return None if not v else v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def survival_summary(rec: dict) -> dict:
    """One method's numbers for the table and the prose of docs/results.md."""
    k = [r["top1"] for r in rec["killed"]]
    u = [r["top1"] for r in rec["uninterrupted"]]
    return dict(killed_top1=k, killed_mean=sum(k) / len(k), baseline_lo=min(u), baseline_hi=max(u),
                baseline_mean=sum(u) / len(u), within=sum(min(u) <= v <= max(u) for v in k),
                below=sum(v < min(u) for v in k), above=sum(v > max(u) for v in k),
                worst_below=max([min(u) - v for v in k] + [0.0]),
                runs=len(k), recovery_median=_median([r["recovery_seconds"] for r in rec["killed"]]),
                shrink_median=_median([r["shrink_seconds"] for r in rec["killed"]]),
                first_step_median=_median([r.get("first_step_seconds") for r in rec["killed"]]),
                weight_lost_median=_median([r.get("pushsum_weight_lost") for r in rec["killed"]]))


def survival_nodes(out: dict) -> str:
    """The emulated-node tries (``--across-nodes``) as a markdown table."""
    groups: dict = {}
    for r in out.get("across_nodes", []):
        groups.setdefault((r["method"], r["kill"]), []).append(r)
    rows = ["| method | what died | tries | finished (rc 0, summary, the failure recorded) | "
            "ended otherwise |", "|---|---|---|---|---|"]
    for (m, kill), rs in groups.items():
        ok = [r for r in rs if r["rc"] == 0 and r["summary"] and r["failures"]]
        bad = [f"rc {r['rc']}" + (", no summary" if not r["summary"] else "") +
               (f", aborted in {r['aborted_in']}" if r.get("aborted_in") else "") +
               (", timed out" if r["timed_out"] else "") for r in rs if r not in ok]
        what = "both ranks of node 2" if kill == "ranks" else "node 2 with its runtime daemon"
        rows.append(f"| {m} | {what} | {len(rs)} | {len(ok)} | {'; '.join(bad) or '–'} |")
    return "\n".join(rows)


def survival(out: dict) -> str:
    """Per method: the killed runs against the uninterrupted ones (survival.json)."""
    rows = ["| method | killed run: final top-1 % (seeds) | uninterrupted 3 ranks: range | killed runs "
            "inside it | revoke + shrink, median s | to the rebuilt job, median s | to the first step, "
            "median s |", "|---|---|---|---|---|---|---|"]
    for m, rec in out["methods"].items():
        s = survival_summary(rec)
        sec = (lambda v: "–" if v is None else f"{v:.2f}")
        rows.append(f"| {m} | {', '.join(f'{100 * v:.1f}' for v in s['killed_top1'])} | "
                    f"{100 * s['baseline_lo']:.1f}–{100 * s['baseline_hi']:.1f} | "
                    f"{s['within']}/{s['runs']} | {sec(s['shrink_median'])} | {sec(s['recovery_median'])} | "
                    f"{sec(s['first_step_median'])} |")
    return "\n".join(rows)


BOUNDS = {"vs_transfer": 1.5, "median_wait": 0.010, "compute_vs_one_node": 1.10}


def progress_misses(a: dict) -> list[str]:
    """The bounds (``BOUNDS``) that run ``a`` (its ``acceptance``) does not meet."""
    out = []
    if a["vs_transfer"] is not None and a["vs_transfer"] > BOUNDS["vs_transfer"]:
        out.append(f"comm+wait {a['vs_transfer']:.1f}x the transfer")
    if a["median_wait"] > BOUNDS["median_wait"]:
        out.append(f"wait {1e3 * a['median_wait']:.0f} ms per exchange")
    if a["compute_vs_one_node"] is not None and a["compute_vs_one_node"] > BOUNDS["compute_vs_one_node"]:
        out.append(f"compute {a['compute_vs_one_node']:.2f}x one node's")
    return out


def mpi_progress(d: dict) -> str:
    """Per run (variant, --mpi-progress) the seconds per step and the bounds (mpi_progress*.json)."""
    rows = ["| variant | --mpi-progress | step s | compute s | comm + wait s (share) | transfer s | "
            "comm + wait / transfer | wait per exchange ms (median of the ranks' means) | "
            "compute / one node | bounds |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, res in d["runs"].items():
        variant, mode = name.split()
        ps, a = res["per_step"], res["acceptance"]
        ratio = "—" if a["vs_transfer"] is None else f"{a['vs_transfer']:.2f}"
        comp = "—" if a["compute_vs_one_node"] is None else f"{a['compute_vs_one_node']:.2f}"
        rows.append(f"| {variant} | {mode} | {ps['train_seconds']:.3f} | {ps['compute_seconds']:.3f} | "
                    f"{a['comm_wait']:.3f} ({100 * a['share']:.0f}%) | {a['transfer']:.3f} | {ratio} | "
                    f"{1e3 * a['median_wait']:.1f} | {comp} | {'; '.join(progress_misses(a)) or 'met'} |")
    return "\n".join(rows)


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def hierarchy(d: dict) -> str:
    """Flat against hierarchical per variant: bytes, time to target, final error (hierarchy.json)."""
    rows = ["| variant | hierarchy | bytes per sample, busiest node (sent + received) | flat / hierarchical "
            "| seconds to 10% error (each seed) | final error % (each seed) |", "|---|---|---|---|---|---|"]
    busiest = {key: _mean([max(r["bytes_per_sample"].values()) for r in runs])
               for key, runs in d["runs"].items()}
    for key, runs in d["runs"].items():
        variant, hier = key.split()
        b = busiest[key]
        flat = busiest.get(f"{variant} none")
        cut = f"{flat / b:.2f}x" if hier != "none" and flat else ""
        ttt = ("— (evaluated at the end only)" if variant.endswith("-1eval") else
               ", ".join("never" if r["time_to_target"] is None else f"{r['time_to_target']:.1f}"
                         for r in runs))
        fe = ", ".join(f"{100 * r['final_error']:.1f}" for r in runs)
        rows.append(f"| {variant} | {hier} | {b / 1e3:.1f} kB | {cut} | {ttt} | {fe} |")
    return "\n".join(rows)
