"""`rlcore bench`: what the runtime costs and what overlap it achieves, measured.

Three measurements, each on the config given (and, with `--virtual`, a fourth:
`live_vs_virtual.py::bench_virtual`, live runs against virtual runs and plans of the same
configs):
  * modes: sync, threaded async and AReaL-style run the same number of updates side by side,
    `repeats` times. The ideal speed-up of an overlapped runner over sync is
    (T_gen + T_train) / max(T_gen, T_train), from the sync run's own phase times; overlap
    efficiency = achieved speed-up / ideal, and its three factors (`overlap`): stalls
    between the roles, work done or slowed beyond sync's, and sync's own overhead.
  * floor: the sync runner's time per update against a bare sample-reward-update loop.
  * weight sync: one commit + reload through the parameter service's slots, against one
    in-memory copy of the same trainable state (under train.lora the adapters, with the
    digest published and checked on arrival), for the config's model and for a randomly
    initialised Qwen2.5-0.5B-sized model (built from its config class, nothing downloaded:
    its every weight, and under train.lora also the adapters the config gives it).
Timed on whatever else the machine is doing, so run it alone.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from typing import Any, Literal

import torch

from rlcore.algo.advantages import compute_advantages
from rlcore.clock import WALL
from rlcore.config import MODES, RunConfig
from rlcore.config.run import Mode
from rlcore.kernels import pin
from rlcore.policy.device import wait_for
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.lora import initial_adapter, targets
from rlcore.policy.sampler import Draws
from rlcore.policy.stand_in import QWEN25_05B
from rlcore.policy.train_batch import TrainBatch
from rlcore.runners import run_mode
from rlcore.runners.common import preflight
from rlcore.tasks.prompts import PromptStream
from rlcore.tasks.reward import RewardPool, evaluate_response
from rlcore.tasks.sandbox import detect_isolation
from rlcore.tasks.suites import Task


def bare_reinforce_ms(cfg: RunConfig, steps: int) -> float:
    """Mean milliseconds of one bare sample-reward-update step (after one warm-up step)."""
    tasks = preflight(cfg)
    pin(cfg)
    policy = HFPolicy(cfg.model, cfg.train, role="trainer")
    stream = PromptStream(tasks, cfg.seed)
    ro = cfg.rollout
    groups = cfg.train.update_batch_size // ro.group_size
    t0 = 0.0
    for step in range(steps + 1):
        if step == 1:
            t0 = time.perf_counter()
        prompts = [p for p in stream.take(groups) for _ in range(ro.group_size)]
        b = len(prompts)
        gens = policy.generate([policy.encode_prompt(p.task.prompt, p.task.system)
                                for p in prompts],
                               max_new_tokens=ro.max_new_tokens, temperature=ro.temperature,
                               chunk_tokens=ro.max_new_tokens,
                               draws=Draws(cfg.seed, [(step * b + i, 0) for i in range(b)]))
        rewards = [evaluate_response(policy.decode_response(g.response_ids), p.task,
                                     cfg.reward)["reward"]
                   for p, g in zip(prompts, gens, strict=True)]
        adv = compute_advantages(rewards, [str(p.group_id) for p in prompts],
                                 cfg.train.advantage_baseline, cfg.train.normalize_advantage)
        policy.update(TrainBatch([g.prompt_ids for g in gens], [g.response_ids for g in gens],
                                 [g.logprobs for g in gens], [g.versions for g in gens], adv),
                      temperature=ro.temperature, current_version=step)
    return 1000 * (time.perf_counter() - t0) / steps


def _run_one(cfg: RunConfig, mode: Mode, updates: int) -> dict[str, Any]:
    cfg = prepared(dataclasses.replace(
        cfg, mode=mode, staleness=dataclasses.replace(
            cfg.staleness, staleness_k=0 if mode == "sync" else cfg.staleness.staleness_k)),
        updates)
    with tempfile.TemporaryDirectory() as tmp:
        return run_mode(cfg, tmp)


def _mode_figures(s: dict[str, Any]) -> dict[str, Any]:
    t = s["time"]
    out = {
        "updates_per_s": s["updates"] / t["wall_s"],
        "accepted_samples_per_s": s["metrics"]["accepted_samples_per_s"],
        "generated_tokens_per_s": s["metrics"]["tokens_per_s"],
        "wall_s": t["wall_s"],
        "overlap_frac": t["overlap_frac"],
        "acceptance_rate": s["metrics"]["acceptance_rate"],
    }
    if s["mode"] != "sync":
        a = s["scheduling"]
        out.update({
            "weight_sync_per_version_s": a["weight_sync"]["per_version_s"],
            "weight_sync": a["weight_sync"],
            "controller_ms_per_sample": a["controller_ms_per_sample"],
            "waits": a["waits"],
        })
    return out


def overlap(sync: dict[str, Any], run: dict[str, Any]) -> dict[str, float]:
    """An overlapped run's speed-up over sync (two summaries), and its efficiency split into
    three factors whose product it is, exactly:

      * pipeline_efficiency: the run's busiest computing role's busy time over its wall: 1
        when rollout or trainer never waits for the other;
      * work_efficiency: updates per busy second of that role, against sync's per second of
        its longer phase: under 1 when the run does work sync does not (re-prefills, weight
        reloads) or computes slower beside the other role;
      * sync_overhead: sync's wall over its phases' sum (its time outside both phases).
    """
    s, r = sync["time"], run["time"]
    t_gen = s["rollout_busy_s"] + s["controller_busy_s"]
    longest = max(t_gen, s["trainer_busy_s"])
    ideal = (t_gen + s["trainer_busy_s"]) / longest
    ratio = (run["updates"] / r["wall_s"]) / (sync["updates"] / s["wall_s"])
    busiest = max(r["rollout_busy_s"], r["trainer_busy_s"])
    return {
        "ideal_ratio": ideal,
        "ratio_to_sync": ratio,
        "overlap_efficiency": ratio / ideal,
        "pipeline_efficiency": busiest / r["wall_s"],
        "work_efficiency": (run["updates"] / busiest) / (sync["updates"] / longest),
        "sync_overhead": s["wall_s"] / (t_gen + s["trainer_busy_s"]),
        "rollout_busy_vs_sync": r["rollout_busy_s"] / s["rollout_busy_s"],
        "trainer_busy_vs_sync": r["trainer_busy_s"] / s["trainer_busy_s"],
    }


OVERLAP_KEYS = ("ratio_to_sync", "overlap_efficiency", "pipeline_efficiency",
                "work_efficiency", "rollout_busy_vs_sync", "trainer_busy_vs_sync")


def bench_modes(cfg: RunConfig, updates: int, repeats: int) -> dict[str, Any]:
    """Each mode `repeats` times; per repetition, speed-ups are against that repetition's sync."""
    reps = []
    for _ in range(repeats):
        runs = {mode: _run_one(cfg, mode, updates) for mode in MODES}
        sync = runs["sync"]
        sync_t = sync["time"]
        rep: dict[str, Any] = {
            "sync_t_gen_s": sync_t["rollout_busy_s"] + sync_t["controller_busy_s"],
            "sync_t_train_s": sync_t["trainer_busy_s"]}
        for mode, s in runs.items():
            fig = _mode_figures(s)
            if mode != "sync":
                figures = overlap(sync, s)
                rep["ideal_ratio"] = figures.pop("ideal_ratio")
                rep["sync_overhead"] = figures.pop("sync_overhead")
                fig.update(figures)
            rep[mode] = fig
        reps.append(rep)
    summary = {key: statistics.mean(r[key] for r in reps)
               for key in ("ideal_ratio", "sync_overhead")}
    for mode in MODES:
        keys = ("updates_per_s",) if mode == "sync" else ("updates_per_s", *OVERLAP_KEYS)
        for key in keys:
            values = [r[mode][key] for r in reps]
            summary[f"{mode}/{key}"] = statistics.mean(values)
            summary[f"{mode}/{key}_min"] = min(values)
    return {"updates": updates, "repeats": repeats, "repetitions": reps, "mean": summary}


