"""The papers' claims judged on the crossover study, by rules written here, not by prose.

``verdicts(res)`` takes the analysed study (``crossover_report.analyse``: per method and p the time
to target under each profile, the timing runs' seconds per sample, ``p1``, ``extras``) and returns
one row per claim and profile: the claim, the scale and regime of the evidence, the evidence as
numbers, and a verdict that follows from them:

* a comparison of two families of methods at one p is a **win** for one side only when its fastest
  method's 95% interval over the seeds lies entirely below the other side's fastest (a side whose
  methods never reach the target in every seed loses to one that does); otherwise a **tie**;
* over the p of a claim: **agrees** when the claim's side wins at every p, **disagrees** when it
  wins at none and loses at one or more, **tie** when every p is a tie, else **partly agrees**.

Jin et al.'s J1 (asynchronous methods first up to ~32 nodes) is judged at p = 4..32 for their own
forms (EASGD, blocking pull gossip) against their all-reduce (fixed rate), and again for every
method; J2 (all-reduce scales better, to ~100) at p = 64 and 128; J5 (server contention) from the
server methods' throughput; Paine et al.'s P1 (3.2x on 8 GPUs) from the wall-clock speed-up and P3
(n_sync = 100 trains with less communication) from the long n_sync runs.
"""
from __future__ import annotations

JIN_ASYNC_P = (4, 8, 16, 32)            # "up to ~32 nodes"
JIN_SYNC_P = (64, 128)                  # "all-reduce scales better (to ~100)"
AUTHORS_ASYNC, AUTHORS_SYNC = ("easgd", "gossip-pull"), ("allreduce",)
ALL_ASYNC = ("easgd", "asgd", "gossip-pull", "pushsum-ov")
ALL_SYNC = ("allreduce", "allreduce-lsw", "localsgd")
SERVER_METHODS = ("easgd", "asgd")
PAINE_SPEEDUP = 3.2
REGIME = "virtual cluster (glyphs, ResNet-8)"


def _best(runs: dict, prof: str, family, p: int):
    """The family's fastest method at p among those whose seeds all reached the target: (name,
    time dict); ("never", None, which reached in some seeds) when some ran but none reached in
    every seed; None when none ran."""
    ran, best = False, None
    for m in family:
        r = runs.get(f"{m}/p{p}")
        if r is None or prof not in r["time_to_target"]:
            continue
        ran = True
        t = r["time_to_target"][prof]
        if t["n"] and not t["missing"] and (best is None or t["mean"] < best[1]["mean"]):
            best = (m, t)
    if best:
        return best
    if not ran:
        return None
    some = [f"{m} {runs[f'{m}/p{p}']['reached']} of {len(runs[f'{m}/p{p}']['seeds'])}" for m in family
            if f"{m}/p{p}" in runs and runs[f"{m}/p{p}"].get("reached")]
    return ("never", None, ", ".join(some))


def compare(runs: dict, prof: str, claim_side, other_side, p: int) -> dict | None:
    """One p: 'claim' (the claim's side wins), 'other', 'tie', or 'neither' reached; None if not run."""
    a, b = _best(runs, prof, claim_side, p), _best(runs, prof, other_side, p)
    if a is None or b is None:
        return None
    if a[1] is None and b[1] is None:
        outcome = "neither"
    elif b[1] is None:
        outcome = "claim"
    elif a[1] is None:
        outcome = "other"
    else:
        lo = {k: (t["lo"] if t["lo"] is not None else t["mean"]) for k, t in (("a", a[1]), ("b", b[1]))}
        hi = {k: (t["hi"] if t["hi"] is not None else t["mean"]) for k, t in (("a", a[1]), ("b", b[1]))}
        outcome = "claim" if hi["a"] < lo["b"] else "other" if hi["b"] < lo["a"] else "tie"
    return dict(p=p, outcome=outcome, claim=a, other=b)


def judge(outcomes: list[str]) -> str:
    if not outcomes:
        return "not run"
    if all(o == "claim" for o in outcomes):
        return "agrees"
    if "claim" not in outcomes and "other" in outcomes:
        return "disagrees"
    if all(o in ("tie", "neither") for o in outcomes):
        return "tie"
    return "partly agrees"


def _side(x) -> str:
    name, t = x[:2]
    if t is None:
        return "none reached the target in every seed" + (f" ({x[2]})" if len(x) > 2 and x[2] else "")
    lo = f"{t['lo']:.0f}" if t["lo"] is not None else "?"
    hi = f"{t['hi']:.0f}" if t["hi"] is not None else "?"
    return f"{name} {t['mean']:.0f} s [{lo}–{hi}] ({t['n']} seeds)"


WORD = {"claim": "{a} first", "other": "{b} first", "tie": "tie", "neither": "neither in every seed"}


def _family_row(runs, prof, claim, scale, claim_side, other_side, ps, a_name, b_name) -> dict:
    rows = [c for p in ps if (c := compare(runs, prof, claim_side, other_side, p)) is not None]
    evidence = "; ".join(f"p = {c['p']}: {_side(c['claim'])} vs {_side(c['other'])} → "
                         + WORD[c["outcome"]].format(a=a_name, b=b_name) for c in rows)
    missing = [p for p in ps if p not in {c["p"] for c in rows}]
    if missing:
        evidence += f" (p = {', '.join(map(str, missing))} not run yet)"
    return dict(claim=claim, profile=prof, scale=scale, regime=REGIME, evidence=evidence,
                verdict=judge([c["outcome"] for c in rows]))


