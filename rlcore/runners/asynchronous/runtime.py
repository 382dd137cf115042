"""The life cycle of one asynchronous run: launch the roles, barrier, drive, stop.

The same life cycle serves both asynchronous runners; the vehicle that carries the roles
(`vehicles.py`: processes or threads) is the only difference, and each entry point picks
one (`runners/areal.py`, `runners/threaded.py`). The controller makes every decision; this
module only moves messages to it and watches the workers' health (`health.py`).
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rlcore.config import RunConfig
from rlcore.kernels import pin
from rlcore.policy.device import peak_gpu_bytes, resolve_device, resolve_transport
from rlcore.policy.hf_policy import HFPolicy
from rlcore.record.ledger import RunLedger
from rlcore.runners.asynchronous.contexts import (
    ParamServiceContext,
    RankContext,
    Ranks,
    RolloutContext,
    TrainerContext,
    rank_name,
)
from rlcore.runners.asynchronous.controller import Controller
from rlcore.runners.asynchronous.health import Watchdog, WorkerFailed, worker_failed
from rlcore.runners.asynchronous.interfaces import Vehicle, WeightStore
from rlcore.runners.asynchronous.layout import (
    Layout,
    check_memory,
    gpu_bytes,
    longest_prompt_tokens,
    model_size,
    resolve_layout,
    role_bytes,
)
from rlcore.runners.asynchronous.messages import Ready, Stopped, WorkerError
from rlcore.runners.asynchronous.param_service import param_service_main
from rlcore.runners.asynchronous.placement import placement
from rlcore.runners.asynchronous.rollout import rollout_main
from rlcore.runners.asynchronous.trainer import rank_main, trainer_main
from rlcore.runners.asynchronous.weight_slots import (
    WeightSlots,
    carries_digests,
    check_arrival,
    check_shared_memory,
    shared_memory_free,
    trainable_spec,
)
from rlcore.runners.common import preflight
from rlcore.tasks.suites import Task

POLL_S = 0.05


class Driven(Protocol):
    """What the life cycle feeds: the live `Controller`, or the planner's."""

    t_done: float | None  # when the last update committed (None: not yet)

    def on_message(self, msg: Any) -> None: ...

    def pump(self) -> None: ...


@dataclass(frozen=True)
class Roles:
    """What each role runs, given its context: the live roles load a model first; the
    planner's run the same loops without one (`rlcore/plan/roles.py`)."""

    param_service: Callable[[ParamServiceContext], None] = param_service_main
    rollout: Callable[[RolloutContext], None] = rollout_main
    trainer: Callable[[TrainerContext], None] = trainer_main
    rank: Callable[[RankContext], None] = rank_main


