"""The virtual clock: the scheduler's order and times worked out by hand, the cost model,
hardware profiles, and whole runs that are a function of their config."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlcore.clock.processors import interpreter_speeds
from rlcore.clock.profile import (
    HARDWARE_DIR,
    AcceleratorCost,
    CommitCost,
    ControllerCost,
    CopyCost,
    CpuCost,
    DecodeCost,
    HandoffCost,
    HardwareProfile,
    RewardCost,
    TokenCost,
    load_profile,
)
from rlcore.clock.virtual import (
    VirtualClock,
    VirtualDeadlock,
    VirtualFlag,
    VirtualQueue,
)
from rlcore.clock.work import (
    Adapters,
    AllReduce,
    Commit,
    Decode,
    Handle,
    Handoff,
    Prefill,
    Reward,
    Update,
    Weights,
)
from rlcore.config import ConfigError, config_from_dict
from rlcore.record.rundir import read_jsonl
from rlcore.replay.replayer import replay_run
from rlcore.runners import run_mode
from tests.conftest import small_config


def profile(**terms: Any) -> HardwareProfile:
    """A profile whose every price is 0 unless given; gil_share 1 throughout."""
    base = HardwareProfile(
        name="test", machine="none", source="by hand", model_bytes=None,
        decode=DecodeCost(0, 0, 0, 1), prefill=TokenCost(0, 0, 1), update=TokenCost(0, 0, 1),
        weight_write=CopyCost(0, 1, 1), weight_read=CopyCost(0, 1, 1),
        reward=RewardCost(0, 0, 0, 1), controller=ControllerCost(0, 0), commit=CommitCost(0),
        cpu=CpuCost(None, 0.0))
    return dataclasses.replace(base, **terms)


# Update(tokens) costs `tokens` seconds: a role charges exactly what it names.
SECONDS = profile(update=TokenCost(call_s=0, per_token_s=1.0, gil_share=1.0))


class TestCostModel:
    def test_each_term_priced_by_hand(self):
        p = profile(decode=DecodeCost(step_s=1e-3, per_row_s=1e-4, per_row_context_s=1e-6,
                                      gil_share=1),
                    prefill=TokenCost(call_s=2e-3, per_token_s=1e-5, gil_share=1),
                    update=TokenCost(call_s=0.1, per_token_s=1e-4, gil_share=1),
                    weight_read=CopyCost(call_s=1e-3, gb_per_s=2.0, gil_share=1),
                    reward=RewardCost(answer_s=1e-5, code_s=0.05, math_s=1e-3, gil_share=1),
                    controller=ControllerCost(message_s=1e-4, per_sample_s=2e-5),
                    commit=CommitCost(call_s=3e-5))
        # 4 steps, 4 rows each at context 10..13: 4e-3 + 16e-4 + (4*(10+11+12+13))e-6
        assert p.seconds(Decode(steps=4, rows=16, row_context=184)) == pytest.approx(
            4e-3 + 1.6e-3 + 1.84e-4)
        assert p.seconds(Prefill(calls=2, tokens=100)) == pytest.approx(4e-3 + 1e-3)
        assert p.seconds(Update(tokens=1000)) == pytest.approx(0.1 + 0.1)
        # 4 GB at 2 GB/s plus the call
        assert p.seconds(Weights("read", 4 * 10**9)) == pytest.approx(2.001)
        assert p.seconds(Reward("code")) == 0.05 and p.seconds(Reward("answer")) == 1e-5
        assert p.seconds(Handle(samples=8)) == pytest.approx(1e-4 + 1.6e-4)
        assert p.seconds(Commit()) == 3e-5

    def test_a_handoff_is_free_until_a_profile_prices_it(self):
        assert not SECONDS.prices(Handoff(samples=32)) and SECONDS.seconds(Handoff(32)) == 0
        p = profile(handoff=HandoffCost(call_s=5e-4, per_sample_s=1e-5))
        # the batch's call plus 32 samples at 10 us: 0.5 ms + 0.32 ms
        assert p.prices(Handoff(32)) and p.seconds(Handoff(32)) == pytest.approx(8.2e-4)
        assert p.gil_share(Handoff(32)) == 1.0  # pickling and decoding are Python
        assert p.digest() != SECONDS.digest()

    def test_model_bytes_prices_the_profiles_model_not_the_runs(self):
        p = profile(weight_write=CopyCost(call_s=0, gb_per_s=1.0, gil_share=1),
                    model_bytes=2 * 10**9)
        assert p.seconds(Weights("write", 1000)) == pytest.approx(2.0)
        assert dataclasses.replace(p, model_bytes=None).seconds(
            Weights("write", 10**9)) == pytest.approx(1.0)

    def test_shipped_profiles_load(self):
        names = sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))
        assert "cpu-2core" in names
        for name in names:
            assert load_profile(name).name == name

    def test_a_bad_profile_names_its_file_and_key(self, tmp_path: Path):
        data = yaml.safe_load((HARDWARE_DIR / "cpu-2core.yaml").read_text())
        data["decode"]["per_row_s"] = -1
        del data["commit"]
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError, match="bad.yaml") as e:
            load_profile(str(bad))
        assert "decode.per_row_s" in str(e.value) and "commit" in str(e.value)

    def test_an_unknown_profile_lists_the_shipped_ones(self):
        with pytest.raises(ConfigError, match="cpu-2core"):
            load_profile("no-such-machine")

    def test_shipped_profiles_say_what_they_priced(self):
        """Every shipped profile priced transformers' forward (hf) and copies through shared
        host memory: the GPU ones on CUDA, cpu-2core on a CPU."""
        for path in sorted(HARDWARE_DIR.glob("*.yaml")):
            p = load_profile(path.stem)
            kind = "cpu" if path.stem == "cpu-2core" else "cuda"
            assert (p.decode_path, p.weight_transport, p.device_type) == ("hf", "host", kind)

    def test_what_a_profile_priced_is_no_cost_and_leaves_its_digest_alone(self):
        """The labels are not costs: a profile's digest, which every virtual run records,
        is the same with them and without them."""
        for path in sorted(HARDWARE_DIR.glob("*.yaml")):
            p = load_profile(path.stem)
            bare = dataclasses.replace(p, decode_path=None, weight_transport=None,
                                       device_type=None)
            assert p.digest() == bare.digest()
            assert p.seconds(Decode(4, 16, 400)) == bare.seconds(Decode(4, 16, 400))

    def test_a_profile_names_only_paths_that_exist(self, tmp_path: Path):
        data = yaml.safe_load((HARDWARE_DIR / "cpu-2core.yaml").read_text())
        data.update(decode_path="eager", device_type="gpu")
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError) as e:
            load_profile(str(bad))
        assert "'decode_path' is \"eager\"" in str(e.value) and "hf, static, graph" in str(e.value)
        assert "cpu, cuda" in str(e.value)


def run_roles(clock: VirtualClock, roles: dict[str, Any]) -> None:
    """Start each role's function on the clock, then let the main role wait them out."""
    done = VirtualQueue(clock)
    for name, fn in roles.items():
        def body(fn: Any = fn, name: str = name) -> None:
            fn()
            done.put(name)
        clock.start(name, body)
    for _ in roles:
        done.get()


