"""The crossover study's analysis (``results/crossover.json``, ``report.analyse``) as markdown:
the map, the answer in words, the verdicts, the tuning counts.  A dict in, text out: what the docs
show is rebuilt from the JSON alone (``benchmarks/report.py``), without the records or numpy."""
from __future__ import annotations

from collections import Counter

from . import study as X

BUDGET_HOURS = 24                     # the budget the study was given, in machine-hours
STEP_SPEEDUP = 4                      # the worker-step speed-up that budget assumed (not reached)


def tuning_counts_words(res: dict) -> str:
    """Where a method's tuning runs at a p differ from the other methods' there (only the edge steps
    can make them differ: the study's rules ask for both equal counts and a grid extended past an edge)."""
    by_p: dict[int, dict[str, int]] = {}
    for t in res["tuning"].values():
        if t["workers"] > 1:
            by_p.setdefault(t["workers"], {})[t["method"]] = t["runs"]
    odd = []
    for p, runs in sorted(by_p.items()):
        common = Counter(runs.values()).most_common(1)[0][0]
        if any(n != common for n in runs.values()):
            more = ", ".join(f"{SHORT.get(m, m)} {n}" for m, n in runs.items() if n != common)
            odd.append(f"p = {p}: {more}, every other method {common}")
    if not odd:
        return "Every method had the same number of tuning runs at every p."
    return ("Every method had the same number of tuning runs at each p, except where a choice still sat on "
            "an edge of its rates and its grid went on past it (the study's rules ask for both, an equal "
            "count and a grid extended past an edge; the edge rule was kept, so those methods had the "
            "larger search): " + "; ".join(odd) + ".")


