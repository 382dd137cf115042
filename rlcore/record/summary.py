"""summary.json and staleness.json of a finished run, derived from its ledger (ledger.py).

Pure derivations: nothing here records anything; every number comes from a frozen snapshot of
the ledger's rows, spans and counts, in the vocabulary of `docs/metrics.md`. A virtual run's
`profile_mismatch` comes from its config, its profile and its model's config file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig

from rlcore.algo import metrics
from rlcore.clock.profile import HardwareProfile
from rlcore.config import ConfigError, RunConfig
from rlcore.kernels import cpu_name, in_force
from rlcore.policy.decoders import config_unsupported, decode_for
from rlcore.policy.device import resolve_device, resolve_transport
from rlcore.policy.model_dir import check_model_dir

SAMPLE_STATUSES = ("accepted", "dropped_stale", "dropped_interrupted")


@dataclass(frozen=True)
class LedgerSnapshot:
    """What a finished run's ledger holds, as the summary reads it."""

    cfg: RunConfig
    samples: Sequence[dict[str, Any]]  # samples.jsonl rows
    updates: Sequence[dict[str, Any]]  # updates.jsonl rows
    tokens: Mapping[str, int]  # the samplers' token counts: sampled, reprefilled, ...
    event_counts: Mapping[str, int]  # events by kind: resubmission, update_skipped, ...
    skipped_steps: int  # optimizer steps the fp16 loss scaler skipped, in every update
    reload_s: Sequence[float]  # each weight reload of a rollout worker
    token_staleness: Mapping[str, Sequence[int]]  # per-token staleness, by sample status
    startup_s: float  # the job's start-up before the run began
    started_unix: float  # when the job began, epoch seconds of this machine's clock
    job_s: float  # this machine's seconds from the job's start to now, whatever the run's clock
    spans: Mapping[str, Sequence[tuple[float, float]]]  # busy spans per role, merged
    busy_s: Mapping[str, float]  # busy seconds per role, untraced handler time included


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def build_summary(led: LedgerSnapshot, *, wall_s: float, cold_start_s: float,
                  waits: dict[str, float], placement: dict[str, Any], load: dict[str, Any],
                  weight_transport: str, rollout_dtype: str, weight_bytes: int
                  ) -> dict[str, Any]:
    """summary.json of a finished run, from the ledger's rows, spans and counts.

    `tokens.generated` is counted by the samplers themselves, so the token ledger
    generated = trained + stale_dropped + interrupted + untrained is a real check.
    """
    cfg, samples, updates = led.cfg, led.samples, led.updates
    trained_ids = {i for u in updates for i in u["sample_ids"]}
    by_status = {s: [r for r in samples if r["status"] == s] for s in SAMPLE_STATUSES}
    accepted = by_status["accepted"]
    trained = [r for r in accepted if r["sample_id"] in trained_ids]
    untrained = [r for r in accepted if r["sample_id"] not in trained_ids]
    generated = led.tokens["sampled"]
    # The paper's Listing 1: a dropped row's reward is 0; so is an untrained sample's.
    trained_reward = sum(r["reward"] for r in trained)
    pass_curve = [u["pass_rate"] for u in updates]
    emitted = len(samples) - len(by_status["dropped_interrupted"])
    rollout, trainer = led.spans["rollout"], led.spans["trainer"]

    def per_s(n: float) -> float:
        return n / wall_s if wall_s else 0.0

    write = _mean([u["time/weight_write_s"] for u in updates])
    commit = _mean([u["time/commit_latency_s"] for u in updates])
    reload = _mean(led.reload_s)
    return {
        "schema_version": 1,
        "mode": cfg.mode,
        "objective": cfg.train.objective,
        "staleness_k": cfg.staleness.staleness_k,
        "seed": cfg.seed,
        "updates": len(updates),
        "policy_version": updates[-1]["version"] if updates else 0,
        "samples": {
            "generated": len(samples),
            "accepted": len(accepted),
            "trained": len(trained),
            "dropped_stale": len(by_status["dropped_stale"]),
            "dropped_interrupted": len(by_status["dropped_interrupted"]),
            "resubmissions": led.event_counts["resubmission"],
        },
        "tokens": {
            "generated": generated,
            "trained": sum(r["response_tokens"] for r in trained),
            "stale_dropped": sum(r["response_tokens"] for r in by_status["dropped_stale"]),
            "interrupted": led.tokens["interrupted"],
            "untrained": sum(r["response_tokens"] for r in untrained)
            + led.tokens["abandoned"],
            "reprefilled": led.tokens["reprefilled"],
            "kv_kept": led.tokens["kv_kept"],
        },
        "time": {
            "wall_s": wall_s,
            "cold_start_s": cold_start_s,
            "startup_s": led.startup_s,
            "job_s": led.job_s,
            "started_unix": led.started_unix,
            "rollout_busy_s": led.busy_s["rollout"],
            "controller_busy_s": led.busy_s["controller"],
            "trainer_busy_s": led.busy_s["trainer"],
            "overlap_frac": min(1.0, per_s(metrics.overlap_seconds(rollout, trainer))),
        },
        "metrics": {
            "train_pass_rate": sum(r["pass"] for r in trained) / max(len(trained), 1),
            "train_pass_rate_final": metrics.moving_average(pass_curve, cfg.eval.window)[-1]
            if pass_curve else 0.0,
            "reward_per_1k_tokens": metrics.reward_per_1k_tokens(trained_reward, generated),
            "threshold": cfg.eval.threshold,
            "steps_to_threshold": metrics.steps_to_threshold(pass_curve, cfg.eval.threshold,
                                                             cfg.eval.window),
            "time_to_threshold_s": metrics.time_to_threshold(
                [u["t_commit"] for u in updates], pass_curve, cfg.eval.threshold,
                cfg.eval.window),
            "samples_per_s": per_s(len(samples)),
            "accepted_samples_per_s": per_s(len(accepted)),
            "tokens_per_s": per_s(generated),
            "acceptance_rate": len(accepted) / emitted if emitted else 0.0,
        },
        "reward": {
            "harness_errors": sum("harness_error" in r for r in samples),
            # math answers that got no verdict within reward.timeout_sec (scored 0)
            "verify_errors": sum("verify_error" in r for r in samples),
        },
        "staleness": {
            "mean_accepted": sum(r["staleness"] for r in accepted) / max(len(accepted), 1),
            "max_accepted": max((r["staleness"] for r in accepted), default=0),
        },
        "scheduling": {
            "skipped_commits": led.event_counts["update_skipped"],
            "skipped_steps": led.skipped_steps,
            "waits": waits,
            "controller_ms_per_sample": 1000 * led.busy_s["controller"] / max(len(samples), 1),
            "weight_sync": {"transport": weight_transport, "rollout_dtype": rollout_dtype,
                            "bytes_per_version": weight_bytes, "write_s": write,
                            "commit_latency_s": commit, "reload_s": reload,
                            "per_version_s": write + commit + reload,
                            "reloads": len(led.reload_s)},
            "placement": placement,
        },
        "load": load,
    }