class TestScheduler:
    def test_roles_interleave_in_virtual_time(self):
        clock = VirtualClock(SECONDS, seed=0)
        log: list[tuple[str, float]] = []

        def worker(name: str, cost: int, n: int) -> Any:
            def fn() -> None:
                for _ in range(n):
                    clock.charge(Update(tokens=cost))
                    log.append((name, clock.now()))
            return fn

        run_roles(clock, {"a": worker("a", 2, 3), "b": worker("b", 3, 2)})
        # a ends at 2, 4, 6; b at 3, 6. At 6 both wake: b asked for its wake-up when it was
        # at 3, a when it was at 4, so b runs first.
        assert log == [("a", 2), ("b", 3), ("a", 4), ("b", 6), ("a", 6)]

    def test_compute_keeps_charges_schedule(self):
        # The same roles as above, a computing through `compute`: the same times and order.
        clock = VirtualClock(SECONDS, seed=0)
        log: list[tuple[str, float]] = []

        def a() -> None:
            for _ in range(3):
                clock.compute(Update(tokens=2), lambda: None)
                log.append(("a", clock.now()))

        def b() -> None:
            for _ in range(2):
                clock.charge(Update(tokens=3))
                log.append(("b", clock.now()))

        run_roles(clock, {"a": a, "b": b})
        assert log == [("a", 2), ("b", 3), ("a", 4), ("b", 6), ("a", 6)]

    def test_compute_runs_while_the_next_role_has_the_baton(self):
        # a's computation can only finish once b has run: under `charge` (computing on the
        # baton) this would wait out its timeout; under `compute` b runs meanwhile.
        clock = VirtualClock(SECONDS, seed=0)
        b_ran = threading.Event()
        seen: list[tuple[str, bool, float]] = []

        def a() -> None:
            done = clock.compute(Update(tokens=2), lambda: b_ran.wait(timeout=30))
            seen.append(("a", done, clock.now()))

        def b() -> None:
            clock.charge(Update(tokens=1))
            b_ran.set()
            seen.append(("b", True, clock.now()))

        run_roles(clock, {"a": a, "b": b})
        assert seen == [("b", True, 1), ("a", True, 2)]

    def test_a_failed_compute_raises_in_its_turn(self):
        clock = VirtualClock(SECONDS, seed=0)
        order: list[str] = []

        def a() -> None:
            def fail() -> None:
                raise ValueError("bad")
            try:
                clock.compute(Update(tokens=2), fail)
            except ValueError:
                order.append(f"a failed at {clock.now():g}")

        def b() -> None:
            clock.charge(Update(tokens=1))
            order.append(f"b at {clock.now():g}")

        run_roles(clock, {"a": a, "b": b})
        assert order == ["b at 1", "a failed at 2"]

    def test_a_put_wakes_the_getter_at_the_putters_time(self):
        clock = VirtualClock(SECONDS, seed=0)
        q = VirtualQueue(clock)
        got: list[tuple[Any, float]] = []

        def producer() -> None:
            clock.charge(Update(tokens=5))
            q.put("x")

        def consumer() -> None:
            got.append((q.get(), clock.now()))

        run_roles(clock, {"consumer": consumer, "producer": producer})
        assert got == [("x", 5)]

    def test_a_get_times_out_in_virtual_time(self):
        clock = VirtualClock(SECONDS, seed=0)
        q = VirtualQueue(clock)
        with pytest.raises(queue.Empty):
            q.get(timeout=7.5)
        assert clock.now() == 7.5
        with pytest.raises(queue.Empty):
            q.get_nowait()  # no timeout: time stands still
        assert clock.now() == 7.5

    def test_a_flag_wait_returns_when_set(self):
        clock = VirtualClock(SECONDS, seed=0)
        flag = VirtualFlag(clock)
        seen: list[tuple[bool, float]] = []

        def setter() -> None:
            clock.charge(Update(tokens=2))
            flag.set()

        def waiter() -> None:
            seen.append((flag.wait(timeout=10), clock.now()))

        run_roles(clock, {"waiter": waiter, "setter": setter})
        assert seen == [(True, 2)]

    def test_a_shared_interpreter_serialises_held_seconds(self):
        # gil_share 1: two roles' work of 1 s each runs at half speed with one interpreter
        # (both end at 2), at full speed with an interpreter each (both at 1).
        ends = {}
        for shared in (False, True):
            clock = VirtualClock(SECONDS, seed=0, shared_interpreter=shared)
            out: list[float] = []

            def fn(clock: VirtualClock = clock, out: list[float] = out) -> None:
                clock.charge(Update(tokens=1))
                out.append(clock.now())

            run_roles(clock, {"a": fn, "b": fn})
            ends[shared] = out
        assert ends == {False: [1, 1], True: [2, 2]}

    def test_half_the_work_holding_the_interpreter_overlaps_the_rest(self):
        half = profile(update=TokenCost(call_s=0, per_token_s=1.0, gil_share=0.5))
        clock = VirtualClock(half, seed=0, shared_interpreter=True)
        out: list[float] = []

        def fn() -> None:
            clock.charge(Update(tokens=2))  # 2 s, half of them holding the lock
            out.append(clock.now())

        run_roles(clock, {"a": fn, "b": fn})
        assert out == [3, 3]  # each 1.5 times slower while both compute

    @pytest.mark.parametrize("shares,speeds", [
        ([1.0, 1.0], [0.5, 0.5]),  # serialised
        ([0.5, 0.5], [1 / 1.5, 1 / 1.5]),  # two of share g take 1 + g times as long
        ([1.0, 0.25], [0.8, 0.8]),  # a pair contends for the smaller share
        ([0.0, 1.0], [1.0, 1.0]),  # no lock held: no contention
        ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5]),  # each slowed by both others
        ([0.7], [1.0]),  # alone
    ])
    def test_interpreter_speeds(self, shares: list[float], speeds: list[float]):
        assert interpreter_speeds(shares) == pytest.approx(speeds)

    def test_computations_in_one_interpreter_contend_for_the_smaller_share(self):
        # a: 1 s of update at share 1; b from 0.5 s: 1 s of weight copy at share 0.25. Both
        # run 1.25 times slower together: a's last 0.5 s take 0.625 s (ends 1.125); b has
        # done 0.5 s by then, and runs its last 0.5 s alone (1.625).
        mixed = profile(update=TokenCost(call_s=0, per_token_s=1.0, gil_share=1.0),
                        weight_write=CopyCost(call_s=1.0, gb_per_s=1e9, gil_share=0.25))
        clock = VirtualClock(mixed, seed=0, shared_interpreter=True)
        out: dict[str, float] = {}

        def a() -> None:
            clock.charge(Update(tokens=1))
            out["a"] = clock.now()

        def b() -> None:
            clock.wait_for(lambda: False, object(), 0.5)
            clock.charge(Weights("write", 0))
            out["b"] = clock.now()

        run_roles(clock, {"a": a, "b": b})
        assert out == pytest.approx({"a": 1.125, "b": 1.625})

    @pytest.mark.parametrize("cpu,ends", [
        # one core: both at half speed from 0.5 s; a's last 0.5 s take 1 s (ends 1.5), then
        # b's last 0.5 s run alone (2.0)
        (CpuCost(cores=1, concurrent_slowdown=0.0), {"a": 1.5, "b": 2.0}),
        # two cores, each 1.5 times slower while both compute: a's last 0.5 s take 0.75 s
        # (1.25); b has done 0.5 s by then and runs its rest alone (1.75)
        (CpuCost(cores=2, concurrent_slowdown=0.5), {"a": 1.25, "b": 1.75}),
        # three cores, no slowdown: nothing is shared
        (CpuCost(cores=3, concurrent_slowdown=0.0), {"a": 1.0, "b": 1.5}),
    ])
    def test_computations_share_the_cores(self, cpu: CpuCost, ends: dict[str, float]):
        clock = VirtualClock(dataclasses.replace(SECONDS, cpu=cpu), seed=0)
        out: dict[str, float] = {}

        def a() -> None:
            clock.charge(Update(tokens=1))
            out["a"] = clock.now()

        def b_late() -> None:  # starts its second of work at 0.5 s
            VirtualFlag(clock).wait(timeout=0.5)
            clock.charge(Update(tokens=1))
            out["b"] = clock.now()

        run_roles(clock, {"a": a, "b": b_late})
        assert out == pytest.approx(ends)

    @pytest.mark.parametrize("links,ends", [
        # one link: three copies of 1 s, one of them from 0.5 s. a and b at half speed to 0.5
        # (0.25 s of work each), then all three at a third: a and b's last 0.75 s take 2.25 s
        # (2.75); c has done 0.75 s by then and its rest runs alone (3.0)
        (1, {"a": 2.75, "b": 2.75, "c": 3.0}),
        # two links: a and b at full speed (1.0); c shares with them from 0.5 s, each at 2/3:
        # a and b's last 0.5 s take 0.75 (1.25), c has done 0.5 s by then (1.75)
        (2, {"a": 1.25, "b": 1.25, "c": 1.75}),
        (None, {"a": 1.0, "b": 1.0, "c": 1.5}),  # a link each: nothing is shared
    ])
    def test_weight_copies_share_the_host_links(self, links: int | None,
                                                ends: dict[str, float]):
        gb = profile(weight_read=CopyCost(0, 1, 0), weight_write=CopyCost(0, 1, 0),
                     host_links=links)
        clock = VirtualClock(gb, seed=0)
        out: dict[str, float] = {}

        def copy(name: str, direction: Any, start: float) -> Any:
            def fn() -> None:
                if start:
                    VirtualFlag(clock).wait(timeout=start)
                clock.charge(Weights(direction, 10**9))  # 1 GB at 1 GB/s
                clock.charge(Update(tokens=0))  # other work is not the links'
                out[name] = clock.now()
            return fn

        run_roles(clock, {"a": copy("a", "write", 0), "b": copy("b", "read", 0),
                          "c": copy("c", "read", 0.5)})
        assert out == pytest.approx(ends)

    def test_every_role_blocked_forever_is_a_deadlock(self):
        clock = VirtualClock(SECONDS, seed=0)
        q = VirtualQueue(clock)
        clock.start("stuck", lambda: q.get())
        with pytest.raises(VirtualDeadlock, match="stuck"):
            VirtualQueue(clock).get()
        clock.close()

    def test_charged_seconds_are_summed_by_term(self):
        clock = VirtualClock(SECONDS, seed=0)
        clock.charge(Update(tokens=3))
        clock.charge(Update(tokens=4))
        assert clock.now() == 7
        assert clock.describe()["charged_s"] == {"update": 7}

    def test_work_side_by_side_takes_its_longest_share(self):
        # three devices' shares of 2 + 1, 4 and 3 seconds: the role resumes at 4, another
        # role charged 5 from 0 runs in between, and every share's work is charged by term
        clock = VirtualClock(SECONDS, seed=0)
        log: list[tuple[str, float]] = []

        def sides() -> None:
            with clock.side_by_side() as next_device:
                for i, share in enumerate([(2, 1), (4,), (3,)]):
                    if i:
                        next_device()
                    for tokens in share:
                        clock.charge(Update(tokens=tokens))
                    assert clock.now() == 0  # nothing passes until the shares are in
            log.append(("sides", clock.now()))
            clock.charge(Update(tokens=2))
            log.append(("sides", clock.now()))

        def other() -> None:
            clock.charge(Update(tokens=5))
            log.append(("other", clock.now()))

        run_roles(clock, {"sides": sides, "other": other})
        assert log == [("sides", 4), ("other", 5), ("sides", 6)]
        assert clock.describe()["charged_s"] == {"update": 2 + 1 + 4 + 3 + 2 + 5}
        assert clock.charged_by_role()["sides"] == 4 + 2

    def test_work_a_profile_leaves_out_takes_no_time_and_is_not_listed(self):
        clock = VirtualClock(SECONDS, seed=0)
        clock.charge(Handoff(samples=8))
        assert clock.now() == 0 and clock.describe()["charged_s"] == {}
        priced = VirtualClock(profile(handoff=HandoffCost(call_s=1.0, per_sample_s=0.5)),
                              seed=0)
        priced.charge(Handoff(samples=8))
        assert priced.now() == 5.0 and priced.describe()["charged_s"] == {"handoff": 5.0}


