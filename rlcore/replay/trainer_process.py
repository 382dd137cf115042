"""The replay's training role, in a process of its own.

A replay computes what the run's rollout and trainer computed, and on a machine with two
cores it should take about as long. Two threads of one process would share the GIL, and
the tiny model's steps are mostly Python, so each role would run half as fast; training
therefore runs here, forked from the fork server like the run's own workers, while the
replay's main process generates. The main process sends each trainer step, with its batch,
once the batch's samples exist; this process runs them in order, each on its trainer's
policy and optimizer, and sends back every update's statistics and, for an applied update,
the state it published. It keeps the versions its own `load` steps will need.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from rlcore.config import RunConfig
from rlcore.errors import ReplayError
from rlcore.kernels import pin
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.train_batch import TrainBatch
from rlcore.record.schedule import Schedule, TrainerOp
from rlcore.runners.asynchronous.health import die_with_parent


@dataclass
class TrainStep:
    """A trainer step to run (main -> trainer process); `publish`: the version an applied
    update makes, whose state is sent back."""

    op: TrainerOp
    batch: TrainBatch | None = None
    publish: int | None = None


@dataclass
class StepDone:
    """A step's outcome (trainer process -> main); times are time.monotonic()."""

    op: TrainerOp
    stats: dict[str, float] | None
    state: Packed | None
    t0: float
    t1: float


@dataclass
class Stopped:
    """The trainer process has left its loop: the CPU time it used since it was ready."""

    cpu_s: float


@dataclass
class Packed:
    """A state dict as one flat tensor, so that it crosses processes as one shared block."""

    names: list[str]
    shapes: list[tuple[int, ...]]
    flat: torch.Tensor

    @staticmethod
    def of(state: dict[str, torch.Tensor]) -> Packed:
        names = list(state)
        flat = torch.cat([state[n].reshape(-1) for n in names])
        return Packed(names, [tuple(state[n].shape) for n in names], flat)

    def unpack(self) -> dict[str, torch.Tensor]:
        sizes = [int(torch.Size(s).numel()) for s in self.shapes]
        parts = torch.split(self.flat, sizes)
        return {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)}


def _parent_pid() -> int:
    """The pid of the process that started this one (multiprocessing's parent)."""
    parent = multiprocessing.parent_process()
    assert parent is not None and parent.pid is not None, "not a multiprocessing child"
    return parent.pid


def trainer_main(cfg: RunConfig, trainers: list[int], device: str, load_uses: dict[int, int],
                 steps: Any, results: Any) -> None:
    """Process entry: build one policy per trainer, then run steps until None."""
    die_with_parent(os.getppid(), main_pid=_parent_pid())
    pin(cfg)
    try:
        policies = {t: HFPolicy(cfg.model, cfg.train, role="trainer",
                                device=torch.device(device)) for t in trainers}
        versions = {0: next(iter(policies.values())).export_state()}
        uses = dict(load_uses)
        results.put("ready")
        cpu0 = time.process_time()
        while (step := steps.get()) is not None:
            op, policy = step.op, policies[step.op.trainer]
            t0 = time.monotonic()
            if op.op == "load":
                policy.load_state(versions[op.version])
                uses[op.version] -= 1
                if uses[op.version] == 0:
                    del versions[op.version]
                results.put(StepDone(op, None, None, t0, time.monotonic()))
                continue
            stats = policy.update(step.batch, temperature=cfg.rollout.temperature,
                                  current_version=op.version)
            state = None
            if step.publish is not None:
                exported = policy.export_state()
                if uses.get(step.publish):
                    versions[step.publish] = exported
                state = Packed.of(exported)
            results.put(StepDone(op, stats, state, t0, time.monotonic()))
        results.put(Stopped(time.process_time() - cpu0))
    except BaseException:  # noqa: BLE001 - the main process reports it
        results.put(traceback.format_exc())


class TrainerProcess:
    """The replay's handle on the trainer process: start, send steps, read results, stop."""

    def __init__(self, cfg: RunConfig, schedule: Schedule, device: torch.device,
                 load_uses: dict[int, int]):
        self.cfg, self.device, self.load_uses = cfg, str(device), load_uses
        self.trainers = sorted(schedule.trainer_ops)
        self._trainer: Any = None  # the process, once started

    def start(self) -> None:
        """Start the process and wait until its policies are loaded (the cold start)."""
        from rlcore.runners.asynchronous import forkserver

        ctx = forkserver.context()
        self._steps, self._results = ctx.Queue(), ctx.Queue()
        self._trainer = ctx.Process(
            target=trainer_main, name="replay-trainer", daemon=True,
            args=(self.cfg, self.trainers, self.device, self.load_uses, self._steps,
                  self._results))
        self._trainer.start()
        if self.result(timeout=self.cfg.runtime.start_timeout_s) != "ready":
            raise ReplayError("the replay's trainer process did not start")

    def result(self, timeout: float) -> Any:
        """The trainer process's next message; None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self._results.get(timeout=0.05)
            except queue.Empty:
                if not self._trainer.is_alive():
                    raise ReplayError("the replay's trainer process died (exit code "
                                      f"{self._trainer.exitcode})") from None
                if time.monotonic() > deadline:
                    return None
                continue
            if isinstance(msg, str) and msg != "ready":
                raise ReplayError(f"the replay's trainer process failed:\n{msg}")
            return msg

    def send(self, step: TrainStep) -> None:
        self._steps.put(step)

    def stop(self, wait: bool) -> float:
        """Stop the process (idle once every step is back); returns the CPU seconds it used,
        read from its last message when `wait` (0 otherwise, or when it never started)."""
        cpu_s = 0.0
        if self._trainer is None:
            return cpu_s
        if self._trainer.is_alive():
            self._steps.put(None)
            msg = self.result(timeout=10) if wait else None
            if isinstance(msg, Stopped):
                cpu_s = msg.cpu_s
            self._trainer.join(timeout=10)
        if self._trainer.is_alive():
            self._trainer.kill()
        return cpu_s