def secs(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


CAP_MARK = "†"
CAP_LEGEND = (f"{CAP_MARK} decided by the cap: no asynchronous method reached the target in every seed, "
              "and the runs of some (those marked `cap` in the table of every method in every cell) were "
              f"stopped at the cap, {X.CAP_TIME:g}× the best synchronous time of the cell in whole epochs, "
              "to save time, since they could not be the fastest: stopped, not missed targets.")

SHORT = {"single": "1 worker", "allreduce": "all-reduce", "localsgd": "local SGD", "easgd": "EASGD",
         "asgd": "A-SGD", "gossip-pull": "pull gossip", "pushsum-ov": "push-sum"}


def cell_text(c: dict | None) -> str:
    """A map cell: the fastest method and its mean time, and what ties with it; ``CAP_MARK`` where
    the families' call was decided by the cap."""
    if c is None:
        return "not run yet"
    if c["fastest"] is None:
        capped = [SHORT[m] for m, r in c["methods"].items() if r.get("capped")]
        return ("none reached the target in every seed"
                + (f" ({', '.join(capped)} stopped at the cap)" if capped else "") + so_far(c))
    r = c["methods"][c["fastest"]]
    ties = [SHORT[m] for m in c.get("tied", [])]
    text = f"**{SHORT[c['fastest']]}** {secs(r['mean_seconds'])} s" + (f" (ties {', '.join(ties)})"
                                                                       if ties else "")
    return text + (f" {CAP_MARK}" if c.get("decided_by_cap") else "") + so_far(c)


def so_far(c: dict) -> str:
    """What a cell still waits for (nothing once it is complete)."""
    if c["complete"]:
        return ""
    if c.get("missing"):
        n = len([m for m in c["methods"] if m not in c["missing"]])
        return f" *(so far: {n} of {n + len(c['missing'])} methods)*"
    if c.get("searching"):
        return f" *(so far: the search goes on for {len(c['searching'])} of {len(c['methods'])} methods)*"
    return " *(so far: seeds to come)*"


FAMILY_NAME = {"sync": "synchronous", "async": "asynchronous"}


def say_outcome(o: str) -> str:
    """A crossover outcome (``sequence_words``) in a reader's words."""
    if o.startswith("no crossing in range: a tie"):
        span = o.rpartition(" p ")[2].strip("()").replace("-", "–")
        return f"no crossing resolved in p = {span}: the families tie at every p"
    if o.startswith("no crossing in range: "):
        fam, _, span = o[len("no crossing in range: "):].partition(" at every p ")
        fam, tie, _ = fam.partition(" or a tie")
        span = span.strip("()").replace("-", "–")
        if tie:
            return (f"no crossing resolved in p = {span}: {FAMILY_NAME[fam]} first wherever the families "
                    "differ")
        return f"no crossing in p = {span}: {FAMILY_NAME[fam]} first at every p"
    if " -> " in o:
        out, prev = [], o.partition(" -> ")[0]
        for step in o.split(" -> ")[1:]:
            f1, _, bracket = step.partition(" in ")
            out.append(f"{FAMILY_NAME[f1]} between p = {bracket.strip('[]').replace(', ', ' and ')}")
        return FAMILY_NAME[prev] + " → " + ", then → ".join(out)
    return o


def runs_of(items) -> list[tuple]:
    """(p, value) pairs in order of p -> (value, first p, last p) for each run of equal values."""
    out: list[list] = []
    for p, v in items:
        if out and out[-1][0] == v:
            out[-1][2] = p
        else:
            out.append([v, p, p])
    return [tuple(r) for r in out]


def p_span(a, b) -> str:
    return f"p = {a}" if a == b else f"p = {a}–{b}"


def per_p_words(per_p: dict) -> str:
    """The family first at each p (``crossover``'s ``per_p``; keys int, or str as read from JSON),
    runs of p alike together: "asynchronous first at p = 2 · a tie at p = 4 · synchronous first at
    p = 8–64", and the p where the cap decided it: "(decided by the cap at p = 64)"."""
    ps = sorted(per_p, key=int)
    runs = runs_of((int(p), per_p[p]["family"]) for p in ps)
    capped = runs_of((int(p), bool(per_p[p].get("by_cap"))) for p in ps)
    out = []
    for f, a, b in runs:
        cap = [p_span(max(a, x), min(b, y)) for on, x, y in capped if on and x <= b and y >= a]
        out.append(("a tie" if f == "tie" else f"{FAMILY_NAME[f]} first") + f" at {p_span(a, b)}"
                   + (f" (decided by the cap at {', '.join(cap)})" if cap else ""))
    return " · ".join(out)


def shares_text(shares: dict[str, float]) -> str:
    """The bootstrap shares of the outcomes, largest first (under 1% as "<1%", over 99% as ">99%")."""
    if not shares:
        return ""
    if len(shares) == 1:
        return " (in every bootstrap resample)"
    return " (bootstrap: " + "; ".join(
        f"{'<1%' if v < 0.01 else '>99%' if v > 0.99 else f'{v:.0%}'} {say_outcome(k)}"
        for k, v in shares.items()) + ")"


def noise_units(res: dict, batch: int = 8) -> tuple[str, str] | None:
    """The map's p in noise-scale units: a table row of the global batch ``batch`` x p over the
    fitted B_noise (where the fit is resolved) and over the measured B_simple, and the sentence
    that says so (None: the study has neither)."""
    ns = res.get("noise_scale") or {}
    bn = ns.get("b_noise") if ns.get("resolved") else None
    bs = (ns.get("measured") or {}).get("b_simple")
    if not bn and not bs:
        return None
    names = [name for name, b in (("B_noise", bn), ("B_simple", bs)) if b]
    row = (f"| *{batch}p / " + " (/ ".join(names) + ")" * (len(names) - 1) + "* | "
           + " | ".join(" (".join(f"{batch * p / b:.2g}" for b in (bn, bs) if b) + ")" * (len(names) - 1)
                        for p in res["workers"]) + " |")
    said = [f"the fitted B_noise ≈ {bn:.0f}" if bn else "", f"the measured B_simple ≈ {bs:.0f}" if bs else ""]
    text = ("The last row of each network's table reads p in noise-scale units: the global batch "
            f"{batch}p over " + ", and in brackets over ".join(x for x in said if x)
            + " (the noise scale: section 11). Another workload's map is read at its own global batch over "
            "its own noise scale, not at its number of GPUs.")
    return row, text


def map_markdown(res: dict) -> str:
    """Per network: the fastest method (or the tied set) by condition and p, then each condition's
    crossover with the bootstrap share of its outcomes."""
    out = []
    units = noise_units(res)
    if units:
        out += [units[1], ""]
    for n in res["networks"]:
        out += [f"**{n}**", "", "| condition | " + " | ".join(f"p = {p}" for p in res["workers"]) + " |",
                "|---|" + "---|" * len(res["workers"])]
        for c in res["conditions"]:
            out.append(f"| {c} | " + " | ".join(cell_text(res["cells"].get(f"{n}/{c}/p{p}"))
                                             for p in res["workers"]) + " |")
        if units:
            out.append(units[0])
        out.append("")
        if any(v.get("decided_by_cap") for k, v in res["cells"].items() if k.startswith(f"{n}/")):
            out += [CAP_LEGEND, ""]
        for c in res["conditions"]:
            x = res["crossovers"][f"{n}/{c}"]
            seq = per_p_words(x["per_p"])
            out.append(f"* {c}: " + (f"{seq}. So " if seq else "") + say_outcome(x["outcome"])
                       + shares_text(x["shares"]))
        out.append("")
    return "\n".join(out).rstrip()


def segments(res: dict, network: str, condition: str) -> list[dict]:
    """Along p (cells with runs, p > 1): runs of the same first family (``tie``: a method of the other
    family ties with the fastest; ``miss``: none reached the target; ``open``: the cell's runs are
    not all in, or not begun below a p that has runs, so it names no family and no run reaches
    across it), with the methods first in each and the p where the cap decided it (``cap``)."""
    out: list[dict] = []
    ps = [p for p in res["workers"][1:] if f"{network}/{condition}/p{p}" in res["cells"]]
    for p in res["workers"][1:]:
        if not ps or p > ps[-1]:
            break                            # (the p not run yet, past the last with runs)
        c = res["cells"].get(f"{network}/{condition}/p{p}")
        best = c and c["fastest"]
        if not c or not c["complete"]:
            fam, names = "open", []
        elif best is None:
            fam, names = "miss", []
        else:
            other = [m for m in c["tied"] if X.FAMILY[m] != X.FAMILY[best]]
            fam, names = ("tie", [best, *other]) if other else (X.FAMILY[best], [best])
        if out and out[-1]["family"] == fam:
            out[-1]["to"] = p
            out[-1]["methods"] += [m for m in names if m not in out[-1]["methods"]]
            out[-1]["by_p"][p] = names
        else:
            out.append({"family": fam, "from": p, "to": p, "methods": list(names), "by_p": {p: names},
                        "cap": []})
        if c and c["complete"] and c.get("decided_by_cap"):
            out[-1]["cap"].append(p)
    return out


def say_segments(segs: list[dict]) -> str:
    def one(g):
        span = p_span(g["from"], g["to"])
        # the methods of each p, runs of p that name the same together (one list if all do)
        lists = runs_of((p, ", ".join(SHORT[m] for m in ms))
                        for p, ms in g.get("by_p", {g["from"]: g["methods"]}).items())
        names = lists[0][0] if len(lists) == 1 else "; ".join(f"{p_span(a, b)}: {ms}" for ms, a, b in lists)
        if g["family"] == "miss":
            return f"no method reaches the target in every seed at {span}"
        if g["family"] == "open":
            return f"runs still to come at {span}"
        what = "a tie of the families" if g["family"] == "tie" else FAMILY_NAME[g["family"]]
        cap = [p_span(a, b) for on, a, b in runs_of((p, p in g.get("cap", [])) for p in g.get("by_p", {}))
               if on]
        return f"{what} at {span} ({names}" + (f"; decided by the cap at {', '.join(cap)}" if cap else
                                               "") + ")"
    return " · ".join(one(g) for g in segs) if segs else "not run yet"


def answer_markdown(res: dict, final: bool) -> str:
    """The map in a few lines: per condition, which family is first along p on each network
    (networks that read the same are named together), and the machine-hours spent."""
    done = []                 # the p through which every cell is complete
    for p in res["workers"][1:]:
        if not all(res["cells"].get(f"{n}/{c}/p{p}", {}).get("complete")
                   for n in res["networks"] for c in res["conditions"]):
            break
        done.append(p)
    head = ("**In short** (generated from the study): the family first to the target along p." if final else
            "**In short, so far** (generated from the cells complete yet"
            f"{f', every one through p = {max(done)}' if done else ''}): "
            "the family first to the target along p.")
    head += (f" Times are simulated seconds: the profile's GPU and network (its `stands_for`, e.g. "
             f"ResNet-50 on A100s) for the steps a proxy task took to "
             f"{res.get('target_error', X.TARGET):.0%} validation error (the glyphs, ResNet-8, batch 8 per "
             "worker; the map below, section 11).")
    words = {"none": "No variability", "typical": "A cluster's typical jitter",
             "stragglers": "Jin et al.'s stragglers"}
    out = [head, ""]
    for c in res["conditions"]:
        said: dict[str, list[str]] = {}
        for n in res["networks"]:
            said.setdefault(say_segments(segments(res, n, c)), []).append(f"`{n}`")
        out.append(f"* **{words.get(c, c)}.** " + " ".join(f"{' and '.join(ns)}: {text}."
                                                         for text, ns in said.items()))
    out.append("* " + horizon_words(res))
    if res.get("decided_by_cap"):
        out.append("* " + cap_words(res))
    out.append("* " + budget_words(res, final))
    return "\n".join(out)


def horizon_words(res: dict) -> str:
    """The study's test of the horizon: in every cell some method reaches the target in every seed."""
    cells = res["cells"]
    done = [k for p in res["workers"] for n in res["networks"] for c in res["conditions"]
            for k in [f"{n}/{c}/p{p}"] if cells.get(k, {}).get("complete")]
    short = [k for k in done if cells[k]["fastest"] is None]
    head = (f"**The horizon.** {len(done)} of {len(cells)} cells are complete"
            + ("" if len(done) < len(cells) else " (all)"))
    if not short:
        return head + ": in every one some method reached the target in every seed."
    return (head + f": in {len(done) - len(short)} some method reached the target in every seed; in "
            + ", ".join(f"`{k}`" for k in short) + " none did (a longer horizon would be needed there).")


def cap_words(res: dict) -> str:
    """What the cap decided (``report.cap_count``): the cells and verdicts, and how many seeds it
    stopped against how many missed the target at their horizon."""
    d = res["decided_by_cap"]
    several = sum(1 for cl in res["cells"].values() if cl["workers"] > 1)
    ps = sorted({int(k.rsplit("/p", 1)[1]) for k in d["cells"]})
    where = f"p = {', '.join(map(str, ps))}; {CAP_MARK} in the map" if ps else ""
    every = d.get("n_cells_every_method", len(d["cells"]))
    if ps and every < len(d["cells"]):
        where += (f"; in {every} every asynchronous method was stopped there, in the others some missed the "
                  "target at their horizon")
    claims = Counter(v["claim"] for v in d["verdicts"])
    seeds = d["seeds"]

    def n(fam, *how):
        return sum(seeds.get(fam, {}).get(h, 0) for h in how)
    ran = d.get("least_over_fastest")
    return (f"**The cap.** An asynchronous run stops at {d['cap_time']:g}× the best synchronous time of its "
            "cell (in whole epochs, by its speed in its tuning or timing runs): past that it cannot be the "
            "fastest, so it is reported as stopped at the cap with the error it reached, never as a miss"
            + (f" (every seed stopped there had run at least {ran:.2f}× its cell's fastest mean time)"
               if ran else "") + ". The cap decided the families' call in "
            f"{len(d['cells'])} of the {several} cells with p > 1" + (f" ({where})" if where else "")
            + f" and {len(d['verdicts'])} verdicts at some p"
            + (f" ({'; '.join(f'{c}: {k}' for c, k in claims.items())})" if claims else "")
            + f". Of the asynchronous methods' seeds in the cells, {n('async', 'cap')} were stopped at the "
            f"cap and {n('async', 'horizon', 'diverged')} missed the target at their whole horizon or "
            f"diverged; of the authors' asynchronous forms' seeds, {n('authors', 'cap')} and "
            f"{n('authors', 'horizon', 'diverged')}.")


def budget_words(res: dict, final: bool) -> str:
    """The machine-hours spent against the budget; past it, by how much and why."""
    hours, ms = res["machine_hours_total"], res.get("ms_per_worker_step")
    did = "took" if final else "has taken"
    if hours <= BUDGET_HOURS:
        return (f"The study {did} {hours:.1f} machine-hours (one core per run) of the {BUDGET_HOURS:g} "
                "budgeted.")
    step = f" {ms:.1f} ms of one core (all of a run's real time counted)," if ms else ""
    return (f"The study {did} {hours:.1f} machine-hours (one core per run), {hours - BUDGET_HOURS:.1f} over "
            f"the {BUDGET_HOURS:g} budgeted. A virtual worker-step costs{step} {STEP_SPEEDUP:g}× what the "
            "budget assumed (worker-steps that many times cheaper, which the virtual cluster did not reach); "
            "none of the cuts that would have kept within the budget (a smaller search, fewer seeds, the "
            "asynchronous methods under one condition, a shorter horizon) was made, since each breaks a "
            "requirement of a fair study.")


def claims_markdown(res: dict) -> str:
    rows = ["| claim | network | condition | where | evidence | verdict |", "|---|---|---|---|---|---|"]
    for r in res["verdicts"]:
        cap = r.get("decided_by_cap")
        rows.append(f"| {r['claim']} | {r['network']} | {r['condition']} | {r['scale']} | {r['evidence']} | "
                    f"**{r['verdict']}**" + (f" (decided by the cap at p = {', '.join(map(str, cap))})"
                                             if cap else "") + " |")
    return "\n".join(rows)