def _throughput(runs: dict, prof: str, method: str) -> list[tuple[int, float]]:
    out = []
    for key, r in sorted(runs.items(), key=lambda kv: kv[1]["workers"]):
        s = r.get("seconds_per_sample", {}).get(prof)
        if r["method"] == method and s:
            out.append((r["workers"], 1.0 / s))
    return out


def _j5(runs: dict, prof: str) -> dict:
    """Contention at the server: the server methods' samples/s stop growing with p (a doubling of
    p that adds < 20% throughput: the server is saturated from the smaller p on), while
    all-reduce's keeps growing."""
    server = _throughput(runs, prof, SERVER_METHODS[0])
    sync = _throughput(runs, prof, "allreduce")
    stall = next((q for (q, x), (p, y) in zip(server, server[1:]) if y < 1.2 * x), None)
    def eff(rows):
        return (rows[-1][1] / rows[0][1]) / (rows[-1][0] / rows[0][0]) if len(rows) > 1 else None
    evidence = (f"samples/s of {' = '.join(SERVER_METHODS)} (one server) at p = "
                + ", ".join(f"{p}: {x:.0f}" for p, x in server)
                + "; all-reduce: " + ", ".join(f"{p}: {x:.0f}" for p, x in sync))
    if server and sync:
        evidence += (f"; scaling efficiency p = {server[0][0]}→{server[-1][0]}: server methods "
                     f"{eff(server):.2f}, all-reduce {eff(sync):.2f}")
    verdict = "not run" if len(server) < 2 else "agrees" if stall is not None else "disagrees"
    if stall is not None:
        evidence += f"; no gain past p = {stall}: the server is saturated"
    return dict(claim="J5", profile=prof, scale=f"p = {server[0][0]}–{server[-1][0]}" if server else "—",
                regime=REGIME + ", timing runs", evidence=evidence, verdict=verdict)


def _p1(p1: dict, prof: str) -> dict:
    x = p1.get(prof)
    if not x:
        return dict(claim="P1", profile=prof, scale="p = 8", regime=REGIME, evidence="not run", verdict="not run")
    verdict = ("disagrees" if x["hi"] < PAINE_SPEEDUP else "agrees")
    note = "" if x["lo"] <= PAINE_SPEEDUP <= x["hi"] else (" (above 3.2×)" if x["lo"] > PAINE_SPEEDUP
                                                           else " (below 3.2×)")
    one, many = x["seeds"]
    seeds = f"{one} seeds each" if one == many else f"{many} and {one} seeds"
    return dict(claim="P1", profile=prof, scale=f"p = {x['workers']} against 1, {seeds}", regime=REGIME,
                evidence=(f"wall-clock speed-up to target {x['speedup']:.1f}× [{x['lo']:.1f}–{x['hi']:.1f}]"
                          f"{note}: {x['one_seconds']:.0f} s with one worker, {x['many_seconds']:.0f} s with "
                          f"{x['workers']} clients and a server"),
                verdict=verdict)


def _p3(extras: dict) -> dict:
    e = extras.get("asgd-nsync")
    if not e:
        return dict(claim="P3", profile="—", scale="—", regime=REGIME, evidence="not run", verdict="not run")
    c = e["configs"]
    def one(name):
        r = c[name]
        t = r["epochs_to_target"]
        reached = (f"{t['mean']:.2f} epochs to target" if t["n"] and not t["missing"]
                   else f"never reached the target (final error {100 * r['final_error']['mean']:.0f}%)")
        return f"n_sync {name[1:]}: {r['exchanges_per_worker']:.0f} exchanges per client, {reached}"
    big, small = c["n100"], c["n1"]
    ok_big = big["epochs_to_target"]["n"] and not big["epochs_to_target"]["missing"]
    ok_small = small["epochs_to_target"]["n"] and not small["epochs_to_target"]["missing"]
    verdict = ("agrees" if ok_big else "disagrees" if ok_small else "tie")
    return dict(claim="P3", profile="(statistics only)",
                scale=f"{e['workers']} clients, {e['epochs']} epochs, {len(c['n1']['seeds'])} seeds",
                regime=REGIME, evidence="; ".join(one(n) for n in c), verdict=verdict)


def verdicts(res: dict) -> list[dict]:
    runs, rows = res["runs"], []
    for prof in res["profiles"]:
        rows.append(_family_row(runs, prof, "J1 (the authors' forms)", "p = 4–32", AUTHORS_ASYNC,
                                AUTHORS_SYNC, JIN_ASYNC_P, "asynchronous", "all-reduce"))
        rows.append(_family_row(runs, prof, "J1 (every method)", "p = 4–32", ALL_ASYNC, ALL_SYNC,
                                JIN_ASYNC_P, "asynchronous", "synchronous"))
        rows.append(_family_row(runs, prof, "J2", "p = 64–128", ALL_SYNC, ALL_ASYNC, JIN_SYNC_P,
                                "synchronous", "asynchronous"))
        rows.append(_j5(runs, prof))
        rows.append(_p1(res.get("p1", {}), prof))
    rows.append(_p3(res.get("extras", {})))
    return rows