class Lifecycle:
    """The roles of one run, their channels, and the loop that feeds the controller:
    launch, drive, stop. A live run adds the weight slots, devices and the barrier
    (`Runtime`); a plan adds a store without weights."""

    def __init__(self, cfg: RunConfig, vehicle: Vehicle, slots: WeightStore,
                 devices: dict[str, torch.device], cpus: dict[str, tuple[int, ...]],
                 ranks: Ranks | None = None, layout: Layout | None = None):
        self.cfg, self.v, self.clock = cfg, vehicle, vehicle.clock
        rt = cfg.runtime
        self.n_rollout, self.n_trainer = rt.rollout_workers, rt.trainer_workers
        self.slots, self.devices, self.cpus = slots, devices, cpus
        # each worker's device (a plan's: every worker on its role's device)
        self.layout = layout or Layout((devices["rollout"],) * rt.rollout_workers,
                                       (devices["trainer"],) * rt.trainer_ranks,
                                       rt.trainer_workers)
        self.prompts: tuple[tuple[str, str | None], ...] = ()  # the rollouts' (a live run's)
        v = vehicle
        self.inbox, self.prompt_q, self.commit_q = v.queue(), v.queue(), v.queue()
        self.trainer_qs = [v.queue() for _ in range(self.n_trainer)]
        self.ack_qs = [v.queue() for _ in range(self.n_trainer)]
        # a data-parallel trainer's ranks above 0, each told rank 0's steps
        self.ranks = ranks
        self.rank_qs = [v.queue() for _ in range(1, ranks.world)] if ranks else []
        self.start_evt, self.stop_evt = v.flag(), v.flag()
        self.stopped: dict[str, Stopped] = {}
        self.suspects: dict[str, tuple[float, str]] = {}  # dead workers: (deadline, how)
        self._last_check = 0.0
        # Per rollout worker: [prompt slots taken, rollout messages sent]. Queue depths are
        # derived from these and the controller's own counts (a pipe has no qsize). Each
        # entry has one writer, so no lock: a worker killed holding one would hang the
        # controller, which reads them every 25 ms.
        self.counters = vehicle.counters(2 * self.n_rollout)

    def _common(self, name: str, index: int) -> dict[str, Any]:
        return dict(cfg=self.cfg, name=name, index=index, inbox=self.inbox,
                    start=self.start_evt, slots=self.slots, clock=self.clock,
                    cpus=self.cpus.get(name), own_process=self.v.processes)

    def launch(self, roles: Roles) -> None:
        """Start every role, in this order (a virtual clock's tie-break follows it)."""
        self.v.start("param_service", roles.param_service, ParamServiceContext(
            **self._common("param_service", 0), commit_q=self.commit_q, ack_qs=self.ack_qs))
        for i in range(self.n_rollout):
            name = f"rollout{i}"
            self.v.start(name, roles.rollout, RolloutContext(
                **self._common(name, i), device=self.layout.rollout[i],
                prompts=self.prompts, prompt_q=self.prompt_q, counters=self.counters,
                stop=self.stop_evt))
        for i in range(self.n_trainer):
            name = f"trainer{i}"
            self.v.start(name, roles.trainer, TrainerContext(
                **self._common(name, i), device=self.layout.trainer[0],
                trainer_q=self.trainer_qs[i], commit_q=self.commit_q, ack_q=self.ack_qs[i],
                stop=self.stop_evt, ranks=self.ranks, rank_qs=self.rank_qs))
        if self.ranks is not None:
            for r, q in enumerate(self.rank_qs, start=1):
                name = rank_name(r)
                self.v.start(name, roles.rank, RankContext(
                    **self._common(name, r), device=self.layout.trainer[r], rank=r,
                    ranks=self.ranks, rank_q=q))

    def workers(self) -> set[str]:
        """Every worker's name but the parameter service's."""
        return ({f"rollout{i}" for i in range(self.n_rollout)}
                | {f"trainer{i}" for i in range(self.n_trainer)}
                | {rank_name(r) for r in range(1, len(self.rank_qs) + 1)})

    # --- health (health.Watched) ---------------------------------------------------------
    def dead(self) -> dict[str, str]:
        return self.v.dead()

    def end_all(self) -> None:
        self.v.end_all(self)

    def check(self) -> None:
        """Raise WorkerFailed if a worker has died without saying it stopped.

        A worker's last messages (its Stopped, or its traceback) can still be in the queue when
        its exit is seen, so a dead worker is given half a second of normal receiving first.
        """
        now = self.clock.now()
        if now - self._last_check < POLL_S and not self.suspects:
            return  # exit codes cost a syscall per worker: look every poll interval
        self._last_check = now
        for name, how in self.v.dead().items():
            if name not in self.stopped:
                self.suspects.setdefault(name, (now + 0.5, how))
        for name, (deadline, how) in self.suspects.items():
            if name not in self.stopped and now > deadline:
                raise worker_failed(name, how)

    def receive(self) -> Any:
        """The next message (None after a poll interval), failing fast on worker errors."""
        self.check()
        try:
            msg = self.inbox.get(timeout=POLL_S)
        except queue.Empty:
            return None
        if isinstance(msg, WorkerError):
            # a worker that died without a word is the cause of what its peers raise (a
            # trainer rank whose gradient sum lost the other end): the peer can hear of the
            # death before its exit shows, so it is given half a second to show
            dead = self.silent_deaths(msg.worker, within_s=0.5)
            if dead:
                last = [line for line in msg.traceback.splitlines() if line.strip()][-1:]
                raise worker_failed(*dead[0]) from WorkerFailed(
                    f"then worker '{msg.worker}' raised: {''.join(last).strip()}")
            raise worker_failed(msg.worker, "it raised") from WorkerFailed(msg.traceback)
        if isinstance(msg, Stopped):
            if not self.stop_evt.is_set():
                raise worker_failed(msg.worker, "it left its loop before the run was stopped")
            self.stopped[msg.worker] = msg
        return msg

    def silent_deaths(self, besides: str, within_s: float) -> list[tuple[str, str]]:
        """Workers other than `besides` dead without saying they stopped, as they show
        within `within_s` seconds, by name."""
        deadline = time.monotonic() + within_s
        while True:
            dead = sorted((name, how) for name, how in self.v.dead().items()
                          if name != besides and name not in self.stopped)
            if dead or time.monotonic() > deadline:
                return dead
            time.sleep(0.02)

    # --- phases --------------------------------------------------------------------------
    def drive(self, controller: Driven) -> float:
        """Feed the controller until the last update; returns when that update committed."""
        self.start_evt.set()
        while controller.t_done is None:
            msg = self.receive()
            if msg is not None:
                controller.on_message(msg)
            controller.pump()
        return controller.t_done

    def stop(self, controller: Driven) -> None:
        """Stop rollout and trainers, then the parameter service; process what they flush."""
        self.stop_evt.set()
        for _ in range(self.n_rollout):
            self.prompt_q.put([])  # wake rollout workers blocked on an empty prompt queue
        for q in self.trainer_qs:
            q.put(None)
        self._drain(controller, self.workers())
        self.commit_q.put(None)
        self._drain(controller, {"param_service"})

    def _drain(self, controller: Driven, names: set[str]) -> None:
        deadline = self.clock.now() + 30
        while not names <= set(self.stopped):
            if self.clock.now() > deadline:
                raise WorkerFailed(f"workers {sorted(names - set(self.stopped))} did not stop "
                                   "within 30 s")
            msg = self.receive()
            if msg is not None:
                controller.on_message(msg)

    def shutdown(self) -> None:
        """End every worker, whether the run finished or failed."""
        self.v.end_all(self)


