"""`rlcore calibrate`: time each cost term of the virtual clock on this machine, fit a profile.

The terms are timed and fit in `timings.py`. What concurrent work shares is measured in
`sharing.py`: the interpreter-lock share of decode, prefill and update, by running the same
work on two threads at once against one alone; what the cores share, by timing decode
beside an update loop in another process on the other core, and the reverse, against each
alone. `write_profile` writes the result with the fit report at its head.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from rlcore.clock.profile import (
    AcceleratorCost,
    AdapterCost,
    CommitCost,
    ControllerCost,
    CopyCost,
    CpuCost,
    DecodeCost,
    HardwareProfile,
    RewardCost,
    TokenCost,
)
from rlcore.config import RunConfig
from rlcore.kernels import cpu_name, pin
from rlcore.measure.copy_timings import (
    time_allreduce,
    time_digests,
    time_weights,
    weight_copies,
)
from rlcore.measure.sharing import concurrent_slowdown, decode_work, gil_share, update_work
from rlcore.measure.timings import (
    Fit,
    lora_of,
    time_adapters,
    time_commit,
    time_controller,
    time_rewards,
    time_sampling,
    time_updates,
)
from rlcore.policy.device import resolve_device


def calibrate(cfg: RunConfig, name: str, reps: int = 3) -> tuple[HardwareProfile, str]:
    """Time every term on this machine for `cfg`'s model and devices; returns the profile
    and a report of each term's fit."""
    pin(cfg)
    copies = weight_copies(cfg)  # shared memory too small for the slots: refused before timing
    # decode, prefill and update of every weight: a LoRA run's decode products and adapter
    # updates are priced apart (`adapters`, `lora_update`), so they are timed apart
    full = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, lora=None))
    decode, prefill, decode_path = time_sampling(full, reps)
    update = time_updates(full, reps)
    lora_update = time_updates(lora_of(cfg), reps)  # every profile can price a LoRA run
    adapters = time_adapters(cfg, reps)
    write, read, transport = time_weights(cfg, reps)
    sha256 = time_digests(cfg, reps)
    allreduce = time_allreduce(cfg, reps)
    answer_s = time_rewards(cfg, 2000)
    math_s = time_rewards(cfg, 200, "math")
    controller = time_controller(cfg, 5 * reps, answer_s)
    commit_s = time_commit(cfg, 2000)
    decode_gil = gil_share(lambda: decode_work(cfg), 5)
    update_gil = gil_share(lambda: update_work(cfg), 5)
    cores, slowdown = concurrent_slowdown(cfg, 5)
    device = f"{cfg.model.rollout_device}/{cfg.model.trainer_device}"
    machine = (f"{platform.node()}: {platform.processor() or platform.machine()}, "
               f"{torch.get_num_threads()} torch threads per role, devices {device}, "
               f"model {cfg.model.path} ({cfg.model.dtype}, {cfg.model.attn_implementation}), "
               f"torch {torch.__version__}")
    profile = HardwareProfile(
        name=name, machine=machine,
        source=f"rlcore calibrate, {time.strftime('%Y-%m-%d')}, {reps} repetitions per size",
        model_bytes=None,
        decode=DecodeCost(decode.coef[0], decode.coef[1], decode.coef[2], gil_share=decode_gil),
        prefill=TokenCost(prefill.coef[0], prefill.coef[1], gil_share=decode_gil),
        update=TokenCost(update.coef[0], update.coef[1], gil_share=update_gil),
        lora_update=TokenCost(lora_update.coef[0], lora_update.coef[1], gil_share=update_gil),
        adapters=AdapterCost(adapters.coef[0], adapters.coef[1], gil_share=decode_gil),
        weight_write=CopyCost(write.coef[0], _bandwidth(write), gil_share=0.1),
        weight_read=CopyCost(read.coef[0], _bandwidth(read), gil_share=0.1),
        # assumed, as for the copies: hashlib lets go of the lock over buffers of 2 KB and more
        sha256=CopyCost(sha256.coef[0], _bandwidth(sha256), gil_share=0.1),
        # assumed: gloo's sum runs in its own threads, the caller waits with the lock let go
        allreduce=(CopyCost(allreduce.coef[0], _bandwidth(allreduce), gil_share=0.05)
                   if allreduce is not None else None),
        reward=RewardCost(answer_s=answer_s, code_s=0.05, math_s=math_s, gil_share=1.0),
        controller=ControllerCost(controller.coef[0], controller.coef[1]),
        commit=CommitCost(commit_s),
        **sharing(resolve_device(cfg.model.rollout_device, "rollout"),
                  resolve_device(cfg.model.trainer_device, "trainer"), cores, slowdown),
        host=cpu_name(), kernels=cfg.runtime.kernels, decode_path=decode_path,
        weight_transport=transport, device_type=copies.rollout.type)
    fits = {"decode": decode, "prefill": prefill, "update": update,
            "lora_update": lora_update, "adapters": adapters, "weight_write": write,
            "weight_read": read, "sha256": sha256, "controller": controller,
            **({"allreduce": allreduce} if allreduce is not None else {})}
    report = "\n".join(f"  {k:<13} residual {f.residual:6.1%} over {f.n} timings: "
                       f"{', '.join(f'{c:.3g}' for c in f.coef)}" for k, f in fits.items())
    report += (f"\n  reward        answer {answer_s:.3g} s (median of 2000), math "
               f"{math_s:.3g} s (median of 200)"
               f"\n  commit        {commit_s:.3g} s (median of 2000)"
               f"\n  gil_share     decode {decode_gil:.2f}, update {update_gil:.2f}"
               f"\n  sharing       {cores} cores; concurrent slowdown {slowdown:.2f} (medians "
               "of 5, decode beside updates and the reverse), to "
               f"{'accelerator' if profile.accelerator else 'cpu'}"
               f"\n  priced        decode path {decode_path}, weight transport {transport}, on "
               f"{copies.rollout.type}")
    return profile, report


def sharing(rollout: torch.device, trainer: torch.device, cores: int, slowdown: float
            ) -> dict[str, Any]:
    """The profile's `cpu` and `accelerator` from the measured concurrent slowdown, which is
    what the roles' devices share: the cores on a CPU; the one GPU when both roles compute
    on it; on a GPU each, only the host."""
    if rollout.type == "cpu":
        return {"cpu": CpuCost(cores, slowdown), "accelerator": None}
    if rollout == trainer:
        return {"cpu": CpuCost(None, 0.0), "accelerator": AcceleratorCost(slowdown)}
    return {"cpu": CpuCost(None, slowdown), "accelerator": None}


def _bandwidth(fit: Fit) -> float:
    """GB/s from a (call, GB) fit; a copy too fast to time its size gets a very high one."""
    per_gb = fit.coef[1]
    return 1.0 / per_gb if per_gb > 0 else 1e6


def write_profile(profile: HardwareProfile, report: str, out: Path) -> None:
    """The profile as YAML, headed by the fit report as comments."""
    head = ["# Hardware profile written by `rlcore calibrate` (docs/virtual_clock.md).",
            "# Units: seconds; gb_per_s in 1e9 bytes per second. Fits (relative RMS residual):"]
    head += [f"#{line}" for line in report.splitlines()]
    def rounded(node: Any) -> Any:  # four significant digits: the fits are not finer
        if isinstance(node, dict):
            return {k: rounded(v) for k, v in node.items()}
        return float(f"{node:.4g}") if isinstance(node, float) else node

    body = yaml.safe_dump(rounded(profile.to_dict()), sort_keys=False, width=100)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(head) + "\n" + body)