def copy_best_s(dst: list[torch.Tensor], src: list[torch.Tensor], reps: int) -> float:
    """Best-of-reps seconds of copying src into dst (one copy of a state), waiting for the
    device where dst is on a GPU."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch._foreach_copy_(dst, src)
        wait_for([dst[0].device, src[0].device])
        best = min(best, time.perf_counter() - t0)
    return best


def bench_weight_sync(params: dict[str, torch.Tensor], reps: int = 50,
                      digests: bool = False) -> dict[str, float]:
    """Best-of-reps seconds of write + commit + reload through WeightSlots vs one copy, of
    a trainable state by name as a run hands it over: with `digests` (train.lora) the
    trainer's digest of what it wrote and the reader's check of what it loaded besides.

    For a small model each step takes microseconds, and the best of a few reps still
    carries scheduler noise; 50 make the ratio repeat to about 0.05."""
    from rlcore.policy.digest import state_digest
    from rlcore.runners.asynchronous.messages import CommitRequest
    from rlcore.runners.asynchronous.param_service import ParamService
    from rlcore.runners.asynchronous.vehicles import Processes
    from rlcore.runners.asynchronous.weight_slots import WeightSlots, check_arrival

    spec = [(n, tuple(p.shape), p.dtype) for n, p in params.items()]
    slots = WeightSlots(spec, 2, Processes().locked_array(2 + 2), shared=True, digests=digests)
    service = ParamService(slots, WALL)
    source = slots.ordered(params)
    slots.write(0, source)
    slots.publish(0, 0, state_digest(params) if digests else None)
    reader = [torch.empty_like(p) for p in source]
    loaded = dict(zip((n for n, _, _ in spec), reader, strict=True))
    plain = [torch.empty_like(p) for p in params.values()]
    one_copy = copy_best_s(plain, [p.detach() for p in params.values()], reps)
    steps = ("write_s", "digest_s", "commit_s", "reload_s", "check_s")
    best = dict.fromkeys(steps, float("inf"))
    slot = 1
    for _ in range(reps):
        t0 = time.perf_counter()
        slots.write(slot, source)
        t1 = time.perf_counter()
        digest = state_digest(params) if digests else None
        t2 = time.perf_counter()
        ack = service.commit(CommitRequest(0, 0, slot, slots.version(), True, t_sent=t2,
                                           digest=digest))
        t3 = time.perf_counter()
        version = slots.read_into(reader)
        t4 = time.perf_counter()
        check_arrival(slots, version, loaded, "bench")
        t5 = time.perf_counter()
        slot = ack.next_slot
        digest_s, check_s = (t2 - t1, t5 - t4) if digests else (0.0, 0.0)
        for key, v in zip(steps, (t1 - t0, digest_s, t3 - t2, t4 - t3, check_s), strict=True):
            best[key] = min(best[key], v)
    per_version = sum(best.values())
    return {**best, "per_version_s": per_version, "one_copy_s": one_copy,
            "ratio_to_one_copy": per_version / one_copy,
            "bytes": sum(p.numel() * p.element_size() for p in params.values())}


def trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight that trains under full fine-tuning, by name."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def qwen05b_sized_model() -> torch.nn.Module:
    """A randomly initialised model with Qwen2.5-0.5B's shapes (about 494M parameters)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B))