class Runtime(Lifecycle):
    """A live run's life cycle: the roles load the model, weights move through shared
    slots, and a barrier waits for every role to be ready."""

    def __init__(self, cfg: RunConfig, vehicle: Vehicle, tasks: Sequence[Task]):
        rt = cfg.runtime
        layout = resolve_layout(cfg, resolve_device, torch.cuda.device_count())
        devices = {"rollout": layout.rollout[0], "trainer": layout.trainer[0]}
        transport = resolve_transport(rt.weight_transport, devices["rollout"],
                                      len({d for d in layout.rollout if d.type == "cuda"}))
        spec = trainable_spec(cfg.model.path, cfg.train.lora)
        if vehicle.processes and transport != "device":
            check_shared_memory(spec, rt.trainer_workers + 1, shared_memory_free())
        slots = WeightSlots(spec, rt.trainer_workers + 1,
                            vehicle.locked_array(2 + rt.trainer_workers + 1),
                            shared=vehicle.processes, transport=transport,
                            device=devices["rollout"], digests=carries_digests(cfg))
        cpus, self.unpinned_reason = placement(rt, devices)
        self.rank_dir = None
        ranks = None
        # ranks of their own on the wall clock; on the virtual one the trainer prices them
        if rt.trainer_ranks > 1 and vehicle.processes:
            # the ranks meet through a file that must not exist before they do
            self.rank_dir = tempfile.mkdtemp(prefix="rlcore-ranks-")
            ranks = Ranks(str(Path(self.rank_dir) / "rendezvous"), rt.trainer_ranks,
                          rt.collective_timeout_s)
        if any(d.type == "cuda" for d in layout.roles().values()):
            n_slots = rt.trainer_workers + 1
            needs = role_bytes(model_size(cfg, slots.nbytes), cfg,
                               longest_prompt_tokens(cfg, [(t.prompt, t.system) for t in tasks]),
                               slots.nbytes * n_slots)
            check_memory(layout, needs, gpu_bytes,
                         devices["rollout"] if transport == "device" else None)
        super().__init__(cfg, vehicle, slots, devices, cpus, ranks, layout)
        self.slots: WeightSlots = slots
        if devices["rollout"].type == "cuda":
            self.prompts = tuple((t.prompt, t.system) for t in tasks)
        self.watchdog = Watchdog(self) if vehicle.processes else None

    def launch(self, roles: Roles = Roles()) -> None:
        super().launch(roles)
        if self.watchdog is not None:
            self.watchdog.start()

    def barrier(self, ledger: RunLedger) -> float:
        """Wait until every worker has loaded its model; returns the cold-start seconds."""
        t0 = self.clock.now()
        waiting = {"param_service", *self.workers()}
        ready = []
        while waiting:
            if self.clock.now() - t0 > self.cfg.runtime.start_timeout_s:
                raise WorkerFailed(f"workers {sorted(waiting)} did not load their models within "
                                   f"runtime.start_timeout_s={self.cfg.runtime.start_timeout_s}")
            msg = self.receive()
            if isinstance(msg, Ready):
                waiting.discard(msg.worker)
                ready.append(msg)
        cold = self.clock.now() - t0
        ledger.start_clock()
        for r in ready:
            ledger.event("worker_ready", t=0.0, worker=r.worker, pid=r.pid, device=r.device,
                         load_s=r.load_s, cpus=r.cpus)
        return cold

    def slots_bytes(self) -> int | None:
        """GPU bytes this (the main) process holds for the slots, where the roles, in their
        own processes, do not count them; None where it holds none."""
        if not (self.v.processes and self.slots.transport == "device"):
            return None
        return peak_gpu_bytes(self.devices["rollout"])

    def shutdown(self) -> None:
        if self.watchdog is not None:
            self.watchdog.done.set()
        super().shutdown()
        if self.rank_dir is not None:
            shutil.rmtree(self.rank_dir, ignore_errors=True)
        self.slots.close()  # after the workers: a thread's copy may still be in flight
        if self.v.processes and self.slots.transport == "device":
            # The workers released what they received: free the blocks CUDA IPC kept for
            # them, which would stay until this process exits (a bench's repeats, pytest)
            self.slots.release_buffers()
            torch.cuda.ipc_collect()