def reproducibility(state_digest: str, cfg: RunConfig, devices: dict[str, str], *,
                    schedule_digest: str, replay: dict[str, Any] | None) -> dict[str, Any]:
    """The final trainable state's digest, the schedule's, and what bit-exact reproduction
    depends on: the torch build, the threads each role computes with, the devices, the
    determinism flags, the CPU and its kernels; for a replay, what it replayed."""
    import torch  # local: this module is read by analysis-only code too

    kernels = in_force()
    return {
        "state_digest": state_digest,
        "schedule_digest": schedule_digest,
        "replay": replay,
        "environment": {
            "torch": torch.__version__,
            "threads_per_role": cfg.runtime.threads_per_role,
            "kernels": cfg.runtime.kernels,
            "cpu_capability": kernels["torch_cpu_capability"],
            "mkl_cbwr": kernels["mkl_cbwr"],
            "cpu": cpu_name(),
            "devices": devices,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
        },
    }


def staleness_stats(led: LedgerSnapshot) -> dict[str, Any]:
    """staleness.json: histograms per sample (accepted, dropped as stale) and per token
    (of trained samples at their update's base version, and of stale-dropped ones)."""
    return {
        "per_sample": {
            status: metrics.histogram(r["staleness"] for r in led.samples
                                      if r["status"] == status)
            for status in ("accepted", "dropped_stale")
        },
        "per_token": {k: metrics.histogram(v) for k, v in led.token_staleness.items()},
    }


