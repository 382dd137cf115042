"""The staleness rules of bounded-staleness training, as pure functions (paper §4.2, AReaL).

A sample's staleness is `v - v_rollout`, where `v_rollout` is the version of its *oldest*
token: under `interrupt: continue` a response spans versions, and its oldest token is the
one furthest from the policy being trained (the newest-token reading would admit tokens
older than K). The bound is applied at three places, each a function here:

  * admission (`admission_capacity`, AReaL eq. 1): how many more samples rollout may start;
  * arrival (`accept_on_arrival`, the paper's Listing 1): a finished sample against the
    current version, when the `filter` control is on;
  * batch formation (`fresh_for_batch`): against the version the update will start from,
    always, so `staleness <= K` holds for every trained sample whatever the control.

The controller applies them; `StalenessManager` only keeps the counts eq. 1 needs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence


def rollout_version(token_versions: Sequence[int], current_version: int) -> int:
    """The version a sample counts as sampled by: its oldest token's (an empty response's:
    the current version)."""
    return min(token_versions) if token_versions else current_version


def staleness(current_version: int, rollout_version: int) -> int:
    """Versions between the policy that sampled and the one being trained, never negative."""
    return max(0, current_version - rollout_version)


def token_staleness(current_version: int, token_versions: Sequence[int]) -> list[int]:
    """The staleness of every token of a response (versions differ under `continue`)."""
    return [current_version - v for v in token_versions]


def admission_capacity(version: int, k: int, batch_size: int, accepted: int, running: int
                       ) -> int:
    """AReaL eq. 1, floor(N_r / B) <= v + K, as a number of samples that may still start.

    capacity = (v + K + 1) * B - (accepted + running): samples accepted into the buffer or
    still being generated may fill at most K + 1 batches beyond what training has consumed.
    """
    return (version + k + 1) * batch_size - (accepted + running)


def accept_on_arrival(sample_staleness: int, k: int, filter_on: bool) -> bool:
    """Listing 1's filter: a sample staler than K is dropped on arrival when filtering."""
    return not (filter_on and sample_staleness > k)


def fresh_for_batch(base_version: int, rollout_version: int, k: int) -> bool:
    """May a buffered sample join a batch trained from `base_version`?"""
    return base_version - rollout_version <= k


class StalenessManager:
    """The counts of eq. 1, guarded by a lock (reward-pool threads report returns too).

    Samples dropped after acceptance give their capacity back, or rollout would stall.
    """

    def __init__(self, k: int, batch_size: int):
        self.k, self.batch_size = k, batch_size
        self.accepted = 0  # accepted samples, and the empty places of short batches trained
        self.running = 0
        self._lock = threading.Lock()

    def capacity(self, version: int) -> int:
        with self._lock:
            return admission_capacity(version, self.k, self.batch_size, self.accepted,
                                      self.running)

    def submitted(self, n: int) -> None:
        with self._lock:
            self.running += n

    def returned(self, accepted: bool) -> None:
        with self._lock:
            self.running -= 1
            self.accepted += int(accepted)

    def released(self, n: int) -> None:
        """n accepted samples will never be trained (dropped at batching, or a skipped commit)."""
        with self._lock:
            self.accepted -= n

    def trained(self, n: int) -> None:
        """An applied update trained n samples. Eq. 1 credits each version with B, so the
        B - n places a short batch (whole groups, `batching.py`) left empty count as used,
        or every short batch would let rollout run that much further ahead."""
        with self._lock:
            self.accepted += self.batch_size - n