# --- whole runs ------------------------------------------------------------------------------

# The rollout's chunks cost about as much as an update, so that versions move during
# generation: samples go stale and generations are interrupted.
RUN_PROFILE = {
    "name": "test-run", "machine": "none", "source": "tests", "model_bytes": None,
    "decode": {"step_s": 2e-3, "per_row_s": 1e-4, "per_row_context_s": 1e-6, "gil_share": 0.8},
    "prefill": {"call_s": 1e-3, "per_token_s": 1e-5, "gil_share": 0.5},
    "update": {"call_s": 2e-2, "per_token_s": 5e-5, "gil_share": 0.3},
    "weight_write": {"call_s": 1e-4, "gb_per_s": 1.0, "gil_share": 0.1},
    "weight_read": {"call_s": 1e-4, "gb_per_s": 1.0, "gil_share": 0.1},
    "reward": {"answer_s": 1e-5, "code_s": 0.05, "math_s": 1e-3, "gil_share": 1.0},
    "controller": {"message_s": 1e-4, "per_sample_s": 2e-5},
    "commit": {"call_s": 1e-5},
    "cpu": {"cores": None, "concurrent_slowdown": 0.0},
}


def virtual_config(model_dir: Path, tmp: Path, mode: str, k: int, **staleness: Any) -> Any:
    hw = tmp / "test-run.yaml"
    if not hw.exists():
        hw.write_text(yaml.safe_dump(RUN_PROFILE))
    return config_from_dict(small_config(
        model_dir, mode=mode,
        train={"updates": 6, "update_batch_size": 8},
        rollout={"max_new_tokens": 5, "chunk_tokens": 1, "group_size": 4},
        staleness={"staleness_k": k, "max_retries": 1, **staleness},
        runtime={"progress_every": 0, "save_policy": False, "clock": "virtual",
                 "hardware": str(hw)}))


