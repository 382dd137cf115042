"""The scheduling core driven by hand, without a model, a ledger or a clock that moves by
itself: each decision's outcome is worked out beside its assertion."""

from __future__ import annotations

from typing import Any

import pytest

from rlcore.config import config_from_dict
from rlcore.runners.asynchronous.messages import PromptSlot
from rlcore.runners.asynchronous.scheduling import Accepted, SchedulingCore
from rlcore.tasks.suites import Task
from tests.conftest import small_config

B, G = 4, 2  # batch size, group size: a batch is two whole groups


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


class Sent:
    """The prompt queue: every message the core's dispatcher put on it."""

    def __init__(self) -> None:
        self.items: list[list[PromptSlot]] = []

    def put(self, item: Any) -> None:
        self.items.append(item)

    def get(self, *, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def get_nowait(self) -> Any:
        raise NotImplementedError


class Recorder:
    """What a caller hears: stale drops (payload, version) and batches sent."""

    def __init__(self) -> None:
        self.stale: list[tuple[str, int]] = []
        self.batches: list[tuple[int, int, int, list[str]]] = []

    def dropped_stale(self, payload: str, version: int) -> None:
        self.stale.append((payload, version))

    def send(self, trainer: int, batch_id: int, base_version: int,
             items: list[Accepted[str]]) -> str:
        self.batches.append((trainer, batch_id, base_version, [i.payload for i in items]))
        return f"sent{batch_id}"


def make_core(k: int = 1, control: str = "filter", trainers: int = 1, retries: int = 1,
              ratio: float | None = None
              ) -> tuple[SchedulingCore[str], Recorder, Sent, ManualClock]:
    cfg = config_from_dict(small_config(
        "unused", mode="areal", rollout={"group_size": G},
        train={"updates": 10, "update_batch_size": B},
        staleness={"staleness_k": k, "staleness_control": control, "max_retries": retries,
                   "rollout_train_ratio": ratio},
        runtime={"trainer_workers": trainers}))
    tasks = [Task(f"t{i}", f"{i}+1=", str(i + 1)) for i in range(20)]
    recorder, sent, clock = Recorder(), Sent(), ManualClock()
    core = SchedulingCore(cfg, tasks, sent, trainers, clock, recorder)
    return core, recorder, sent, clock


def slots_of(sent: Sent) -> list[PromptSlot]:
    return [s for message in sent.items for s in message]


class TestArrivalAndBatches:
    def test_the_first_pump_sends_two_batches_of_slots_as_one_message(self):
        core, _, sent, _ = make_core()
        core.pump()
        (message,) = sent.items
        # 2B = 8 slots: four prompts of G = 2, group ids in order
        assert [s.group_id for s in message] == [0, 0, 1, 1, 2, 2, 3, 3]
        assert len(core.groups) == 4 and core.dispatch.in_flight == 8

    def test_two_resolved_groups_make_a_batch_for_the_idle_trainer(self):
        core, rec, sent, _ = make_core()
        core.pump()
        for s in slots_of(sent)[:4]:  # groups 0 and 1 come back, sampled at version 0
            assert core.arrive(s.group_id, f"s{s.slot_id}", rollout_version=0)
        assert core.buffered() == 4
        core.pump()
        assert rec.batches == [(0, 0, 0, ["s0", "s1", "s2", "s3"])]
        assert core.buffered() == 0 and core.base_version() == 1  # 0 applied + 1 in training

    def test_a_group_waits_until_every_slot_is_resolved(self):
        core, rec, sent, _ = make_core()
        core.pump()
        first = slots_of(sent)[0]
        core.arrive(first.group_id, "s0", rollout_version=0)
        assert core.buffered() == 0 and first.group_id in core.groups  # its twin is out

    def test_filter_drops_on_arrival_what_is_staler_than_k(self):
        core, rec, sent, _ = make_core(k=1)
        core.pump()
        core.applied = 3  # three commits heard: a sample of version 1 has staleness 2 > K
        s = slots_of(sent)[0]
        assert not core.arrive(s.group_id, "old", rollout_version=1)
        assert rec.stale == [("old", 3)]
        assert core.manager.accepted == 0 and core.manager.running == 7

    def test_throttle_alone_accepts_on_arrival_and_checks_at_batch_formation(self):
        core, rec, sent, _ = make_core(k=1, control="throttle")
        core.pump()
        core.applied = 3
        a, b = slots_of(sent)[:2]  # group 0, both sampled at version 1: staleness 2 > K
        assert core.arrive(a.group_id, "a", rollout_version=1)
        assert core.arrive(b.group_id, "b", rollout_version=1)
        core.pump()  # base version 3: 3 - 1 > K, both dropped when a batch is formed
        assert rec.stale == [("a", 3), ("b", 3)] and rec.batches == []
        assert core.manager.accepted == 0  # their capacity given back


class TestCuts:
    def test_a_cut_with_retries_left_goes_first_in_the_next_message(self):
        core, _, sent, _ = make_core(retries=1)
        core.pump()
        cut = slots_of(sent)[3]
        assert core.cut(cut)  # attempt 0 < max_retries 1
        core.pump()
        assert sent.items[-1][0].slot_id == cut.slot_id and sent.items[-1][0].attempt == 1

    def test_the_last_attempt_is_dropped_and_resolves_its_slot(self):
        core, _, sent, _ = make_core(retries=0)
        core.pump()
        a, b = slots_of(sent)[:2]
        core.arrive(a.group_id, "a", rollout_version=0)
        assert not core.cut(b)
        # the group resolved with one member: it waits in the buffer as a group of one
        assert list(core.ready) == [[Accepted("a", 0, 0)]]


class TestCommits:
    def test_an_applied_commit_moves_the_version_and_a_skipped_one_gives_capacity_back(self):
        core, rec, sent, _ = make_core(k=1)
        core.pump()
        for s in slots_of(sent):
            core.arrive(s.group_id, f"s{s.slot_id}", rollout_version=0)
        core.pump()  # one trainer takes two batches: the one it trains and the next
        assert [b[:3] for b in rec.batches] == [(0, 0, 0), (0, 1, 1)]
        assert core.manager.accepted == 8
        done = core.committed(0, trainer=0, applied=True)
        assert (done.base_version, done.sent, core.applied) == (0, "sent0", 1)
        assert core.manager.accepted == 8 - 4 + 4  # trained B: eq. 1 credits the version B
        skipped = core.committed(1, trainer=0, applied=False)
        assert skipped.base_version == 1 and core.applied == 1
        assert core.manager.accepted == 4  # its four samples will never be trained

    def test_two_trainers_take_one_batch_each_the_least_busy_first(self):
        core, rec, sent, _ = make_core(trainers=2)
        core.pump()
        for s in slots_of(sent):
            core.arrive(s.group_id, f"s{s.slot_id}", rollout_version=0)
        core.pump()
        assert [(t, bid, base) for t, bid, base, _ in rec.batches] == [(0, 0, 0), (1, 1, 1)]
        core.committed(0, trainer=0, applied=True)
        assert core.outstanding == [0, 1]

    def test_leftover_is_the_buffer_then_the_unresolved_groups(self):
        core, _, sent, _ = make_core()
        core.pump()
        s = slots_of(sent)
        core.arrive(s[0].group_id, "a", 0)
        core.arrive(s[1].group_id, "b", 0)  # group 0 resolved, in the buffer
        core.arrive(s[2].group_id, "c", 0)  # group 1 still has a slot out
        assert [i.payload for i in core.leftover()] == ["a", "b", "c"]
        assert core.buffered() == 0


class TestWaits:
    def test_throttle_and_an_idle_trainer_are_timed_from_pump_to_pump(self):
        core, _, sent, clock = make_core(k=0, control="throttle")
        core.pump()
        # K = 0: eq. 1 admits (0 + 0 + 1) x B = 4 samples, not the 2B rollout could take
        assert len(slots_of(sent)) == 4
        clock.t = 0.5
        core.pump()
        assert core.waits["rollout_throttle_s"] == pytest.approx(0.5)
        assert core.waits["trainer_data_s"] == pytest.approx(0.5)

    def test_rollout_train_ratio_holds_the_trainer_until_enough_was_generated(self):
        core, rec, sent, clock = make_core(ratio=2.0)
        core.pump()
        for s in slots_of(sent)[:4]:
            core.arrive(s.group_id, f"s{s.slot_id}", 0)
        core.pump()  # 4 generated < beta x B x 1 = 8: no batch yet
        assert rec.batches == []
        clock.t = 1.0
        for s in slots_of(sent)[4:]:
            core.arrive(s.group_id, f"s{s.slot_id}", 0)
        core.pump()  # 8 generated: the first batch goes
        assert core.waits["trainer_ratio_s"] == pytest.approx(1.0)
        assert [b[1] for b in rec.batches] == [0]

    def test_the_ratio_yields_when_the_throttle_stops_rollout_and_nothing_is_in_flight(self):
        core, rec, sent, _ = make_core(k=0, control="throttle", ratio=2.0)
        core.pump()  # K = 0: eq. 1 admits one batch, B = 4 samples
        for s in slots_of(sent):
            core.arrive(s.group_id, f"s{s.slot_id}", 0)
        # 4 generated < beta x B = 8, so the ratio would hold the trainer; but the throttle
        # admits nothing more until an update commits, and nothing is in flight or training:
        # held, neither side would ever move. The batch goes.
        core.pump()
        assert len(slots_of(sent)) == 4 and [b[1] for b in rec.batches] == [0]
