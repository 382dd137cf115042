"""The staleness rules as pure functions, with values worked out by hand (no controller)."""

from __future__ import annotations

from rlcore.algo.staleness import (
    StalenessManager,
    accept_on_arrival,
    admission_capacity,
    fresh_for_batch,
    rollout_version,
    staleness,
    token_staleness,
)


class TestStalenessOfASample:
    def test_the_oldest_token_decides(self):
        # a response continued across versions 3, 3, 4, 5 counts as sampled by version 3
        assert rollout_version([3, 3, 4, 5], current_version=6) == 3
        assert staleness(6, rollout_version([3, 3, 4, 5], 6)) == 3

    def test_an_empty_response_counts_as_current(self):
        assert rollout_version([], current_version=7) == 7

    def test_never_negative(self):
        # the rollout can load a version the controller has not yet seen committed
        assert staleness(current_version=4, rollout_version=5) == 0

    def test_per_token(self):
        assert token_staleness(6, [3, 4, 6]) == [3, 2, 0]


class TestAdmission:
    def test_capacity_formula(self):
        # (v + K + 1) * B - (accepted + running) = (2 + 1 + 1) * 8 - (10 + 5) = 17
        assert admission_capacity(version=2, k=1, batch_size=8, accepted=10, running=5) == 17

    def test_k0_allows_one_batch_beyond_training(self):
        # (0 + 0 + 1) * 4 - (0 + 4) = 0: the batch for version 0 is out, nothing more
        assert admission_capacity(0, 0, 4, accepted=0, running=4) == 0
        assert admission_capacity(1, 0, 4, accepted=0, running=4) == 4  # after one update

    def test_over_capacity_is_negative(self):
        assert admission_capacity(0, 0, 4, accepted=3, running=3) == -2


class TestFilters:
    def test_arrival_filter_drops_only_staler_than_k(self):
        assert accept_on_arrival(2, k=2, filter_on=True)
        assert not accept_on_arrival(3, k=2, filter_on=True)

    def test_arrival_filter_off_accepts_everything(self):
        assert accept_on_arrival(99, k=0, filter_on=False)

    def test_batch_check_is_against_the_updates_base(self):
        # trained from base 5, a sample of version 3 has staleness 2
        assert fresh_for_batch(base_version=5, rollout_version=3, k=2)
        assert not fresh_for_batch(base_version=6, rollout_version=3, k=2)


class TestStalenessManager:
    def test_capacity_formula(self):
        m = StalenessManager(k=1, batch_size=4)
        # (v + K + 1) * B - (accepted + running) = (0 + 1 + 1) * 4 - 0
        assert m.capacity(version=0) == 8
        m.submitted(6)
        assert m.capacity(0) == 2
        for _ in range(5):
            m.returned(accepted=True)
        m.returned(accepted=False)  # a dropped sample frees its place
        assert m.capacity(0) == 3  # 8 - (5 + 0)
        assert m.capacity(1) == 7  # one update later: (1 + 2) * 4 - 5
        m.released(2)  # accepted samples dropped before training give capacity back
        assert m.capacity(0) == 5

    def test_k0_allows_one_batch_at_a_time(self):
        m = StalenessManager(k=0, batch_size=4)
        m.submitted(4)
        assert m.capacity(0) == 0  # the batch for version 0 is out; nothing more until v1

    def test_a_short_batch_uses_a_whole_batch_of_capacity(self):
        m = StalenessManager(k=1, batch_size=8)
        m.submitted(16)
        for _ in range(16):
            m.returned(accepted=True)
        assert m.capacity(0) == 0  # (0 + 1 + 1) * 8 - 16
        m.trained(7)  # an update trained 7 whole-group samples; 9 are still buffered
        # (1 + 1 + 1) * 8 - (16 + 1) = 7 = (K + 1) * B - 9 buffered, as after a full batch;
        # without the empty place counted it would be 8, one more every short batch
        assert m.capacity(1) == 7
        m.trained(8)  # a full batch changes nothing
        assert m.capacity(2) == 15  # 32 - 17: the 8 trained left, 1 buffered
