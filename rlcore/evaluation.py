"""Held-out evaluation of a policy: greedy and sampled pass rates (`rlcore eval`)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rlcore.config import ConfigError, RunConfig, config_from_dict
from rlcore.kernels import pin
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.lora import is_adapter_dir
from rlcore.policy.sampler import Draws
from rlcore.record.live_metrics import TB_DIR, LiveMetrics, eval_scalars
from rlcore.record.rundir import atomic_write_json, is_complete
from rlcore.tasks.reward import evaluate_response
from rlcore.tasks.suites import Task, load_suite

EVAL_SEED = 12345  # sampling seed of held-out evaluation, the same for every run


def evaluate_policy(policy: HFPolicy, tasks: list[Task], cfg: RunConfig, seed: int
                    ) -> dict[str, Any]:
    """Pass rates on `tasks`: greedy (one response each) and sampled (samples_per_task each)."""
    start = time.perf_counter()
    ev, ro = cfg.eval, cfg.rollout
    prompts = [policy.encode_prompt(t.prompt, t.system) for t in tasks]
    greedy_pass = 0
    sampled_pass = 0
    per_task = []
    verify_errors = 0  # math answers with no verdict within reward.timeout_sec (scored 0)
    lengths: Counter[int] = Counter()  # sampled response lengths, tokens (stop included)
    for lo in range(0, len(tasks), ev.batch_size):
        chunk, ids = tasks[lo : lo + ev.batch_size], prompts[lo : lo + ev.batch_size]
        greedy = policy.greedy(ids, ro.max_new_tokens)
        repeated = [p for p in ids for _ in range(ev.samples_per_task)]
        # Sample j of held-out task i draws as slot i * samples_per_task + j, attempt 0.
        keys = [((lo + i) * ev.samples_per_task + j, 0)
                for i in range(len(chunk)) for j in range(ev.samples_per_task)]
        sampled = policy.generate(repeated, max_new_tokens=ro.max_new_tokens,
                                  temperature=ro.temperature, chunk_tokens=ro.max_new_tokens,
                                  draws=Draws(seed, keys))
        lengths.update(len(s.response_ids) for s in sampled)
        for i, task in enumerate(chunk):
            results = [evaluate_response(policy.decode_response(ids), task, cfg.reward)
                       for ids in [greedy[i], *(s.response_ids for s in sampled[
                           i * ev.samples_per_task : (i + 1) * ev.samples_per_task])]]
            verify_errors += sum("verify_error" in r for r in results)
            g_ok = results[0]["pass"]
            s_ok = sum(r["pass"] for r in results[1:])
            greedy_pass += g_ok
            sampled_pass += s_ok
            per_task.append({"task_id": task.task_id, "greedy_pass": bool(g_ok),
                             "sampled_passes": int(s_ok)})
    n = len(tasks)
    return {
        "tasks": n,
        "samples_per_task": ev.samples_per_task,
        "greedy_pass_rate": greedy_pass / n,
        "sampled_pass_rate": sampled_pass / (n * ev.samples_per_task),
        "eval_s": time.perf_counter() - start,
        "sampled_lengths": {str(k): lengths[k] for k in sorted(lengths)},
        "verify_errors": verify_errors,
        "per_task": per_task,
    }


def run_config_of(run_dir: Path) -> RunConfig:
    """The resolved config a run recorded in its config.json."""
    cfg_file = run_dir / "config.json"
    if not is_complete(run_dir) or not cfg_file.is_file():
        raise ConfigError(f"'{run_dir}' is not a complete run directory (no summary.json); "
                          "run `rlcore run CONFIG --out DIR` first")
    return config_from_dict(json.loads(cfg_file.read_text())["config"])


def evaluate_run(run_dir: Path, weights: str = "final", seed: int = EVAL_SEED
                 ) -> tuple[dict[str, Any], Path]:
    """Score a run's final weights (-> eval.json) or its base model (-> eval_base.json) on
    the held-out split with the run's own settings; returns the result and the file. The
    file's `policy` field names which (its name from before `--weights`)."""
    cfg = run_config_of(run_dir)
    saved = run_dir / "policy"
    adapter = weights == "final" and is_adapter_dir(saved)  # train.lora: on the run's base
    if weights == "final" and not adapter:
        if not (saved / "config.json").is_file():
            raise ConfigError(f"'{run_dir}' saved no final policy (runtime.save_policy was "
                              "false); rerun with runtime.save_policy: true")
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(saved)))
    pin(cfg)
    model = HFPolicy(cfg.model, cfg.train, role="rollout")
    if adapter:
        model.load_adapter(saved)
    heldout = load_suite(cfg.task).split("heldout")[: cfg.eval.heldout_tasks]
    result: dict[str, Any] = {"policy": weights, "model_path": cfg.model.path,
                              **evaluate_policy(model, heldout, cfg, seed=seed)}
    out = run_dir / ("eval.json" if weights == "final" else "eval_base.json")
    atomic_write_json(out, result)
    if weights == "final" and cfg.runtime.tensorboard:  # beside the run's curves, at its end
        summary = json.loads((run_dir / "summary.json").read_text())
        live = LiveMetrics(run_dir / TB_DIR)
        live.write(eval_scalars(result), step=summary["updates"], walltime=time.time())
        live.close()
    return result, out


def eval_line(run_dir: Path, weights: str, result: dict[str, Any], out: Path) -> str:
    """What an evaluation prints: pass rates, and for the final weights the run's state digest
    and the kernels it computed with, so two runs' lines say whether their weights agree."""
    line = (f"{weights} weights on {result['tasks']} held-out tasks: greedy pass "
            f"{result['greedy_pass_rate']:.3f}, sampled pass {result['sampled_pass_rate']:.3f}")
    if weights == "final":
        rep = json.loads((run_dir / "summary.json").read_text())["reproducibility"]
        env = rep["environment"]  # runs before runtime.kernels recorded none
        line += (f" | state {rep['state_digest'][:19]} on {env.get('kernels', 'unrecorded')} "
                 f"kernels ({env.get('cpu_capability', '?')})")
    return f"{line} -> {out}"
