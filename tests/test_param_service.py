"""The parameter service's one decision, on the live weight slots and on the planner's store
without weights: a candidate from the current version whose update applied an optimizer step
is published at the next one, and its trainer stages next in the slot that was current;
anything else is skipped."""

from __future__ import annotations

import pytest
import torch

from rlcore.clock import WALL
from rlcore.plan.roles import Versions
from rlcore.policy.optim_steps import NO_STEP_APPLIED
from rlcore.runners.asynchronous.interfaces import WeightStore
from rlcore.runners.asynchronous.messages import CommitRequest
from rlcore.runners.asynchronous.param_service import ParamService
from rlcore.runners.asynchronous.vehicles import Threads
from rlcore.runners.asynchronous.weight_slots import WeightSlots


def live_slots() -> WeightSlots:
    slots = WeightSlots([("w", (2,), torch.float32)], 3, Threads().locked_array(5),
                        shared=False)
    slots.publish(0, 0)
    return slots


@pytest.mark.parametrize("make", [live_slots, lambda: Versions(8)], ids=["live", "plan"])
def test_commits_by_hand(make):
    store: WeightStore = make()
    service = ParamService(store, WALL)
    ack = service.commit(CommitRequest(trainer=0, batch_id=0, slot=1, base_version=0,
                                       updated=True))
    assert (ack.applied, ack.version, ack.next_slot) == (True, 1, 0)
    assert store.head() == (1, 1)
    # trainer 1's candidate was computed from version 0, which is no longer current
    lost = service.commit(CommitRequest(1, 1, 2, base_version=0, updated=True))
    assert (lost.applied, lost.version, lost.next_slot) == (False, 1, 2)
    assert lost.reason == "stale base (candidate from v0, current v1)"
    # its update applied no optimizer step (the fp16 loss scaler skipped every one)
    idle = service.commit(CommitRequest(0, 2, 0, base_version=1, updated=False))
    assert (idle.applied, idle.version, idle.next_slot) == (False, 1, 0)
    assert idle.reason == NO_STEP_APPLIED
    assert store.head() == (1, 1)  # nothing moved