def role_peaks(stopped: dict[str, Stopped]) -> dict[str, int | None]:
    """Each role's largest GPU allocator peak over its workers (`rollout0`, `rollout1`, ...);
    None where no worker of the role ran on CUDA."""
    out: dict[str, int | None] = {}
    for role in ("rollout", "trainer"):
        peaks = [s.gpu_peak_bytes for name, s in stopped.items()
                 if name.startswith(role) and s.gpu_peak_bytes is not None]
        out[role] = max(peaks) if peaks else None
    return out


def run_async(cfg: RunConfig, out_dir: str | Path, force: bool, vehicle: Vehicle
              ) -> dict[str, Any]:
    """Run the asynchronous pipeline on `vehicle`; returns the summary."""
    tasks = preflight(cfg)
    pin(cfg)
    # Built before the run directory is opened: a bad device or model config fails here.
    runtime = Runtime(cfg, vehicle, tasks)
    ledger = RunLedger(cfg, out_dir, force=force, clock=vehicle.clock)
    controller: Controller | None = None
    try:
        runtime.launch()
        cold_start_s = runtime.barrier(ledger)
        controller = Controller(cfg, tasks, ledger, runtime, runtime.n_trainer)
        ledger.event("run_start", cold_start_s=cold_start_s)
        t_done = runtime.drive(controller)
        wall_s = ledger.on_clock(t_done)
        runtime.stop(controller)
        controller.flush_buffer()
        for s in runtime.stopped.values():
            ledger.count_tokens(sampled=s.tokens_sampled, reprefilled=s.tokens_reprefilled,
                                kv_kept=s.tokens_kv_kept, abandoned=s.tokens_abandoned)
            ledger.worker_cpu(s.cpu_s)
        # The final weights are the parameter service's current slot.
        policy = HFPolicy(cfg.model, cfg.train, role="rollout", device=torch.device("cpu"))
        final = runtime.slots.read_into(runtime.slots.ordered(policy.state_tensors()))
        # checked on what the policy holds after the load, not on the buffers read into
        check_arrival(runtime.slots, final, policy.state_tensors(), "the run's end")
        policy.state_loaded()
        return ledger.finish(
            policy, wall_s=wall_s, cold_start_s=cold_start_s, waits=dict(controller.waits),
            placement={"cpus": {name: list(cpus) for name, cpus in runtime.cpus.items()},
                       "unpinned_reason": runtime.unpinned_reason},
            devices={role: str(d) for role, d in runtime.devices.items()},
            weight_transport=runtime.slots.transport, weight_bytes=runtime.slots.nbytes,
            gpu_peak_bytes={**role_peaks(runtime.stopped), "weight_slots": runtime.slots_bytes()})
    finally:
        runtime.shutdown()
        if controller is not None:  # a failed run leaves no code evaluation queued
            controller.rewards.close()
        ledger.close()