# --- what a virtual run's profile priced, against what its config would take ---------------

def profile_mismatch(cfg: RunConfig, profile: HardwareProfile | None
                     ) -> dict[str, dict[str, str]] | None:
    """summary.json's `profile_mismatch`: {term: {"priced", "config"}} for each of the decode
    path and (not in sync, which copies none) the weight transport that `cfg` would take
    otherwise than `profile` priced, on the profile's kind of device; None without a profile."""
    if profile is None:
        return None
    out: dict[str, dict[str, str]] = {}
    decoding = "trainer" if cfg.mode == "sync" else "rollout"  # sync samples on the trainer
    if profile.decode_path is not None:
        would = decode_path_on(cfg, _device_type(cfg, decoding, profile.device_type))
        if would != profile.decode_path:
            out["decode_path"] = {"priced": profile.decode_path, "config": would}
    if profile.weight_transport is not None and cfg.mode != "sync":
        would = transport_on(cfg.runtime.weight_transport,
                             _device_type(cfg, "rollout", profile.device_type))
        if would != profile.weight_transport:
            out["weight_transport"] = {"priced": profile.weight_transport, "config": would}
    return out


def mismatch_warning(profile: HardwareProfile, mismatch: dict[str, dict[str, str]]) -> str:
    """The one line that says what a non-empty `profile_mismatch` found."""
    label = {"decode_path": "decode path", "weight_transport": "weight transport"}
    priced = " and ".join(f"{label[k]} {v['priced']}" for k, v in mismatch.items())
    would = " and ".join(f"{label[k]} {v['config']}" for k, v in mismatch.items())
    on = f" on its {profile.device_type} devices" if profile.device_type else ""
    return (f"warning: hardware profile {profile.name} prices {priced}, where this config "
            f"would take {would}{on}: the virtual seconds are those of the profile's "
            "(profile_mismatch)")


def _device_type(cfg: RunConfig, role: str, priced: str | None) -> str:
    """The kind of device `role` would compute on where the profile's costs hold: `auto` is
    the profile's kind (this machine's where it does not say), a named device its own."""
    spec = cfg.model.trainer_device if role == "trainer" else cfg.model.rollout_device
    if spec != "auto":
        return torch.device(spec).type
    return priced if priced is not None else resolve_device(spec, role).type


def transport_on(setting: str, device_type: str) -> str:
    """`runtime.weight_transport` for a rollout on a device of `device_type`, as the runtime
    resolves it (`resolve_transport`); a setting the device cannot take stays as set."""
    try:
        return resolve_transport(setting, torch.device(device_type))
    except ConfigError:
        return setting


def decode_path_on(cfg: RunConfig, device_type: str) -> str:
    """`model.decode` for `cfg`'s model on a device of `device_type`, as a policy resolves it
    (`resolve_decode`), from the model's config file alone; a setting refused there stays as
    set."""
    config = AutoConfig.from_pretrained(str(check_model_dir(cfg.model.path)),
                                        attn_implementation=cfg.model.attn_implementation)
    why = config_unsupported(config, getattr(config, "model_type", "unknown"))
    try:
        return decode_for(cfg.model.decode, why, torch.device(device_type))
    except ConfigError:
        return cfg.model.decode
