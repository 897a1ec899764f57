"""The papers' claims judged on the crossover study, by rules written here, not by prose.

``verdicts(res)`` takes the analysed study (``crossover_report.analyse``: per method and p the time
to target under each profile, the timing runs' seconds per sample, ``p1``, ``extras``) and returns
one row per claim and profile: the claim, the scale and regime of the evidence, the evidence as
numbers, and a verdict that follows from them by these rules:

* **one p, two sides** (families of methods): a side is **first** only when its fastest method's
  95% interval over the seeds lies entirely below the interval of *every* method of the other side
  that reached the target in every seed (a method that did not is slower than one that did);
  otherwise a **tie**.  When no method of either side reached the target in every seed, that p
  gives no evidence (shown, not judged).
* **over the p of a claim**: **agrees** when the claim's side is first at every p with evidence,
  **disagrees** when it is first at none and second at one or more, **tie** when every p ties,
  else **partly agrees**; **not run** without evidence.
* **J5** (contention at the server): agrees when the one-server methods' training samples per
  second stop growing (a doubling of p adds < 20%) while all-reduce's keep growing (every doubling
  adds >= 20%); disagrees otherwise.
* **P1** (A-SGD 3.2x on 8 GPUs): agrees when the interval of the wall-clock speed-up to target
  (8 clients against one worker) reaches 3.2x or lies above it, disagrees when it lies below.
* **P3** (n_sync = 100: less communication, coarser but still training): only comparable when
  n_sync = 100 made >= 50 exchanges per client; then agrees when it reached the target in every
  seed, disagrees when it reached it in none while n_sync = 1 did.

Jin et al.'s J1 (asynchronous methods first up to ~32 nodes) is judged at p = 4..32 for their own
forms (EASGD, blocking pull gossip) against their all-reduce (fixed rate), and again for every
method; J2 (all-reduce scales better, to ~100) at p = 64 and 128.
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


def _reached(runs: dict, prof: str, family, p: int) -> list[tuple[str, dict]]:
    """(name, time dict) of the family's methods at p whose seeds all reached the target."""
    out = []
    for m in family:
        r = runs.get(f"{m}/p{p}")
        if r is not None and prof in r["time_to_target"]:
            t = r["time_to_target"][prof]
            if t["n"] and not t["missing"]:
                out.append((m, t))
    return out


def partly_reached(runs: dict, p: int, family=None) -> str:
    """'METHOD k of n, ...' for the methods at p (of ``family``, else all) that reached the target
    in some seeds, most first."""
    rows = [r for r in runs.values() if r["workers"] == p and r.get("reached")
            and (family is None or r["method"] in family)]
    return ", ".join(f"{r['method']} {r['reached']} of {len(r['seeds'])}"
                     for r in sorted(rows, key=lambda r: -r["reached"]))


def _best(runs: dict, prof: str, family, p: int):
    """(name, time dict, "") of the family's fastest method at p among those whose seeds all
    reached the target; ("never", None, which reached in some seeds) when some ran but none
    reached in every seed; None when none ran."""
    reached = _reached(runs, prof, family, p)
    if reached:
        return (*min(reached, key=lambda mt: mt[1]["mean"]), "")
    if not any(f"{m}/p{p}" in runs and prof in runs[f"{m}/p{p}"]["time_to_target"] for m in family):
        return None
    return ("never", None, partly_reached(runs, p, family))


def _lo(t: dict) -> float:
    return t["lo"] if t["lo"] is not None else t["mean"]


def _hi(t: dict) -> float:
    return t["hi"] if t["hi"] is not None else t["mean"]


def compare(runs: dict, prof: str, claim_side, other_side, p: int) -> dict | None:
    """One p: 'claim' (the claim's side is first), 'other', 'tie', or 'neither' (no method of either
    side reached the target in every seed: no evidence); None if not run.  ``ties``: the methods
    of the slower side whose intervals reach the faster side's best (they make it a tie)."""
    a, b = _best(runs, prof, claim_side, p), _best(runs, prof, other_side, p)
    if a is None or b is None:
        return None
    ties: list[str] = []
    if a[1] is None and b[1] is None:
        outcome = "neither"
    elif b[1] is None:
        outcome = "claim"
    elif a[1] is None:
        outcome = "other"
    else:
        fast, slow = (a, other_side) if a[1]["mean"] <= b[1]["mean"] else (b, claim_side)
        ties = [m for m, t in _reached(runs, prof, slow, p) if _lo(t) <= _hi(fast[1])]
        outcome = "tie" if ties else ("claim" if fast is a else "other")
    return dict(p=p, outcome=outcome, claim=a, other=b, ties=ties)