RECORDS = ("samples.jsonl", "updates.jsonl", "schedule.jsonl")


def records(run: Path) -> dict[str, str]:
    out = {f: hashlib.sha256((run / f).read_bytes()).hexdigest() for f in RECORDS}
    out["state"] = json.loads((run / "summary.json").read_text())[
        "reproducibility"]["state_digest"]
    return out


@pytest.fixture
def cpu_hog():
    """A process spinning on a core while the test runs (the wall clock would notice)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    hog.kill()
    hog.wait()


@pytest.mark.parametrize("interrupt", ["resubmit", "continue"])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("mode", ["async", "areal"])
def test_a_virtual_run_is_a_function_of_its_config(tiny_model_dir: Path, tmp_path: Path,
                                                   mode: str, k: int, interrupt: str,
                                                   request: pytest.FixtureRequest):
    cfg = virtual_config(tiny_model_dir, tmp_path, mode, k, interrupt=interrupt,
                         staleness_control="filter")
    first = run_mode(cfg, tmp_path / "first")
    drops = first["samples"]["dropped_stale"] + first["samples"]["dropped_interrupted"]
    assert drops > 0, "the test profile should make this run drop samples"
    request.getfixturevalue("cpu_hog")  # the second run shares the machine with a hog
    run_mode(cfg, tmp_path / "second")
    assert records(tmp_path / "first") == records(tmp_path / "second")
    assert first["clock"]["kind"] == "virtual" and first["clock"]["hardware"] == "test-run"


def test_staleness_zero_with_admission_control_ends_in_syncs_state(tiny_model_dir: Path,
                                                                    tmp_path: Path):
    """At K = 0 with admission control, every asynchronous batch is sync's batch: the same
    prompts, slots, draws and order, so the final weights agree bit for bit."""
    states = {}
    for mode in ("sync", "async", "areal"):
        extra = {} if mode == "sync" else {"staleness_control": "both",
                                           "interrupt": "continue"}
        cfg = virtual_config(tiny_model_dir, tmp_path, mode, 0, **extra)
        states[mode] = run_mode(cfg, tmp_path / mode)["reproducibility"]["state_digest"]
    assert states["async"] == states["areal"] == states["sync"]


def test_a_virtual_run_replays_bit_for_bit(tiny_model_dir: Path, tmp_path: Path):
    cfg = virtual_config(tiny_model_dir, tmp_path, "areal", 1, interrupt="resubmit",
                         staleness_control="filter")
    run_mode(cfg, tmp_path / "run")
    replay_run(tmp_path / "run", tmp_path / "replay")
    a, b = (read_jsonl(d / "samples.jsonl") for d in (tmp_path / "run", tmp_path / "replay"))
    assert [r["response_ids"] for r in a] == [r["response_ids"] for r in b]
    assert [r["status"] for r in a] == [r["status"] for r in b]
    s = [json.loads((d / "summary.json").read_text())["reproducibility"]["state_digest"]
         for d in (tmp_path / "run", tmp_path / "replay")]
    assert s[0] == s[1]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["clock"]["kind"] == "virtual"
    assert config["hardware_profile"]["decode"] == RUN_PROFILE["decode"]


def test_a_priced_handoff_holds_the_rollout_between_its_batches(tiny_model_dir: Path,
                                                                tmp_path: Path):
    """Each hand-off takes its price, recorded in its event, and the worker's next batch
    starts after it; on a profile without `handoff` the rollout hands over in no time."""
    def handoffs_and_gaps(run: Path) -> tuple[list[dict[str, Any]], list[float]]:
        events = read_jsonl(run / "events.jsonl")
        spans = [e for e in events if e["type"] == "span" and e["role"] == "rollout"]
        return ([e for e in events if e["type"] == "handoff"],
                [b["start"] - a["end"] for a, b in zip(spans, spans[1:], strict=False)])

    for name in ("free", "priced"):
        (tmp_path / name).mkdir()
    (tmp_path / "priced" / "test-run.yaml").write_text(yaml.safe_dump(
        {**RUN_PROFILE, "handoff": {"call_s": 1e-3, "per_sample_s": 1e-4}}))
    for name in ("free", "priced"):
        run_mode(virtual_config(tiny_model_dir, tmp_path / name, "areal", 2), tmp_path / name /
                 "run")
    free, free_gaps = handoffs_and_gaps(tmp_path / "free" / "run")
    priced, gaps = handoffs_and_gaps(tmp_path / "priced" / "run")
    assert free and all(e["handoff_s"] == 0 for e in free)
    assert min(free_gaps) == 0  # the next batch's prompts were waiting
    assert priced and all(e["handoff_s"] == pytest.approx(1e-3 + 1e-4 * e["samples"])
                          for e in priced)
    # one hand-off per gap but the last (recorded with a next batch that never came)
    assert len(priced) == len(gaps)
    assert all(g >= e["handoff_s"] - 1e-12 for g, e in zip(gaps, priced, strict=True))
    charged = json.loads((tmp_path / "priced" / "run" / "summary.json").read_text())[
        "clock"]["charged_s"]
    assert charged["handoff"] == pytest.approx(sum(e["handoff_s"] for e in priced), rel=0.2)


class TestCalibrate:
    def test_nonnegative_least_squares_by_hand(self):
        from rlcore.measure.timings import nonneg_lstsq

        # y = 2 + 3x exactly: both coefficients found, no residual
        fit = nonneg_lstsq([[1, 0], [1, 1], [1, 2]], [2, 5, 8])
        assert fit.coef == pytest.approx((2, 3)) and fit.residual == pytest.approx(0, abs=1e-12)
        # y falls with x: the free slope would be negative, so it is fixed at 0 and the
        # intercept is the mean, 2
        fit = nonneg_lstsq([[1, 0], [1, 1], [1, 2]], [3, 2, 1])
        assert fit.coef == pytest.approx((2, 0))

    def test_weight_copies_are_timed_at_three_sizes_that_fit_in_memory(self):
        import torch

        from rlcore.measure.copy_timings import weight_scales

        small = [("w", (10,), torch.float32)]  # 40 bytes: 1, 4 and 16 copies of it
        assert [len(s) for s in weight_scales(small, budget_bytes=100)] == [1, 4, 16]
        # 400 bytes over a 150-byte budget: a quarter, half and all of its tensors
        big = [(f"w{i}", (25,), torch.float32) for i in range(4)]
        assert weight_scales(big, budget_bytes=150) == [big[:1], big[:2], big]

    def test_what_the_measured_slowdown_is_charged_to(self):
        import torch

        from rlcore.measure.calibrate import sharing

        cpu, gpu0, gpu1 = torch.device("cpu"), torch.device("cuda:0"), torch.device("cuda:1")
        # on a CPU, the cores; on one GPU for both roles, the accelerator; on a GPU each,
        # only what the host shares
        assert sharing(cpu, cpu, 2, 0.1) == {"cpu": CpuCost(2, 0.1), "accelerator": None}
        assert sharing(gpu0, gpu0, 16, 0.2) == {"cpu": CpuCost(None, 0.0),
                                                "accelerator": AcceleratorCost(0.2)}
        assert sharing(gpu0, gpu1, 16, 0.2) == {"cpu": CpuCost(None, 0.2), "accelerator": None}

    def test_a_stamp_waits_for_the_device(self, monkeypatch: pytest.MonkeyPatch):
        """On a GPU a kernel launch returns before its kernel ends: each stamp waits for the
        work queued on the device first, so the work's device time is in its own stamp."""
        import time

        import torch

        from rlcore.measure import timings

        gpu = torch.device("cuda:0")
        waited: list[tuple[torch.device, ...]] = []

        def wait_for(devices: Any) -> None:  # the device still has 50 ms of queued work
            waited.append(tuple(devices))
            time.sleep(0.05)

        monkeypatch.setattr(timings, "wait_for", wait_for)
        clock = timings.StampClock([gpu])
        clock.mark()
        clock.charge(Prefill(calls=1, tokens=8))
        assert waited == [(gpu,)] * 3  # at the start, the mark and the charge
        [(work, seconds)] = clock.take()
        assert work == Prefill(calls=1, tokens=8) and seconds >= 0.05

    def test_weight_copies_are_timed_through_the_configs_transport(
            self, cfg: Any, monkeypatch: pytest.MonkeyPatch):
        """The slots timed are those the config's runtime.weight_transport resolves to (the
        device transport keeps no shared memory, so none is asked for)."""
        from rlcore.measure import copy_timings
        from rlcore.runners.asynchronous.weight_slots import WeightSlots

        built: list[dict[str, Any]] = []

        def slots(*args: Any, **kwargs: Any) -> WeightSlots:  # record, then copy on this CPU
            built.append(kwargs)
            return WeightSlots(*args, shared=False)

        monkeypatch.setattr(copy_timings, "WeightSlots", slots)
        monkeypatch.setattr(copy_timings, "shared_memory_free", lambda path="": 1024)
        monkeypatch.setattr(copy_timings, "resolve_transport", lambda setting, device: "device")
        write, read, transport = copy_timings.time_weights(cfg, 1)
        assert transport == "device" and len(built) == 3
        assert all(b["transport"] == "device" and not b["shared"] for b in built)
        assert write.n == read.n == 3

    @pytest.mark.slow
    def test_calibrate_writes_a_profile_that_loads(self, cfg: Any, tmp_path: Path):
        from rlcore.measure.calibrate import calibrate, write_profile

        profile, report = calibrate(cfg, "here", reps=1)
        out = tmp_path / "here.yaml"
        write_profile(profile, report, out)
        loaded = load_profile(str(out))
        assert loaded.name == "here" and "residual" in out.read_text()
        # the sampler and the update were timed: their prices are positive
        assert loaded.seconds(Decode(steps=1, rows=4, row_context=40)) > 0
        assert loaded.seconds(Update(tokens=100)) > 0
        # and a LoRA decode step's adapter products, whatever the config's train.lora
        assert loaded.adapters is not None
        assert loaded.seconds(Adapters(steps=1, rows=4, params=1000)) > 0
        # what it priced: the config's decode path and transport on this CPU
        assert (loaded.decode_path, loaded.weight_transport, loaded.device_type) == (
            "static", "host", "cpu")
        # and two gloo ranks summing gradients, so that it prices a trainer of ranks
        assert loaded.allreduce is not None
        assert loaded.seconds(AllReduce(calls=1, nbytes=10**8, ranks=2)) > 0
