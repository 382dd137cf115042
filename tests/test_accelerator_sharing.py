"""One accelerator that the rollout worker and the trainers share (`profile.accelerator`):
their device work slows each other's, host work does not; the times worked out by hand."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlcore.clock.profile import (
    HARDWARE_DIR,
    AcceleratorCost,
    ControllerCost,
    CpuCost,
    DecodeCost,
    RewardCost,
    TokenCost,
    load_profile,
)
from rlcore.clock.virtual import VirtualClock, VirtualFlag
from rlcore.clock.work import Decode, Handle, Reward, Update, Work
from rlcore.config import ConfigError
from tests.test_virtual_clock import profile, run_roles

# Each of these costs 1 s: decode and update on the device, a message and a reward on the host.
DECODE, UPDATE, HANDLE, REWARD = Decode(steps=1, rows=0, row_context=0), Update(tokens=0), \
    Handle(samples=0), Reward("exact")
ONE_SECOND = profile(decode=DecodeCost(step_s=1.0, per_row_s=0, per_row_context_s=0,
                                       gil_share=0),
                     update=TokenCost(call_s=1.0, per_token_s=0, gil_share=0),
                     controller=ControllerCost(message_s=1.0, per_sample_s=0),
                     reward=RewardCost(answer_s=1.0, code_s=0, math_s=0, gil_share=0))


def shared(slowdown: float | None, cpu: CpuCost | None = None) -> Any:
    """ONE_SECOND on one accelerator with this slowdown (None: an accelerator per role)."""
    return dataclasses.replace(
        ONE_SECOND, cpu=cpu or ONE_SECOND.cpu,
        accelerator=None if slowdown is None else AcceleratorCost(slowdown))


def ends(clock: VirtualClock, charges: dict[str, list[Work]], start: dict[str, float] | None = None
         ) -> dict[str, float]:
    """Each role charges its work in turn, from its start time (0 unless given); when each
    ends."""
    out: dict[str, float] = {}

    def role(name: str) -> Any:
        def fn() -> None:
            if (start or {}).get(name):
                VirtualFlag(clock).wait(timeout=(start or {})[name])
            for work in charges[name]:
                clock.charge(work)
            out[name] = clock.now()
        return fn

    run_roles(clock, {name: role(name) for name in charges})
    return out


@pytest.mark.parametrize("slowdown,end", [
    (1.0, 2.0),  # strict time-slicing: each runs at half speed throughout
    (0.5, 1.5),  # each runs at 1 / 1.5 of its speed
    (0.0, 1.0),  # no contention
    (None, 1.0),  # an accelerator each
])
def test_device_work_at_once_shares_the_accelerator(slowdown: float | None, end: float):
    clock = VirtualClock(shared(slowdown), seed=0)
    assert ends(clock, {"rollout": [DECODE], "trainer": [UPDATE]}) == pytest.approx(
        {"rollout": end, "trainer": end})


def test_staggered_device_work_is_stretched_while_both_compute():
    # the trainer starts at 0.5, when the rollout's decode has 0.5 s left; both at half speed
    # from then: the decode's last 0.5 s take 1 s (ends at 1.5), by which the update has done
    # 0.5 s, and its other 0.5 s run alone (2.0)
    clock = VirtualClock(shared(1.0), seed=0)
    assert ends(clock, {"rollout": [DECODE], "trainer": [UPDATE]},
                start={"trainer": 0.5}) == pytest.approx({"rollout": 1.5, "trainer": 2.0})


@pytest.mark.parametrize("cpu", [CpuCost(None, 0.0), CpuCost(cores=1, concurrent_slowdown=0.0)])
def test_host_work_is_not_slowed_by_the_accelerator(cpu: CpuCost):
    # the controller's message and reward run on the host beside two device computations:
    # 2 s of its own, whether or not it shares cores (it computes alone on them)
    clock = VirtualClock(shared(1.0, cpu), seed=0)
    assert ends(clock, {"rollout": [DECODE], "trainer": [UPDATE],
                        "controller": [HANDLE, REWARD]}) == pytest.approx(
        {"rollout": 2.0, "trainer": 2.0, "controller": 2.0})


def test_host_work_still_shares_the_cores_with_an_accelerator():
    # one core: two messages at once take 2 s, while the decode beside them takes its 1 s
    clock = VirtualClock(shared(1.0, CpuCost(cores=1, concurrent_slowdown=0.0)), seed=0)
    assert ends(clock, {"rollout": [DECODE], "controller": [HANDLE], "service": [REWARD]}
                ) == pytest.approx({"rollout": 1.0, "controller": 2.0, "service": 2.0})


def test_without_an_accelerator_the_cores_price_all_work_as_before():
    # one core and no accelerator: decode, update and a message share the core, each at a
    # third of its speed (3 s); with the accelerator the device work leaves the core
    one_core = CpuCost(cores=1, concurrent_slowdown=0.0)
    charges: dict[str, list[Work]] = {"rollout": [DECODE], "trainer": [UPDATE],
                                      "controller": [HANDLE]}
    assert ends(VirtualClock(shared(None, one_core), seed=0), charges) == pytest.approx(
        {"rollout": 3.0, "trainer": 3.0, "controller": 3.0})
    assert ends(VirtualClock(shared(0.0, one_core), seed=0), charges) == pytest.approx(
        {"rollout": 1.0, "trainer": 1.0, "controller": 1.0})


def test_the_threaded_baseline_ignores_the_accelerator():
    # gil_share 0: under the shared interpreter nothing is held, and the accelerator is not
    # applied (the baseline's model is the interpreter lock alone)
    clock = VirtualClock(shared(1.0), seed=0, shared_interpreter=True)
    assert ends(clock, {"rollout": [DECODE], "trainer": [UPDATE]}) == pytest.approx(
        {"rollout": 1.0, "trainer": 1.0})


# --- the profile file ---------------------------------------------------------------------


def write(tmp_path: Path, **changes: Any) -> Path:
    data = yaml.safe_load((HARDWARE_DIR / "cpu-2core.yaml").read_text())
    data.update(changes)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_profile_with_an_accelerator_loads(tmp_path: Path):
    p = load_profile(str(write(tmp_path, accelerator={"concurrent_slowdown": 0.5})))
    assert p.accelerator == AcceleratorCost(concurrent_slowdown=0.5)
    assert p.digest() != load_profile("cpu-2core").digest()


def test_the_accelerator_is_optional_and_may_be_null(tmp_path: Path):
    assert load_profile("cpu-2core").accelerator is None
    assert load_profile(str(write(tmp_path, accelerator=None))).accelerator is None


def test_a_profile_without_an_accelerator_keeps_its_digest(tmp_path: Path):
    """The digest of a file without the key is the digest of its sections as they were
    before `accelerator` existed, and of the same file with `accelerator: null`."""
    data = yaml.safe_load((HARDWARE_DIR / "cpu-2core.yaml").read_text())
    sections = {k: v for k, v in data.items() if isinstance(v, dict)}
    before = hashlib.sha256(json.dumps(sections, sort_keys=True).encode()).hexdigest()[:16]
    assert load_profile("cpu-2core").digest() == before
    assert load_profile(str(write(tmp_path, accelerator=None))).digest() == before


@pytest.mark.parametrize("bad,key", [
    ({"concurrent_slowdown": -0.5}, "accelerator.concurrent_slowdown"),
    ({}, "concurrent_slowdown"),
    ({"concurrent_slowdown": 1, "cores": 2}, "cores"),
])
def test_a_bad_accelerator_is_refused_naming_the_key(tmp_path: Path, bad: dict[str, Any],
                                                     key: str):
    with pytest.raises(ConfigError, match="p.yaml") as e:
        load_profile(str(write(tmp_path, accelerator=bad)))
    assert key in str(e.value)
