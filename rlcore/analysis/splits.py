"""The split study (config/split.yaml): each split of a machine's devices into rollout
workers and trainer ranks, measured beside the planner's prediction for it, the planner's
pick against the best measured split, and sync on as many devices.

An arm is one grid point without its seed. Its devices are R + M for AReaL-style (R rollout
workers and M trainer ranks, a device each) and M for sync (`runtime.trainer_ranks`: sync on
M devices). The splits compared are the AReaL-style arms of one clock, K and device count;
on this machine's clock every layout shares the same cores, so they are compared whatever
their count, against the clock's sync arm.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlcore.analysis.tables import clock_order
from rlcore.record.identity import WALL_CLOCK

ArmKey = tuple[str, str, str, int]  # clock, mode, preset, K


def devices(row: Mapping[str, Any]) -> int:
    """The devices a run used: R + M for AReaL-style, M for sync."""
    r, m = int(row["rollout_workers"]), int(row["trainer_ranks"])
    return m if row["mode"] == "sync" else r + m


def split_label(row: Mapping[str, Any]) -> str:
    """'R+M' (rollout workers + trainer ranks), or 'sync on N'."""
    if row["mode"] == "sync":
        return f"sync on {devices(row)}"
    return f"{row['rollout_workers']}+{row['trainer_ranks']}"


def arms(rows: Iterable[Mapping[str, Any]], planned: Mapping[ArmKey, float]
         ) -> list[dict[str, Any]]:
    """One row per arm (pg runs of the sync and AReaL-style modes): its split, the measured
    updates/s over its seeds (mean, least, most), and the plan's with its error."""
    by_arm: dict[ArmKey, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r["mode"] in ("sync", "areal") and r["objective"] == "pg" \
                and r.get("replayed") is None:
            by_arm.setdefault((r["clock"], r["mode"], r["preset"], int(r["staleness_k"])),
                              []).append(r)
    out = []
    for key, members in by_arm.items():
        rates = [float(m["updates_per_s"]) for m in members]
        mean = statistics.fmean(rates)
        plan = planned.get(key)
        first = members[0]
        out.append({
            "clock": key[0], "mode": key[1], "preset": key[2], "staleness_k": key[3],
            "devices": devices(first), "split": split_label(first),
            "rollout_workers": int(first["rollout_workers"]),
            "trainer_ranks": int(first["trainer_ranks"]),
            "seeds": len(rates), "updates_per_s": mean,
            "updates_per_s_min": min(rates), "updates_per_s_max": max(rates),
            "planned_updates_per_s": plan,
            "plan_error": plan / mean - 1 if plan is not None and mean else None,
        })
    return sorted(out, key=arm_order)


def arm_order(a: Mapping[str, Any]) -> tuple[Any, ...]:
    """Clocks as the tables order them, then devices, K, and sync first, then R."""
    return (clock_order(a["clock"]), a["clock"], a["devices"] if a["clock"] != WALL_CLOCK
            else 0, a["staleness_k"], a["mode"] != "sync", a["rollout_workers"],
            a["trainer_ranks"])


def group_of(arm: Mapping[str, Any]) -> tuple[str, int, int | None]:
    """The splits an AReaL-style arm is compared with: same clock, K and device count (any
    count on the wall clock)."""
    return (arm["clock"], arm["staleness_k"],
            None if arm["clock"] == WALL_CLOCK else arm["devices"])


def groups(table: Sequence[Mapping[str, Any]], within: float) -> list[dict[str, Any]]:
    """Per group of splits: the plan's pick (the most planned updates/s, the fewer ranks on a
    tie, as `rlcore plan --gpus` picks), the best measured split, the pick's measured
    throughput as a share of the best's and whether it is within `within` of it, and sync
    on as many devices (the clock's sync on the wall clock) with each split's gain over it."""
    out = []
    found: dict[tuple[str, int, int | None], list[Mapping[str, Any]]] = {}
    for a in table:
        if a["mode"] == "areal":
            found.setdefault(group_of(a), []).append(a)
    for (clock, k, n), members in found.items():
        syncs = [a for a in table if a["mode"] == "sync" and a["clock"] == clock
                 and (n is None or a["devices"] == n)]
        sync = syncs[0] if len(syncs) == 1 else None
        best = max(members, key=lambda a: a["updates_per_s"])
        planned = [a for a in members if a["planned_updates_per_s"] is not None]
        pick = max(planned, key=lambda a: (a["planned_updates_per_s"], -a["trainer_ranks"]),
                   default=None)
        share = pick["updates_per_s"] / best["updates_per_s"] if pick is not None else None
        out.append({
            "clock": clock, "staleness_k": k, "devices": n, "splits": len(members),
            "pick": pick["split"] if pick else None, "best": best["split"],
            "pick_share_of_best": share,
            "pick_within": share >= 1 - within if share is not None else None,
            "sync": sync["split"] if sync else None,
            "sync_updates_per_s": sync["updates_per_s"] if sync else None,
            "best_gain_over_sync": best["updates_per_s"] / sync["updates_per_s"]
            if sync else None,
            "pick_gain_over_sync": pick["updates_per_s"] / sync["updates_per_s"]
            if sync and pick else None,
        })
    return sorted(out, key=lambda g: (clock_order(g["clock"]), g["clock"], g["devices"] or 0,
                                      g["staleness_k"]))


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def markdown(table: Sequence[Mapping[str, Any]], grouped: Sequence[Mapping[str, Any]],
             within: float) -> str:
    """The groups' verdicts, then every arm measured beside its plan."""
    lines = [f"### The plan's pick against the best split (within {100 * within:g} %)", "",
             "| clock | devices | K | splits | pick | best | pick / best | within | "
             "sync | best / sync | pick / sync |", "|" + "---|" * 11]
    for g in grouped:
        within_cell = {True: "yes", False: "**no**", None: "-"}[g["pick_within"]]
        lines.append(
            f"| {g['clock']} | {g['devices'] or 'this host'} | {g['staleness_k']} | "
            f"{g['splits']} | {g['pick'] or '-'} | {g['best']} | "
            f"{_num(g['pick_share_of_best'], 3)} | {within_cell} | {g['sync'] or '-'} | "
            f"{_num(g['best_gain_over_sync'])} | {_num(g['pick_gain_over_sync'])} |")
    lines += ["", "### Every arm, measured and planned (updates/s)", "",
              "| clock | devices | K | split | preset | seeds | measured (least-most) | "
              "planned | plan error |", "|" + "---|" * 9]
    for a in table:
        lines.append(
            f"| {a['clock']} | {a['devices']} | {a['staleness_k']} | {a['split']} | "
            f"{a['preset']} | {a['seeds']} | {_num(a['updates_per_s'])} "
            f"({_num(a['updates_per_s_min'])}-{_num(a['updates_per_s_max'])}) | "
            f"{_num(a['planned_updates_per_s'])} | {_pct(a['plan_error'])} |")
    return "\n".join(lines) + "\n"
