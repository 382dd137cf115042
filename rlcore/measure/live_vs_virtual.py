"""Live runs against virtual runs and plans of the same configs: `rlcore bench --virtual`
(`bench_virtual`) and the pieces `rlcore fidelity` shares with it (`fidelity.py`)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rlcore.config import RunConfig
from rlcore.measure.bench import prepared, spread
from rlcore.runners import run_mode


def timed_run(cfg: RunConfig, out: str | Path) -> tuple[dict[str, Any], float]:
    """Run `cfg` into `out`: its timing figures (`rlcore/record/timing.py`) and the seconds
    the call took."""
    from rlcore.record.timing import run_timing

    t0 = time.perf_counter()
    summary = run_mode(cfg, out, force=True)
    elapsed = time.perf_counter() - t0
    staleness = json.loads((Path(out) / "staleness.json").read_text())
    return run_timing(summary, staleness), elapsed


def against_live(live: list[dict[str, Any]], live_call_s: list[float],
                 virtual: dict[str, Any], virtual_call_s: list[float],
                 plan: dict[str, Any]) -> dict[str, Any]:
    """One config's live figures (medians and spread), its virtual run's and plan's, and
    how far each is from live; the call-time ratios pair the calls in order, or compare a
    single virtual call with each live one."""
    from rlcore.record.timing import TIMING_KEYS, total_variation

    pairs = (zip(virtual_call_s, live_call_s, strict=True) if len(virtual_call_s) > 1
             else [(virtual_call_s[0], lv) for lv in live_call_s])
    entry: dict[str, Any] = {
        "live": {k: spread([f[k] for f in live]) for k in TIMING_KEYS},
        "virtual": {k: virtual[k] for k in TIMING_KEYS},
        "plan": {k: plan[k] for k in TIMING_KEYS},
        "plan_s": plan["plan_s"],
        "staleness": {"live": [f["staleness"] for f in live],
                      "virtual": virtual["staleness"], "plan": plan["staleness"]},
        "staleness_tv": {
            "virtual_vs_live": spread([total_variation(virtual["staleness"], f["staleness"])
                                       for f in live]),
            "plan_vs_live": spread([total_variation(plan["staleness"], f["staleness"])
                                    for f in live]),
            "live_vs_live": spread([total_variation(a["staleness"], b["staleness"])
                                    for i, a in enumerate(live) for b in live[i + 1:]]
                                   or [0.0])},
        "cost": {"live_call_s": spread(live_call_s),
                 "virtual_call_s": spread(virtual_call_s),
                 "ratio": spread([v / lv for v, lv in pairs])}}
    for source in ("virtual", "plan"):
        med = entry["live"]
        entry[f"{source}_error"] = {
            "updates_per_s_rel": entry[source]["updates_per_s"]
            / med["updates_per_s"]["median"] - 1,
            "accepted_samples_per_s_rel": entry[source]["accepted_samples_per_s"]
            / med["accepted_samples_per_s"]["median"] - 1,
            "stale_drop_rate_abs": entry[source]["stale_drop_rate"]
            - med["stale_drop_rate"]["median"],
            "wasted_token_share_abs": entry[source]["wasted_token_share"]
            - med["wasted_token_share"]["median"]}
    return entry


def planned(cfg: RunConfig, virtual_dir: str | Path) -> dict[str, Any]:
    """The plan of `cfg` on its profile, drawing response lengths from its virtual run's
    samples (`plan/lengths.py::empirical`)."""
    from rlcore.plan.lengths import empirical
    from rlcore.plan.planner import plan, workload

    return plan(cfg, workload(cfg, empirical(virtual_dir)))


def bench_virtual(cfgs: list[tuple[str, RunConfig]], updates: int, repeats: int
                  ) -> dict[str, Any]:
    """Each config live and under the virtual clock, `repeats` times, interleaved, then its
    plan: how far the virtual clock and the planner are from this machine (timing figures,
    `rlcore/record/timing.py`; live medians), and what a virtual run costs in wall time.

    The virtual run is a function of its config, so its figures are those of any
    repetition; it is repeated for its wall time only. The plan draws its response lengths
    from the virtual run's samples (`plan/lengths.py::empirical`)."""
    runs: dict[str, dict[str, list[Any]]] = {
        label: {"live": [], "live_call_s": [], "virtual_call_s": []} for label, _ in cfgs}
    virtual: dict[str, dict[str, Any]] = {}
    out: dict[str, Any] = {"updates": updates, "repeats": repeats,
                           "hardware": cfgs[0][1].runtime.hardware, "configs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for label, cfg in cfgs:
                fig, call_s = timed_run(prepared(cfg, updates, "wall"), f"{tmp}/live")
                runs[label]["live"].append(fig)
                runs[label]["live_call_s"].append(call_s)
                fig, call_s = timed_run(prepared(cfg, updates, "virtual"),
                                        f"{tmp}/virtual-{label}")
                virtual[label] = fig
                runs[label]["virtual_call_s"].append(call_s)
        for label, cfg in cfgs:
            r = runs[label]
            out["configs"][label] = against_live(
                r["live"], r["live_call_s"], virtual[label], r["virtual_call_s"],
                planned(prepared(cfg, updates, "virtual"), f"{tmp}/virtual-{label}"))
    return out