def bench(cfg: RunConfig, updates: int, repeats: int, floor_steps: int,
          qwen_weight_sync: bool) -> dict[str, Any]:
    """All figures of `rlcore bench` as one JSON-ready dict."""
    pin(cfg)
    floor = bare_reinforce_ms(cfg, floor_steps)
    out: dict[str, Any] = {"config": {"model": cfg.model.path, "updates": updates,
                                      "update_batch_size": cfg.train.update_batch_size,
                                      "staleness_k": cfg.staleness.staleness_k,
                                      "staleness_control": cfg.staleness.staleness_control,
                                      "interrupt": cfg.staleness.interrupt,
                                      "threads_per_role": cfg.runtime.threads_per_role}}
    out["modes"] = bench_modes(cfg, updates, repeats)
    sync_ms = 1000 / out["modes"]["mean"]["sync/updates_per_s"]
    out["floor"] = {"bare_step_ms": floor, "sync_step_ms": sync_ms,
                    "sync_overhead_ratio": sync_ms / floor}
    policy = HFPolicy(cfg.model, cfg.train, role="trainer", device=torch.device("cpu"))
    lora = cfg.train.lora
    out["weight_sync"] = {"config_model": bench_weight_sync(
        {n: t.detach() for n, t in policy.state_tensors().items()}, digests=lora is not None)}
    if qwen_weight_sync:
        model = qwen05b_sized_model()
        sizes = out["weight_sync"]["qwen2.5-0.5b-sized"] = {
            "full": bench_weight_sync(trainable(model), 3)}
        if lora is not None:  # the adapters the config's train.lora gives that model
            sizes[f"lora_rank_{lora.rank}"] = bench_weight_sync(
                initial_adapter(targets(model, lora), lora.rank), 10, digests=True)
    return out


def bench_replay(cfg: RunConfig, updates: int, repeats: int) -> dict[str, Any]:
    """A live run of cfg and its verification replay, `repeats` times, interleaved: the
    measured wall of each (the clock starts once the workers are loaded, in both) and the
    whole call (loads and record writing included), with medians and spread."""
    from rlcore.replay.replayer import replay_run

    cfg = prepared(cfg, updates)
    reps = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            live = run_mode(cfg, f"{tmp}/live")
            t1 = time.perf_counter()
            replay = replay_run(f"{tmp}/live", f"{tmp}/replay")
            t2 = time.perf_counter()
        reps.append({"live_wall_s": live["time"]["wall_s"],
                     "replay_wall_s": replay["time"]["wall_s"],
                     "live_call_s": t1 - t0, "replay_call_s": t2 - t1,
                     "wall_ratio": replay["time"]["wall_s"] / live["time"]["wall_s"],
                     "call_ratio": (t2 - t1) / (t1 - t0)})
    spread = {k: {"median": statistics.median(r[k] for r in reps),
                  "min": min(r[k] for r in reps), "max": max(r[k] for r in reps)}
              for k in reps[0]}
    return {"mode": cfg.mode, "staleness_k": cfg.staleness.staleness_k, "updates": updates,
            "repeats": repeats, "repetitions": reps, "spread": spread}