def judge(outcomes: list[str]) -> str:
    outcomes = [o for o in outcomes if o != "neither"]       # no evidence at that p
    if not outcomes:
        return "not run"
    if all(o == "claim" for o in outcomes):
        return "agrees"
    if "claim" not in outcomes and "other" in outcomes:
        return "disagrees"
    if all(o == "tie" for o in outcomes):
        return "tie"
    return "partly agrees"


def _side(x) -> str:
    name, t, some = x
    if t is None:
        return "none reached the target in every seed" + (f" ({some})" if some else "")
    lo = f"{t['lo']:.0f}" if t["lo"] is not None else "?"
    hi = f"{t['hi']:.0f}" if t["hi"] is not None else "?"
    return f"{name} {t['mean']:.0f} s [{lo}–{hi}] ({t['n']} seeds)"


WORD = {"claim": "{a} first", "other": "{b} first", "tie": "tie", "neither": "no evidence (neither in every seed)"}


def _family_row(runs, prof, claim, scale, claim_side, other_side, ps, a_name, b_name) -> dict:
    rows = [c for p in ps if (c := compare(runs, prof, claim_side, other_side, p)) is not None]
    evidence = "; ".join(f"p = {c['p']}: {_side(c['claim'])} vs {_side(c['other'])} → "
                         + WORD[c["outcome"]].format(a=a_name, b=b_name)
                         + (f" (with {', '.join(c['ties'])})" if c["ties"] else "") for c in rows)
    missing = [p for p in ps if p not in {c["p"] for c in rows}]
    if missing:
        evidence += f" (p = {', '.join(map(str, missing))} not run yet)"
    return dict(claim=claim, profile=prof, scale=scale, regime=REGIME, evidence=evidence,
                verdict=judge([c["outcome"] for c in rows]))


def _throughput(runs: dict, prof: str, method: str) -> list[tuple[int, float]]:
    out = []
    for r in sorted(runs.values(), key=lambda r: r["workers"]):
        s = r.get("seconds_per_sample", {}).get(prof)
        if r["method"] == method and s:
            out.append((r["workers"], 1.0 / s))
    return out


def _j5(runs: dict, prof: str) -> dict:
    """Contention at the server: the server methods' samples/s stop growing with p (a doubling of
    p that adds < 20% throughput: the server is saturated from the smaller p on), while
    all-reduce's keeps growing (no such doubling)."""
    server = _throughput(runs, prof, SERVER_METHODS[0])
    sync = _throughput(runs, prof, "allreduce")
    def stalls(rows):                      # the first p after which a doubling adds < 20%
        return next((q for (q, x), (p, y) in zip(rows, rows[1:]) if y < 1.2 * x), None)
    stall, sync_stall = stalls(server), stalls(sync)

    def eff(rows):
        return (rows[-1][1] / rows[0][1]) / (rows[-1][0] / rows[0][0]) if len(rows) > 1 else None
    evidence = (f"samples/s of {' = '.join(SERVER_METHODS)} (one server) at p = "
                + ", ".join(f"{p}: {x:.0f}" for p, x in server)
                + "; all-reduce: " + ", ".join(f"{p}: {x:.0f}" for p, x in sync))
    e_server, e_sync = eff(server), eff(sync)
    if e_server is not None and e_sync is not None:
        evidence += (f"; scaling efficiency p = {server[0][0]}→{server[-1][0]}: server methods "
                     f"{e_server:.2f}, all-reduce {e_sync:.2f}")
    if stall is not None:
        evidence += f"; no gain past p = {stall}: the server is saturated"
    if e_server is None or e_sync is None:
        verdict = "not run"
    else:
        verdict = "agrees" if stall is not None and sync_stall is None else "disagrees"
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
    seeds = f"{one} seeds each" if one == many else f"{many} seeds with {x['workers']}, {one} with 1"
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
    none_big = big["epochs_to_target"]["n"] == 0
    ok_small = small["epochs_to_target"]["n"] and not small["epochs_to_target"]["missing"]
    verdict = ("not comparable" if big["exchanges_per_worker"] < 50 else "agrees" if ok_big
               else "disagrees" if none_big and ok_small else "tie")
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
