"""The claims table in words: as Markdown (`claims.md`) and as one sentence per claim (the
report's front page, `findings.md`). The table itself is `claims.py`'s."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlcore.analysis.claims import (
    ABSENT,
    EQUIVALENT,
    SUPPORTED,
    UNRESOLVED,
    blocked_widths,
)
from rlcore.analysis.tables import CLOCK_METRICS
from rlcore.record.identity import WALL_CLOCK

# What a row whose arms' runs end in the same weights says (`claims.py::same_weights`).
SAME_WEIGHTS = "its arms' runs end in the same weights, so they differ only in time"
# Above the rows the front page lists apart: comparisons that could not have come out otherwise
CHECKS_HEAD = ("Checks of the method, not findings: these comparisons' arms end in the same "
               "weights, so what the weights score is equal by construction and only time "
               "can differ.")


def _num(x: float, digits: int) -> str:
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


# Seeds beyond any grid this tool runs: a need above it is printed as "over" it
MANY_SEEDS = 100


def _count(n: float) -> str:
    """A number of seeds as the table prints it: none settle an effect of exactly zero, and
    a need beyond any grid is only 'over 100'."""
    if math.isnan(n):
        return "n/a"
    if math.isinf(n):
        return "none settle it (no effect seen)"
    return f"over {MANY_SEEDS}" if n > MANY_SEEDS else f"{n:.0f}"


def claims_markdown(table: Sequence[Mapping[str, Any]], digits: int = 3) -> str:
    """The claims table as Markdown: claim, comparison, effect [95 % CI] and delta, seeds
    (those a difference and an equivalence would need, with the job-minutes the seeds it
    lacks would take), verdict (and whether those fit the budget's spare)."""
    lines = ["| claim | statement (source) | comparison | effect [95 % CI]; delta | seeds "
             "(have / need) | verdict |", "|---|---|---|---|---|---|"]
    for r in table:
        need, need_eq = r["seeds_needed"], r["seeds_needed_equivalence"]
        need_text = _count(need)
        if not math.isnan(need_eq):
            need_text += f" or {_count(need_eq)} for equivalence"
        if math.isfinite(r["extra_job_min"]) and r["extra_job_min"] > 0:
            need_text += f" (+{r['extra_job_min']:.1f} job-min)"
        verdict_text = r["verdict"]
        if r["basis"] == "equivalence":
            verdict_text += (" (equivalence: the 90 % interval lies within +-delta)"
                             if r["verdict"] == SUPPORTED else
                             " (the 90 % interval lies within +-delta)")
        if r["verdict"] == ABSENT:
            verdict_text += f" (no {r['cause']} in its runs: {r['cause_per_run']})"
        if r["verdict"] == UNRESOLVED and not r["seeds_to_settle"] <= r["seeds"]:
            verdict_text += ("; more seeds do not fit the budget" if r["beyond_budget"]
                             else "; more seeds fit the budget")
        effect = (f"{_num(r['effect'], digits)} [{_num(r['ci95_lo'], digits)}, "
                  f"{_num(r['ci95_hi'], digits)}]; +-{_num(r['delta'], digits)}")
        expect = "> 0" if r["expect"] == "positive" else "< 0"
        comparison = r["comparison"] + (f" (no runs: {r['missing_arms']})"
                                        if r["missing_arms"] else "")
        if r.get("same_weights"):
            comparison += f" ({SAME_WEIGHTS})"
        lines.append(f"| {r['claim']} | {r['statement']} ({r['source']}) | {comparison}; "
                     f"claim: {expect} | {effect} | {r['seeds']} / {need_text} | "
                     f"{verdict_text} |")
    return "\n".join(lines) + "\n" + blocked_text(table)


def blocked_text(table: Sequence[Mapping[str, Any]]) -> str:
    """A paragraph under the table: the blocked rows' interval widths against unpaired ones
    on the same runs, and whether their runs started block by block; '' without them."""
    w = blocked_widths(table)
    if w is None:
        return ""
    order = ("every one's runs started block by block" if not w.out_of_order else
             f"the runs of {', '.join(w.out_of_order)} did not start block by block (a "
             "partial rerun, or another order): their blocks are seeds, not back to back")
    return (f"\nPaired by block ({w.rows} rows on this machine's clock): the median 95 % "
            f"half-width is {w.blocked:.2f} delta, against {w.unpaired:.2f} delta unpaired on "
            f"the same runs (the median row's ratio {w.ratio:.2f}); {order}.\n")


def _plain(text: str) -> str:
    """`text` with the characters that mark up Markdown or reStructuredText escaped."""
    return re.sub(r"([\\`*_|])", r"\\\1", text)


def verdict_words(row: Mapping[str, Any], same: bool = True) -> str:
    """A claims row's verdict in words: 'equivalent (no effect that matters)', 'supported by
    equivalence' for a does-not-improve claim settled so, else the verdict itself; and that
    its arms end in the same weights, when they do (`claims.py::same_weights`)."""
    if row["verdict"] == ABSENT:
        words = f"not tested: no {row['cause']} in its runs ({row['cause_per_run']})"
    elif row["verdict"] == EQUIVALENT:
        words = f"{row['verdict']} (no effect that matters)"
    elif row["basis"] == "equivalence":
        words = f"{row['verdict']} by equivalence"
    else:
        words = str(row["verdict"])
    return words + (f", {SAME_WEIGHTS}" if same and row.get("same_weights") else "")


# How a profile's weight transport and decode path read on the front page
TRANSPORT_WORDS = {"host": "pageable host memory", "pinned": "page-locked host memory",
                   "device": "GPU memory shared by CUDA IPC"}
DECODE_WORDS = {"hf": "Hugging Face's eager decoding", "static": "the static decode step",
                "graph": "decode steps captured as CUDA graphs"}


# How a priced path and the one its config would take read, by profile_mismatch term
PATH_WORDS = {"weight_transport": ("weights copied through {}", "through {}", TRANSPORT_WORDS),
              "decode_path": ("{}", "{}", DECODE_WORDS)}


def priced_condition(row: Mapping[str, Any]) -> str:
    """', as priced on paths ...': what a virtual row's time metric rests on where its runs'
    profile priced a path their config would not take (`claims.py::priced_for`), with the
    largest share of a run's seconds the clock charged to it; '' otherwise."""
    if row["clock"] == WALL_CLOCK or row.get("metric") not in CLOCK_METRICS:
        return ""
    parts = []
    for term, (priced_as, config_as, words) in PATH_WORDS.items():
        priced, config = row.get(f"priced_{term}"), row.get(f"config_{term}")
        if not priced:
            continue
        share = row.get(f"{term}_share")
        size = f"up to {share:.0%} of a run's seconds; " if share is not None else ""
        parts.append(f"{priced_as.format(words.get(priced, priced))} ({size}its config: "
                     f"{config_as.format(words.get(str(config), config))})")
    if not parts:
        return ""
    return ", as priced on paths its config would not take on those GPUs: " + " and ".join(parts)


def conditions_text(table: Sequence[Mapping[str, Any]],
                    priced: Mapping[str, Mapping[str, str | None]], model: str,
                    parameters: int | None = None) -> str:
    """A sentence per virtual clock of the table: the model that learned (and its
    `parameters`), and the machine, weight transport and decode path its profile priced
    (`priced`: clock -> the profile's `machine`, `weight_transport`, `decode_path`): a
    hybrid of the one's learning and the other's time; '' without virtual rows."""
    clocks = sorted({r["clock"] for r in table if r["clock"] != WALL_CLOCK} & set(priced))
    size = f" ({parameters:,} parameters)" if parameters else ""
    out = []
    for clock in clocks:
        p = priced[clock]
        transport = TRANSPORT_WORDS.get(p.get("weight_transport") or "")
        decode = DECODE_WORDS.get(p.get("decode_path") or "")
        paths = " and ".join(w for w in (f"weights copied through {transport}"
                                         if transport else "", decode) if w)
        how = (f"; it prices {paths}, paths a run of this config on those GPUs may not take "
               "(each run's profile_mismatch says)") if paths else ""
        out.append(f"On the emulated {_plain(clock)} the model that learned is "
                   f"{_plain(model)}{size}, its seconds priced as on "
                   f"{_plain(str(p['machine']))}: a hybrid of the one's learning and the "
                   f"other's time{_plain(how)}.")
    return "".join(f"{line}\n\n" for line in out)


def claims_findings(table: Sequence[Mapping[str, Any]]) -> str:
    """One plain sentence per claim of the claims table (what its source said, and the
    verdict on each clock it was tested on), as a list that reads the same in Markdown and
    reStructuredText: the report's front page opens with it; the rows whose arms end in the
    same weights follow in a list of their own, as checks of the method. The effects and
    intervals are the table's."""
    found: dict[tuple[str, str, str], list[str]] = {}
    checks: dict[tuple[str, str, str], list[str]] = {}
    for r in table:
        on = "this machine's clock" if r["clock"] == WALL_CLOCK else f"the emulated {r['clock']}"
        # arms that end in the same weights check the method: they could not differ
        into = checks if r.get("same_weights") else found
        into.setdefault((r["claim"], r["statement"], r["source"]), []).append(
            f"**{_plain(verdict_words(r, same=False))}** on {_plain(on)}"
            f"{_plain(priced_condition(r))}")

    def listed(rows: dict[tuple[str, str, str], list[str]]) -> str:
        return "".join(f"- **{claim}** {_plain(statement)} ({_plain(source)}): "
                       f"{'; '.join(verdicts)}.\n"
                       for (claim, statement, source), verdicts in rows.items())

    if not checks:
        return listed(found)
    return (listed(found) + f"\n{CHECKS_HEAD}\n\n" + listed(checks))


def paper_beside(table: Sequence[Mapping[str, Any]],
                 reported: Mapping[str, Mapping[str, Any]]) -> str:
    """The paper beside us, as Markdown: per claim statement, what its source reported
    (config `reported`, by claim id), the verdict on the emulated clock and on this
    machine's, and why the two settings may differ; a claim's rows share its first row's
    figure and reason."""
    virtual = sorted({r["clock"] for r in table if r["clock"] != WALL_CLOCK})
    verdicts: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for r in table:
        cells = verdicts.setdefault((r["claim"], r["statement"], r["source"]),
                                    {"live": [], "emulated": []})
        if r["clock"] == WALL_CLOCK:
            cells["live"].append(verdict_words(r))
        else:
            on = f" on {r['clock']}" if len(virtual) > 1 else ""
            cells["emulated"].append(verdict_words(r) + on + priced_condition(r))
    emulated = f"emulated ({', '.join(virtual)})" if len(virtual) == 1 else "emulated"
    lines = [f"| claim (source) | the source reported | {emulated} | this machine | why they "
             "may differ |", "|---|---|---|---|---|"]
    seen: set[str] = set()
    measured: dict[str, set[str]] = {}
    for r in table:
        measured.setdefault(r["claim"], set()).add(r["verdict"])
    for (claim, statement, source), cells in verdicts.items():
        given = dict(reported.get(claim, {})) if claim not in seen else {}
        seen.add(claim)
        # a reason that says which way ours should go is shown only where ours went so
        explains = given.get("explains")
        if explains is not None and not measured[claim] & set(explains):
            given.pop("differs", None)
        lines.append(
            f"| **{claim}** {_plain(statement)} ({_plain(source)}) | "
            f"{_plain(given.get('figure', ''))} | "
            f"{'; '.join(cells['emulated']) or 'not tested'} | "
            f"{'; '.join(cells['live']) or 'not tested'} | "
            f"{_plain(given.get('differs', ''))} |")
    return "\n".join(lines) + "\n"