def bench_sandbox(cfg: RunConfig, evaluations: int) -> dict[str, Any]:
    """Sandboxed evaluations per second for a trivial correct solution, through the reward
    pool as a run uses it (cfg.reward.workers at once)."""
    task = Task(task_id="bench", prompt="inc", entry_point="inc",
                tests=["assert inc(1) == 2", "assert inc(-1) == 0"])
    response = "```python\ndef inc(x):\n    return x + 1\n```"
    iso = detect_isolation(cfg.reward)
    pool = RewardPool(cfg.reward)
    try:
        pool.map([(response, task)] * cfg.reward.workers)  # warm: threads and the probe
        t0 = time.perf_counter()
        results = pool.map([(response, task)] * evaluations)
        elapsed = time.perf_counter() - t0
    finally:
        pool.close()
    return {"evaluations": evaluations, "workers": cfg.reward.workers,
            "passed": sum(r["pass"] for r in results), "seconds": elapsed,
            "evaluations_per_s": evaluations / elapsed, "isolation": iso.describe()}


def verifier_answers(n: int, start: int = 0) -> list[tuple[str, Task]]:
    """n (response, task) pairs, each task with a gold of its own (integers, decimals,
    fractions, roots; distinct for distinct `start`), the response in one of the forms a
    model writes (prose, boxed, LaTeX), every fifth one wrong."""
    pairs = []
    for i in range(start, start + n):
        a, b = 3 + i, 7 + 2 * (i % 13)
        gold, forms = [
            (f"{a * b}", [f"so {a} * {b} = {a * b:,} in all", f"\\boxed{{{a * b}}}"]),
            (f"{a}.{b}", [f"It is {a}.{b} metres.", f"\\boxed{{{a}.{b}}}"]),
            (f"\\frac{{{a}}}{{{b}}}", [f"{a}/{b}", f"$\\boxed{{\\dfrac{{{a}}}{{{b}}}}}$"]),
            (f"{a}\\sqrt{{{b}}}", [f"\\boxed{{\\sqrt{{{a * a * b}}}}}", f"${a}\\sqrt{{{b}}}$"]),
        ][i % 4]
        response = forms[i // 4 % 2] if i % 5 else f"the answer is {a + b}"
        pairs.append((response, Task(task_id=f"v{i}", prompt=f"q{i}", answer=gold)))
    return pairs


def bench_verifiers(cfg: RunConfig, answers: int, repeats: int) -> dict[str, Any]:
    """Answers judged per second by each answer verifier, through the reward pool as a run
    uses it (math: cfg.reward.workers worker processes), `repeats` rounds with the verifiers
    interleaved. Cold: each gold new to math-verify's workers (parsed, then the response);
    warm: the same answers again (golds already parsed), as when a run meets a task again."""
    verifiers: tuple[Literal["last_integer", "exact", "math"], ...] = (
        "last_integer", "exact", "math")
    rates: dict[str, dict[str, list[float]]] = {v: {"cold": [], "warm": []} for v in verifiers}
    passed: dict[str, int] = {}
    for r in range(repeats):
        pairs = verifier_answers(answers, start=r * answers)  # new golds every round
        for v in verifiers:
            reward_cfg = dataclasses.replace(cfg.reward, verifier=v)
            pool = RewardPool(reward_cfg)
            try:
                # start the workers (math-verify's imports) outside the timing
                pool.map([("1", Task(task_id="w", prompt="w", answer="1"))] * reward_cfg.workers)
                for phase in ("cold", "warm"):
                    t0 = time.perf_counter()
                    results = pool.map(pairs)
                    rates[v][phase].append(answers / (time.perf_counter() - t0))
                passed[v] = sum(res["pass"] for res in results)
            finally:
                pool.close()
    return {"answers": answers, "repeats": repeats, "workers": cfg.reward.workers,
            "passed_of_answers": passed,
            "answers_per_s": {v: {phase: spread(x) for phase, x in p.items()}
                              for v, p in rates.items()}}


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def prepared(cfg: RunConfig, updates: int,
             clock: Literal["wall", "virtual"] | None = None) -> RunConfig:
    """`cfg` as a measured run: `updates` updates, no progress lines, no saved policy, on
    `clock` (None: the config's own)."""
    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, updates=updates),
        runtime=dataclasses.replace(cfg.runtime, progress_every=0, save_policy=False,
                                    clock=clock or cfg.runtime.clock))
