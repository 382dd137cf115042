"""Orchestration of the asynchronous runners: start the roles, barrier, drive, shut down.

`async_areal_style` runs every role in its own process, started with the `spawn` context so
that each builds its own CUDA context (paper §3); `async_train` runs the same roles as threads
of one process. Everything else -- controller, workers, messages, weight slots -- is shared, so
the two differ only in scheduling.

Failure handling: a worker that raises sends its traceback; a worker that dies (even by
SIGKILL) is seen by its exit code within one poll (50 ms). Either way the run stops at once,
every other worker is killed, and no summary.json is written. Child processes also ask the
kernel to kill them if the main process dies (PR_SET_PDEATHSIG), so none is left behind. A
`Watchdog` covers the one read the controller cannot leave (see there).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as torch_mp

from rlcore.backend import HFPolicy, resolve_device
from rlcore.config import RunConfig
from rlcore.metrics import merge_spans, overlap_seconds
from rlcore.records import RunRecorder
from rlcore.runners.areal.controller import Controller
from rlcore.runners.areal.param_service import WeightSlots, param_service_main, trainable_spec
from rlcore.runners.areal.protocol import Ready, Stopped, WorkerError
from rlcore.runners.areal.rollout import rollout_main
from rlcore.runners.areal.trainer import trainer_main
from rlcore.runners.common import build_summary, finish_run, preflight, set_threads
from rlcore.tasks import Task

POLL_S = 0.05


class WorkerFailed(RuntimeError):
    """A worker raised or died; the message names it and carries its traceback."""


@dataclass
class WorkerContext:
    """Everything one role needs: its config, name, device and the shared channels."""

    cfg: RunConfig
    name: str
    index: int
    device: torch.device | None
    slots: WeightSlots
    inbox: Any
    prompt_q: Any
    start: Any
    stop: Any
    counters: Any
    trainer_q: Any = None
    commit_q: Any = None
    ack_q: Any = None
    ack_qs: list[Any] | None = None
    cpus: tuple[int, ...] | None = None  # cores this role is pinned to (None: not pinned)

    def pid(self) -> int:
        return os.getpid()


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans); exit at once if
    `parent_pid` is already gone."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent_pid:  # it died before the call
        os._exit(1)


def plan_cpus(allowed: set[int], roles: list[str], threads: int
              ) -> tuple[dict[str, tuple[int, ...]], str]:
    """Disjoint sets of `threads` cores for each role, from the lowest allowed core up; or no
    plan and the reason, when the allowed cores are too few."""
    cores = sorted(allowed)
    if len(cores) < len(roles) * threads:
        return {}, (f"{len(roles)} roles x {threads} threads need {len(roles) * threads} cores, "
                    f"{len(cores)} allowed")
    return {r: tuple(cores[i * threads:(i + 1) * threads]) for i, r in enumerate(roles)}, ""


def _run_role(fn: Callable[[WorkerContext], None], ctx: WorkerContext) -> bool:
    try:
        fn(ctx)
        return True
    except BaseException:  # noqa: BLE001 - any failure must reach the main process
        ctx.inbox.put(WorkerError(ctx.name, traceback.format_exc()))
        return False


def _process_entry(fn: Callable[[WorkerContext], None], ctx: WorkerContext) -> None:
    parent = multiprocessing.parent_process()
    if parent is not None:
        die_with_parent(parent.pid)
    if ctx.cpus is not None:  # before torch starts any thread, so that they inherit it
        os.sched_setaffinity(0, ctx.cpus)
    torch.set_num_threads(ctx.cfg.runtime.threads_per_role)
    if not _run_role(fn, ctx):
        sys.exit(1)


def _thread_entry(fn: Callable[[WorkerContext], None], ctx: WorkerContext) -> None:
    if ctx.cpus is not None:  # on Linux the affinity of pid 0 is the calling thread's
        os.sched_setaffinity(0, ctx.cpus)
    _run_role(fn, ctx)


class PipeQueue:
    """A queue over one pipe with no feeder thread (a `SimpleQueue` with timeouts).

    `multiprocessing.Queue` pickles in a background thread of the sender; on a two-core
    machine that thread fights its own process for the GIL on every message. Here `put`
    pickles and writes in the caller. Each queue has one consumer, except the prompt queue,
    whose rollout workers are woken with empty messages at shutdown.
    """

    def __init__(self, mp: Any):
        self._q = mp.SimpleQueue()

    def put(self, obj: Any) -> None:
        self._q.put(obj)

    def get(self, timeout: float | None = None) -> Any:
        if timeout is not None and not self._q._reader.poll(timeout):
            raise queue.Empty
        return self._q.get()

    def get_nowait(self) -> Any:
        return self.get(timeout=0)

    def empty(self) -> bool:
        return self._q.empty()


class Processes:
    """The `spawn` vehicle: one process per role, weights in shared memory."""

    shared_memory = True

    def __init__(self) -> None:
        self.mp = torch_mp.get_context("spawn")
        self.handles: dict[str, Any] = {}

    def queue(self) -> Any:
        return PipeQueue(self.mp)

    def event(self) -> Any:
        return self.mp.Event()

    def start(self, name: str, fn: Callable[[WorkerContext], None], ctx: WorkerContext) -> None:
        p = self.mp.Process(target=_process_entry, args=(fn, ctx), name=name, daemon=True)
        p.start()
        self.handles[name] = p

    def dead(self) -> dict[str, str]:
        """Workers that have exited, with how."""
        out = {}
        for name, p in self.handles.items():
            code = p.exitcode
            if code is not None:
                how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                out[name] = f"pid {p.pid}, {how}"
        return out

    def end_all(self, runtime: Runtime) -> None:
        """SIGKILL whatever is still running. Nothing is sent first: a worker killed while
        holding a queue's or an event's lock would leave that put or set() blocked forever."""
        for p in self.handles.values():
            if p.is_alive():
                p.kill()
        for p in self.handles.values():
            p.join(timeout=5)


class Threads:
    """The threaded vehicle: one thread per role in this process."""

    shared_memory = False

    def __init__(self) -> None:
        self.mp = multiprocessing  # only for the slot counters (Array works in-process too)
        self.handles: dict[str, threading.Thread] = {}

    def queue(self) -> Any:
        return queue.Queue()

    def event(self) -> Any:
        return threading.Event()

    def start(self, name: str, fn: Callable[[WorkerContext], None], ctx: WorkerContext) -> None:
        t = threading.Thread(target=_thread_entry, args=(fn, ctx), name=name, daemon=True)
        t.start()
        self.handles[name] = t

    def dead(self) -> dict[str, str]:
        return {n: "thread ended" for n, t in self.handles.items() if not t.is_alive()}

    def end_all(self, runtime: Runtime) -> None:
        """Threads cannot be killed: set the events and send the sentinels that end them."""
        runtime.stop_evt.set()
        runtime.start_evt.set()  # release anyone still at the barrier
        for q in [*runtime.trainer_qs, runtime.commit_q]:
            q.put(None)


class Watchdog:
    """Ends this process when a worker has been dead for `grace_s` and the run has not failed.

    The controller fails a run within a poll of a worker's death, unless it is blocked in a
    read: a worker SIGKILLed between the two writes of a message over 16 KB leaves a header
    whose payload never comes. Nothing can unblock that read, so the watchdog says what
    failed, kills the workers and exits, as the controller would have.
    """

    def __init__(self, runtime: Runtime, grace_s: float = 10.0,
                 exit: Callable[[int], None] = os._exit):
        self.runtime, self.grace_s, self.exit = runtime, grace_s, exit
        self.done = threading.Event()  # the run ended, by success or by a failure handled
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        first_seen: dict[str, float] = {}
        while not self.done.wait(min(1.0, self.grace_s / 4)):
            now = time.monotonic()
            for name, how in self.runtime.v.dead().items():
                if name in self.runtime.stopped:
                    continue
                if now - first_seen.setdefault(name, now) >= self.grace_s:
                    print(f"rlcore: error: {self.runtime._fail(name, how)} (the controller was "
                          "blocked, so the watchdog ended the run)", file=sys.stderr, flush=True)
                    self.runtime.v.end_all(self.runtime)
                    self.exit(1)
                    return


class Runtime:
    """One asynchronous run: the roles, the controller loop and the run directory."""

    def __init__(self, cfg: RunConfig, vehicle: Processes | Threads):
        self.cfg, self.v = cfg, vehicle
        rt = cfg.runtime
        self.n_rollout, self.n_trainer = rt.rollout_workers, rt.trainer_workers
        self.slots = WeightSlots(trainable_spec(cfg.model.path), self.n_trainer + 1, vehicle.mp,
                                 shared=vehicle.shared_memory)
        v = vehicle
        self.inbox, self.prompt_q, self.commit_q = v.queue(), v.queue(), v.queue()
        self.trainer_qs = [v.queue() for _ in range(self.n_trainer)]
        self.ack_qs = [v.queue() for _ in range(self.n_trainer)]
        self.start_evt, self.stop_evt = v.event(), v.event()
        self.stopped: dict[str, Stopped] = {}
        self.suspects: dict[str, tuple[float, str]] = {}  # dead workers: (deadline, how)
        self._last_check = 0.0
        # Per rollout worker: [prompt slots taken, rollout messages sent]. Queue depths are
        # derived from these and the controller's own counts (a pipe has no qsize). Each
        # entry has one writer, so no lock: a worker killed holding one would hang the
        # controller, which reads them every 25 ms.
        self.counters = vehicle.mp.Array("q", 2 * self.n_rollout, lock=False)
        m = cfg.model
        self.devices = {"rollout": resolve_device(m.rollout_device, "rollout"),
                        "trainer": resolve_device(m.trainer_device, "trainer")}
        self.cpus, self.unpinned_reason = self.placement()
        self.watchdog = Watchdog(self) if isinstance(vehicle, Processes) else None

    def _ctx(self, name: str, index: int, device: torch.device | None, **kw: Any
             ) -> WorkerContext:
        return WorkerContext(self.cfg, name, index, device, self.slots, self.inbox,
                             self.prompt_q, self.start_evt, self.stop_evt, self.counters, **kw)

    def placement(self) -> tuple[dict[str, tuple[int, ...]], str]:
        """Cores for each rollout worker and trainer, or none and why (`runtime.pin_cpus`).

        Each of the two heavy roles owning its cores keeps them from sharing one core, or
        migrating, while the other idles; the light controller and parameter service float.
        """
        rt = self.cfg.runtime
        heavy = [*(f"rollout{i}" for i in range(self.n_rollout)),
                 *(f"trainer{i}" for i in range(self.n_trainer))]
        if not rt.pin_cpus:
            return {}, "runtime.pin_cpus is false"
        if {d.type for d in self.devices.values()} != {"cpu"}:
            return {}, "a role runs on a GPU"
        return plan_cpus(os.sched_getaffinity(0), heavy, rt.threads_per_role)

    def launch(self) -> None:
        self.v.start("param_service", param_service_main, self._ctx(
            "param_service", 0, None, commit_q=self.commit_q, ack_qs=self.ack_qs))
        for i in range(self.n_rollout):
            name = f"rollout{i}"
            self.v.start(name, rollout_main, self._ctx(
                name, i, self.devices["rollout"], cpus=self.cpus.get(name)))
        for i in range(self.n_trainer):
            name = f"trainer{i}"
            self.v.start(name, trainer_main, self._ctx(
                name, i, self.devices["trainer"],
                trainer_q=self.trainer_qs[i], commit_q=self.commit_q, ack_q=self.ack_qs[i],
                cpus=self.cpus.get(name)))
        if self.watchdog is not None:
            self.watchdog.start()

    # --- health --------------------------------------------------------------------------
    def _fail(self, worker: str, detail: str) -> WorkerFailed:
        return WorkerFailed(f"worker '{worker}' failed ({detail}); the run was stopped and "
                            "no summary.json was written")

    def check(self) -> None:
        """Raise WorkerFailed if a worker has died without saying it stopped.

        A worker's last messages (its Stopped, or its traceback) can still be in the queue when
        its exit is seen, so a dead worker is given half a second of normal receiving first.
        """
        now = time.monotonic()
        if now - self._last_check < POLL_S and not self.suspects:
            return  # exit codes cost a syscall per worker: look every poll interval
        self._last_check = now
        for name, how in self.v.dead().items():
            if name not in self.stopped:
                self.suspects.setdefault(name, (now + 0.5, how))
        for name, (deadline, how) in self.suspects.items():
            if name not in self.stopped and now > deadline:
                raise self._fail(name, how)

    def receive(self) -> Any:
        """The next message (None after a poll interval), failing fast on worker errors."""
        self.check()
        try:
            msg = self.inbox.get(timeout=POLL_S)
        except queue.Empty:
            return None
        if isinstance(msg, WorkerError):
            raise self._fail(msg.worker, "it raised") from WorkerFailed(msg.traceback)
        if isinstance(msg, Stopped):
            if not self.stop_evt.is_set():
                raise self._fail(msg.worker, "it left its loop before the run was stopped")
            self.stopped[msg.worker] = msg
        return msg

    # --- phases --------------------------------------------------------------------------
    def barrier(self, rec: RunRecorder) -> float:
        """Wait until every worker has loaded its model; returns the cold-start seconds."""
        t0 = time.monotonic()
        waiting = {"param_service", *(f"rollout{i}" for i in range(self.n_rollout)),
                   *(f"trainer{i}" for i in range(self.n_trainer))}
        ready = []
        while waiting:
            if time.monotonic() - t0 > self.cfg.runtime.start_timeout_s:
                raise WorkerFailed(f"workers {sorted(waiting)} did not load their models within "
                                   f"runtime.start_timeout_s={self.cfg.runtime.start_timeout_s}")
            msg = self.receive()
            if isinstance(msg, Ready):
                waiting.discard(msg.worker)
                ready.append(msg)
        cold = time.monotonic() - t0
        rec.start_clock()
        for r in ready:
            rec.event("worker_ready", t=0.0, worker=r.worker, pid=r.pid, device=r.device,
                      load_s=r.load_s, cpus=r.cpus)
        return cold

    def drive(self, controller: Controller) -> None:
        self.start_evt.set()
        while not controller.done:
            msg = self.receive()
            if msg is not None:
                controller.on_message(msg)
            controller.pump()

    def stop(self, controller: Controller) -> None:
        """Stop rollout and trainers, then the parameter service; process what they flush."""
        self.stop_evt.set()
        for _ in range(self.n_rollout):
            self.prompt_q.put([])  # wake rollout workers blocked on an empty prompt queue
        for q in self.trainer_qs:
            q.put(None)
        self._drain(controller, {f"rollout{i}" for i in range(self.n_rollout)}
                    | {f"trainer{i}" for i in range(self.n_trainer)})
        self.commit_q.put(None)
        self._drain(controller, {"param_service"})

    def _drain(self, controller: Controller, names: set[str]) -> None:
        deadline = time.monotonic() + 30
        while not names <= set(self.stopped):
            if time.monotonic() > deadline:
                raise WorkerFailed(f"workers {sorted(names - set(self.stopped))} did not stop "
                                   "within 30 s")
            msg = self.receive()
            if msg is not None:
                controller.on_message(msg)

    def shutdown(self) -> None:
        """End every worker, whether the run finished or failed."""
        if self.watchdog is not None:
            self.watchdog.done.set()
        self.v.end_all(self)


def run_async(cfg: RunConfig, out_dir: str | Path, force: bool, threaded: bool
              ) -> dict[str, Any]:
    """Run the asynchronous pipeline with processes (AReaL-style) or threads (baseline)."""
    tasks = preflight(cfg)
    set_threads(cfg)
    # Built before the run directory is opened: a bad device or model config fails here.
    runtime = Runtime(cfg, Threads() if threaded else Processes())
    rec = RunRecorder(out_dir, force=force)
    try:
        runtime.launch()
        return _run(cfg, tasks, rec, runtime)
    finally:
        runtime.shutdown()
        rec.close()


def _run(cfg: RunConfig, tasks: list[Task], rec: RunRecorder, runtime: Runtime
         ) -> dict[str, Any]:
    cold_start_s = runtime.barrier(rec)
    controller = Controller(cfg, tasks, rec, runtime, runtime.n_trainer)
    rec.event("run_start", cold_start_s=cold_start_s)
    runtime.drive(controller)
    wall_s = rec.since_start(controller.t_done)
    runtime.stop(controller)
    controller.flush_buffer()

    spans = controller.spans
    busy = {role: sum(e - s for s, e in merge_spans(sp)) for role, sp in spans.items()}
    busy["reward"] = controller.controller_s
    stopped = [runtime.stopped[f"rollout{i}"] for i in range(runtime.n_rollout)]
    summary = build_summary(
        cfg, samples=controller.samples, updates=controller.updates, wall_s=wall_s,
        cold_start_s=cold_start_s, busy=busy,
        overlap_s=overlap_seconds(merge_spans(spans["rollout"]), merge_spans(spans["trainer"])),
        tokens_sampled=sum(s.tokens_sampled for s in stopped),
        resubmissions=controller.resubmissions,
        interrupted_tokens=controller.interrupted_tokens,
        abandoned_tokens=sum(s.tokens_abandoned for s in stopped),
        reprefilled_tokens=sum(s.tokens_reprefilled for s in stopped),
        extra={"async": {**controller.async_stats(), "placement": {
            "cpus": {name: list(cpus) for name, cpus in runtime.cpus.items()},
            "unpinned_reason": runtime.unpinned_reason}}},
    )
    policy = HFPolicy(cfg.model, cfg.train, role="rollout", device=torch.device("cpu"))
    runtime.slots.read_into(runtime.slots.ordered(dict(policy.model.named_parameters())))
    devices = {role: str(d) for role, d in runtime.devices.items()}
    return finish_run(rec, policy, cfg, summary, controller.samples,
                      controller.token_staleness, {"devices": devices})


def async_areal_style(cfg: RunConfig, out_dir: str | Path, force: bool = False
                      ) -> dict[str, Any]:
    """The paper's `async_areal_style`: every role in its own spawned process."""
    return run_async(cfg, out_dir, force, threaded=False)

