"""The virtual clock: a discrete-event scheduler that runs a run's roles one at a time.

The roles are the live runners' own code, each on a thread of this process (as in
FoundationDB's simulation), but only the one holding the baton runs. A role gives the baton
up in two ways only:
  charge(work)   it has just computed `work`: it sleeps for the work's price on the hardware
                 profile, so what it sends next is sent at the end of that computation;
  wait_for(...)  it blocks on a queue or a flag (`VirtualQueue`, `VirtualFlag`) until
                 another role puts or sets it, or until its timeout passes in virtual time.
The baton then goes to the role with the earliest wake-up time. Ties go to the role that
became runnable first (a sequence number taken when its wake-up time was set), which is
itself decided by the order of the roles' actions, so the whole interleaving is a function
of the run's config: no wall time, thread timing or machine load enters it.

Each computation is really executed, while virtual time stands still; a role sees the
others' state as it was when its computation began, and others see its results when the
computation's price has passed. A computation whose work is known before it runs, and which
touches only its role's own state (`compute`: a prefill, an update), is booked first and run
after the baton has passed on, so that it runs in real time beside the roles that come next:
the schedule is the same, decided before the computation's results exist, and the run takes
less of the machine's time. The roles computing at once share processors, each pool
slowing its computations by how many run at once: under the threaded baseline
(`shared_interpreter`) one interpreter lock, whose `gil_share` of each price
(`profile.py`) slows the others; otherwise the cores (`profile.cpu`), and one accelerator
for their device work when the profile has one (`profile.accelerator`), and the host's
links for weight copies when they share a few (`profile.host_links`). The end of each
computation is worked out anew whenever one in its pool starts or ends. A role that works
on several devices at once (`side_by_side`: sync on N devices) is charged its longest share.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlcore.clock.drift import Drift
from rlcore.clock.processors import Pool, interpreter_speeds, shared_speed, uniform
from rlcore.clock.profile import DEVICE_WORK, HardwareProfile, load_profile
from rlcore.clock.work import Weights, Work, WorkTally
from rlcore.config import LoraConfig, RuntimeConfig

MAIN = "controller"  # the role of the thread that creates the clock
R = TypeVar("R")


class Cancelled(BaseException):
    """Raised in a role waiting for its turn when the run ends (`VirtualClock.close`)."""


class VirtualDeadlock(RuntimeError):
    """Every role waits on a queue or flag that no runnable role can ever fill."""


@dataclass(eq=False)
class _Role:
    name: str
    baton: threading.Event = field(default_factory=threading.Event)
    wake: float | None = None  # when it may run again (None: running, or only when notified)
    seq: int = 0  # tie-break among roles waking at the same time: first set, first run
    waiting: object | None = None  # the queue or flag it is blocked on
    left: bool = False  # its function has returned
    pool: Pool[_Role] | None = None  # the processors it is computing on now, when shared
    charged: float = 0.0  # seconds of work it has been charged, at full speed
    tally: WorkTally = field(default_factory=WorkTally)  # its work since it last took it
    drift: Drift | None = None  # its speed's drift, when the profile has one
    # while it works on several devices side by side (`side_by_side`): each device's seconds
    lanes: list[float] | None = None


class VirtualClock:
    """Virtual time and the baton that decides which role runs."""

    virtual: bool = True

    def __init__(self, profile: HardwareProfile, *, seed: int,
                 shared_interpreter: bool = False):
        self.profile: HardwareProfile | None = profile
        self._costs = profile
        self.seed = seed  # seeds each role's drift (`drift.py`), when the profile has one
        self.shared_interpreter = shared_interpreter
        self._now = 0.0
        # Shared processors: the threaded baseline's one interpreter; else the cores
        # (`profile.cpu`), and an accelerator that the roles' device work shares
        # (`profile.accelerator`); None: each role has its own.
        sharing = not shared_interpreter and (
            profile.cpu.cores is not None or profile.cpu.concurrent_slowdown > 0)
        cpu, device = profile.cpu, profile.accelerator
        self._interpreter = Pool[_Role](interpreter_speeds) if shared_interpreter else None
        self._cpu = (Pool[_Role](uniform(lambda n: shared_speed(n, cpu.cores,
                                                           cpu.concurrent_slowdown)))
                     if sharing else None)
        self._accelerator = (
            Pool[_Role](uniform(lambda n: shared_speed(n, None, device.concurrent_slowdown)))
            if not shared_interpreter and device is not None else None)
        links = profile.host_links  # the weight copies' links, when they share a few
        self._links = (Pool[_Role](uniform(lambda n: shared_speed(n, links, 0.0)))
                       if not shared_interpreter and links is not None else None)
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._roles: list[_Role] = []
        self.closed = False
        self._failure: BaseException | None = None
        self._main = self._add(MAIN)
        self._local.role = self._main
        self.charged: dict[str, float] = {}  # seconds charged, by term

    @classmethod
    def of(cls, runtime: RuntimeConfig, *, seed: int, lora: LoraConfig | None,
           shared_interpreter: bool = False) -> VirtualClock:
        """The clock of `runtime.hardware` for a run of `seed` (training `lora` adapters, if
        set: `HardwareProfile.under`), its main role the calling thread."""
        profile = load_profile(runtime.hardware).under(lora)
        profile.check_ranks(runtime.trainer_ranks)
        return cls(profile, seed=seed, shared_interpreter=shared_interpreter)

    # --- the roles' view ------------------------------------------------------------------
    def now(self) -> float:
        return self._now

    def charge(self, work: Work) -> None:
        """The caller computed `work`: it resumes once the work's price has passed."""
        me = self._book(work)
        if me is not None:
            self._switch(me)

    def compute(self, work: Work, fn: Callable[[], R]) -> R:
        """Book `work` now, pass the baton on, then run `fn` (which must touch only the
        caller's own state) while the next roles run; resume, as `charge` does, once the
        work's price has passed."""
        me = self._book(work)
        if me is None:
            return fn()
        passed = self._pass(me)
        try:
            return fn()
        finally:  # its result, or its failure, comes out in its turn
            if passed:
                self._wait_turn(me)

    def _book(self, work: Work) -> _Role | None:
        """Account `work` to the caller and set when it resumes; the caller, if it must give
        the baton up (None: the work is free or the run has ended)."""
        seconds = self._costs.seconds(work)
        role = getattr(self._local, "role", None)
        if role is not None and role.drift is not None and seconds > 0 and not self.closed:
            seconds *= role.drift.factor(self._now)
        if self._costs.prices(work):  # work the profile leaves out is not listed as charged
            term = type(work).__name__.lower()
            self.charged[term] = self.charged.get(term, 0.0) + seconds
        if self.closed:
            return None
        if role is not None:
            role.tally.add(work)
            if role.lanes is not None:  # on one of several devices: added up at the end
                role.lanes[-1] += max(0.0, seconds)
                return None
        if seconds <= 0:
            return None
        me = self._me()
        me.charged += seconds
        pool = self._pool(work)
        with self._lock:
            if pool is None:
                self._set_wake(me, self._now + seconds)
            else:
                self._progress(pool)
                pool.busy[me] = seconds
                pool.share[me] = self._costs.gil_share(work)
                me.pool = pool
                self._rewake(pool)
        return me

    @contextmanager
    def side_by_side(self) -> Iterator[Callable[[], None]]:
        """The work the calling role charges within runs on devices of its own at once: the
        function yielded starts the next device's share, and at the end the role is charged
        the longest share (sync on several devices: each generates its share of a batch)."""
        me = self._me()
        if me.lanes is not None:
            raise RuntimeError(f"role {me.name!r} is on several devices already")
        lanes = me.lanes = [0.0]
        try:
            yield lambda: lanes.append(0.0)
        finally:
            me.lanes = None
        longest = max(lanes)
        if longest > 0 and not self.closed:
            me.charged += longest
            with self._lock:
                self._set_wake(me, self._now + longest)
            self._switch(me)

    def take_work(self) -> dict[str, float]:
        return self._me().tally.take()

    def wait_for(self, ready: Callable[[], bool], channel: object, timeout: float | None
                 ) -> bool:
        """Block until `ready()` (re-checked whenever `channel` is notified) or until
        `timeout` virtual seconds pass; returns ready()."""
        if ready() or self.closed or (timeout is not None and timeout <= 0):
            return ready()
        me = self._me()
        deadline = None if timeout is None else self._now + timeout
        while True:
            with self._lock:
                me.waiting = channel
                if deadline is not None:
                    self._set_wake(me, deadline)
            self._switch(me)
            if ready() or self.closed:
                return ready()
            if deadline is not None and self._now >= deadline:
                return False

    def notify(self, channel: object) -> None:
        """`channel` changed: every role blocked on it may run now."""
        with self._lock:
            for role in self._roles:
                if role.waiting is channel and not role.left:
                    role.waiting = None
                    self._set_wake(role, self._now)

    def describe(self) -> dict[str, Any]:
        return {"kind": "virtual", "hardware": self._costs.name,
                "profile_digest": self._costs.digest(),
                "charged_s": {k: self.charged[k] for k in sorted(self.charged)}}

    # --- the vehicle's view ---------------------------------------------------------------
    def start(self, name: str, target: Callable[[], None]) -> threading.Thread:
        """Run `target` as a new role, first runnable now (after any already runnable now)."""
        with self._lock:
            role = self._add(name)
            self._set_wake(role, self._now)

        def body() -> None:
            self._local.role = role
            try:
                self._wait_turn(role)
                target()
            except Cancelled:
                pass
            finally:
                self._leave(role)

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        return thread

    def charged_by_role(self) -> dict[str, float]:
        """Seconds of work each role has been charged, at full speed: its busy time."""
        return {r.name: r.charged for r in self._roles}

    def ended(self) -> list[str]:
        """The roles whose function has returned."""
        return [r.name for r in self._roles if r.left]

    def close(self) -> None:
        """End the schedule: every role still waiting for its turn raises Cancelled."""
        with self._lock:
            self.closed = True
            for role in self._roles:
                role.baton.set()

    # --- scheduling -----------------------------------------------------------------------
    def _add(self, name: str) -> _Role:
        drift = self._costs.drift
        role = _Role(name, drift=None if drift is None else
                     Drift(drift.sd, drift.time_s, self.seed, name))
        self._roles.append(role)
        return role

    def _me(self) -> _Role:
        role = getattr(self._local, "role", None)
        if role is None:
            raise RuntimeError(f"thread {threading.current_thread().name!r} is not a role of "
                               "this virtual clock: only roles may wait or be charged")
        return role

    def _pool(self, work: Work) -> Pool[_Role] | None:
        """The shared processors that compute `work`; None: the role's own."""
        if self._interpreter is not None:
            return self._interpreter
        if self._links is not None and isinstance(work, Weights):
            return self._links
        if self._accelerator is not None and isinstance(work, DEVICE_WORK):
            return self._accelerator
        return self._cpu

    def _progress(self, pool: Pool[_Role]) -> None:
        """Count the work done by the pool's computing roles since `pool.at` (under the
        lock)."""
        if pool.busy and self._now > pool.at:
            for role, speed in pool.speed().items():
                pool.busy[role] -= (self._now - pool.at) * speed
        pool.at = self._now

    def _rewake(self, pool: Pool[_Role]) -> None:
        """Each of the pool's computing roles' end at its current speed, which changes
        whenever a computation on the pool starts or ends (under the lock)."""
        for role, speed in pool.speed().items():
            self._set_wake(role, self._now + max(0.0, pool.busy[role]) / speed)

    def _resume(self, role: _Role) -> None:
        """`role` runs again: time moves to its wake-up; a computation of its has ended."""
        assert role.wake is not None
        self._now = max(self._now, role.wake)
        role.wake, role.waiting = None, None
        pool, role.pool = role.pool, None
        if pool is not None:
            self._progress(pool)
            del pool.busy[role], pool.share[role]
            self._rewake(pool)

    def _set_wake(self, role: _Role, t: float) -> None:
        role.wake, role.seq = t, next(self._seq)

    def _next(self) -> _Role | None:
        runnable = [r for r in self._roles if r.wake is not None and not r.left]
        return min(runnable, key=lambda r: (r.wake, r.seq), default=None)

    def _hand(self, role: _Role) -> None:
        """Give `role` the baton (under the lock)."""
        self._resume(role)
        role.baton.set()

    def _switch(self, me: _Role) -> None:
        if self._pass(me):
            self._wait_turn(me)

    def _pass(self, me: _Role) -> bool:
        """Hand the baton to the next role; False if that is `me` (it runs on at once)."""
        with self._lock:
            nxt = self._next()
            if nxt is None:
                self._deadlock(me)  # raises in the main role; else wakes it to raise there
                nxt = self._next()
            assert nxt is not None
            if nxt is me:
                self._resume(me)
                return False
            me.baton.clear()
            self._hand(nxt)
        return True

    def _wait_turn(self, me: _Role) -> None:
        me.baton.wait()
        if self._failure is not None and me is self._main:
            failure, self._failure = self._failure, None
            raise failure
        if self.closed and me is not self._main:
            raise Cancelled

    def _deadlock(self, me: _Role) -> None:
        """No role can ever run again: fail the run from the main role."""
        blocked = ", ".join(r.name for r in self._roles if not r.left)
        err = VirtualDeadlock(f"virtual clock deadlock at t={self._now:.6f}s: every role "
                              f"({blocked}) waits on a queue or flag with no timeout")
        if me is self._main:
            raise err
        self._failure = err
        self._set_wake(self._main, self._now)

    def _leave(self, me: _Role) -> None:
        with self._lock:
            me.left = True
            me.wake = me.waiting = None
            if self.closed:
                return
            nxt = self._next()
            if nxt is None:
                self._deadlock(me)
                nxt = self._next()
            assert nxt is not None
            self._hand(nxt)


class VirtualQueue:
    """A FIFO whose blocking `get` waits in virtual time."""

    def __init__(self, clock: VirtualClock):
        self._clock = clock
        self._items: deque[Any] = deque()

    def put(self, obj: Any) -> None:
        self._items.append(obj)
        self._clock.notify(self)

    def get(self, *, timeout: float | None = None) -> Any:
        if not self._clock.wait_for(lambda: bool(self._items), self, timeout):
            raise queue.Empty
        return self._items.popleft()

    def get_nowait(self) -> Any:
        return self.get(timeout=0)

    def empty(self) -> bool:
        return not self._items


class VirtualFlag:
    """A one-way switch whose `wait` waits in virtual time."""

    def __init__(self, clock: VirtualClock):
        self._clock = clock
        self._set = False

    def set(self) -> None:
        self._set = True
        self._clock.notify(self)

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        return self._clock.wait_for(lambda: self._set, self, timeout)
