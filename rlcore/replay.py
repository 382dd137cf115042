"""`rlcore replay`: re-execute a run's schedule in one process, with no clock.

The replay rebuilds the base policy and walks the schedule (`rlcore/schedule.py`): each
generation batch runs with the same rows, the weights of its recorded versions and the same
swaps and cuts; each trainer runs its recorded steps (loads and updates of the recorded
batches) with its own optimizer; every applied update publishes the version it made. Work is
ordered by what it needs (the versions a batch samples with, the samples a batch trains
on), so the order the original clocks chose does not matter; a version is kept only while a
later step still needs it.

With no changed setting the replay is a *verification*: every sample's tokens,
log-probability sum, versions and reward, every applied update's loss and the final state's
digest must equal the original's; the first difference stops it with both values
(`Divergence`). With changed train settings it is *counterfactual*: the schedule is held and
the training changes (docs/replay.md says exactly what is held). Either way it writes an
ordinary run directory whose summary.json says what it replayed.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlcore.backend import HFPolicy, resolve_device, state_digest
from rlcore.config import ConfigError, RunConfig
from rlcore.records import IN_PLACE_COMMIT, RunLedger
from rlcore.replay_inputs import Original, environment_differences, read_original
from rlcore.reward import RewardPool
from rlcore.runners.common import Prompt, PromptStream, preflight, train_batch
from rlcore.sampler import Draws, Generation
from rlcore.schedule import (
    Commit,
    Divergence,
    GenerationRecord,
    Schedule,
    ScheduleError,
    TrainerOp,
)


@dataclass
class Replayed:
    """One generated row of the replay: emitted (a sample) or cut (an interrupted attempt)."""

    gen: Generation
    text: str | None
    result: dict[str, Any] | None
    worker: str
    t_emit: float


class Replay:
    """The replay of one schedule: policies, published versions, and what has been computed."""

    def __init__(self, cfg: RunConfig, original: Original, ledger: RunLedger, *,
                 verify: bool, tolerance: float | None):
        self.cfg, self.original, self.ledger = cfg, original, ledger
        self.schedule: Schedule = original.schedule
        self.verify, self.tolerance = verify, tolerance
        self.max_divergence: dict[str, float] = {"logprob_sum": 0.0, "loss": 0.0,
                                                 "token_mismatches": 0.0}
        device = resolve_device(cfg.model.trainer_device, "trainer")
        self.device = device
        t0 = time.perf_counter()
        self.rollout = HFPolicy(cfg.model, cfg.train, role="rollout", device=device)
        self.trainers = {t: HFPolicy(cfg.model, cfg.train, role="trainer", device=device)
                         for t in sorted(self.schedule.trainer_ops)}
        self.load_s = time.perf_counter() - t0
        self.versions: dict[int, dict[str, torch.Tensor]] = {0: self.rollout.export_state()}
        self.rollout_version = 0
        self.uses = self._version_uses()
        self.rows: dict[tuple[int, int], Replayed] = {}
        self.update_stats: dict[int, tuple[dict[str, float], float]] = {}  # batch: stats, t
        self.rewards = RewardPool(cfg.reward)
        self.tasks = preflight(cfg)
        self._stream = PromptStream(self.tasks, cfg.seed)
        self._prompts: list[Prompt] = []
        self.tokens = Counter()

    # --- inputs ----------------------------------------------------------------------------
    def prompt(self, group_id: int) -> Prompt:
        """The prompt of a group: the same seeded stream the runners dispatch from."""
        while len(self._prompts) <= group_id:
            self._prompts += self._stream.take(1)
        return self._prompts[group_id]

    def _version_uses(self) -> Counter[int]:
        """How many steps still need each version (it is freed at zero)."""
        uses: Counter[int] = Counter()
        for g in self.schedule.generations:
            uses.update(g.versions())
        for ops in self.schedule.trainer_ops.values():
            uses.update(op.version for op in ops if op.op == "load")
        uses[self.final_version()] += 1
        return uses

    def final_version(self) -> int:
        return max([0] + [c.version for c in self.schedule.commits.values()
                          if c.outcome == "applied"])

    def _release(self, version: int) -> None:
        self.uses[version] -= 1
        if self.uses[version] <= 0:
            self.versions.pop(version, None)

    # --- the walk --------------------------------------------------------------------------
    def run(self) -> None:
        """Run every generation and trainer step once what it needs is there."""
        gens = list(self.schedule.generations)
        next_op = dict.fromkeys(self.schedule.trainer_ops, 0)
        while gens or any(next_op[t] < len(ops) for t, ops in self.schedule.trainer_ops.items()):
            progressed = False
            ready = [g for g in gens if g.versions() <= self.versions.keys()]
            for g in ready:
                self.generate(g)
                gens.remove(g)
                progressed = True
            for t, ops in self.schedule.trainer_ops.items():
                while next_op[t] < len(ops) and self._runnable(ops[next_op[t]]):
                    self.train_step(ops[next_op[t]])
                    next_op[t] += 1
                    progressed = True
            if not progressed:
                raise ScheduleError(self._stuck(gens, next_op))

    def _runnable(self, op: TrainerOp) -> bool:
        if op.op == "load":
            return op.version in self.versions
        return all(self._key(i) in self.rows for i in self.schedule.commits[op.batch_id].sample_ids)

    def _key(self, sample_id: int) -> tuple[int, int]:
        fate = self.schedule.fates[sample_id]
        return fate.slot, fate.attempt

    def _stuck(self, gens: list[GenerationRecord], next_op: dict[int, int]) -> str:
        waits = [f"generation (record {g.seq}) needs versions "
                 f"{sorted(g.versions() - self.versions.keys())}" for g in gens[:3]]
        for t, ops in self.schedule.trainer_ops.items():
            if next_op[t] < len(ops):
                op = ops[next_op[t]]
                what = f"version {op.version}" if op.op == "load" else f"batch {op.batch_id}"
                waits.append(f"trainer{t}'s step {op.trainer_seq} ({op.op} {what})")
        return "the schedule cannot be replayed, nothing left can run: " + "; ".join(waits)

    def _load_rollout(self, version: int) -> None:
        if self.rollout_version != version:
            self.rollout.load_state(self.versions[version])
            self.rollout_version = version

    # --- generation ------------------------------------------------------------------------
    def generate(self, rec: GenerationRecord) -> None:
        """One generation batch with the recorded rows, versions, swaps and cuts.

        Past the recorded cut, rows that were emitted but are still running (possible only
        in a counterfactual) go on under the weights they had, until they end.
        """
        cfg, ro = self.cfg, self.cfg.rollout
        t0 = self.ledger.now()
        self._load_rollout(rec.version)
        prompts = [self.prompt(group).task.prompt for _, _, group in rec.rows]
        sampler = self.rollout.sampler(
            [self.rollout.encode_prompt(p) for p in prompts], max_new_tokens=ro.max_new_tokens,
            temperature=ro.temperature, draws=Draws(cfg.seed, [(s, a) for s, a, _ in rec.rows]),
            version=rec.version)
        swaps = dict(rec.swaps)
        kept = [i for i in range(len(rec.rows)) if i not in rec.cut]
        cut_len: dict[int, int] = {}
        while True:
            if cut_len:  # past the cut: only emitted rows still running
                running = any(not sampler.gens[i].finished for i in kept) and \
                    sampler.steps < ro.max_new_tokens
            else:
                running = not sampler.done
            if not running:
                break
            sampler.step(ro.chunk_tokens)
            chunk = sampler.chunks
            if rec.cut_after == chunk and not cut_len:
                cut_len = {i: len(sampler.gens[i].response_ids) for i in rec.cut}
                continue
            if chunk in swaps and not sampler.done:
                unfinished = sum(len(g.response_ids) for g in sampler.gens if not g.finished)
                self._load_rollout(swaps[chunk])
                if cfg.staleness.interrupt == "continue":
                    self.tokens["reprefilled"] += unfinished
                    sampler.reprefill(swaps[chunk])
                elif cfg.staleness.interrupt == "keep_kv":
                    self.tokens["kv_kept"] += unfinished
                    sampler.keep_cache(swaps[chunk])
        for _, v in rec.swaps:
            self._release(v)
        self._release(rec.version)
        if self.verify and sampler.chunks != rec.chunks:
            self._diverged(f"generation (record {rec.seq}) ran {sampler.chunks} chunks",
                           f"{rec.chunks} chunks", f"{sampler.chunks} chunks")
        t1 = self.ledger.now()
        self.ledger.span("rollout", rec.worker, t0, t1, samples=len(kept))
        self.tokens["sampled"] += sum(len(sampler.gens[i].response_ids) for i in kept)
        # Emitted rows the run never scored (code rewards still queued at its end) have no
        # fate: they are generated, for the token count, and not scored.
        scored = [i for i in kept if self.schedule.sample(*rec.rows[i][:2]) is not None]
        texts = [self.rollout.decode_response(sampler.gens[i].response_ids) for i in scored]
        results = self.rewards.map((text, self.prompt(rec.rows[i][2]).task)
                                   for text, i in zip(texts, scored, strict=True))
        for i, text, result in zip(scored, texts, results, strict=True):
            g = sampler.gens[i]
            self.rows[rec.rows[i][:2]] = Replayed(g, text, result, rec.worker, t1)
            if self.verify:
                self._check_sample(rec.rows[i][:2], g, result)
        for i, n in cut_len.items():
            g = sampler.gens[i]
            del g.response_ids[n:], g.logprobs[n:], g.versions[n:]
            self.tokens["sampled"] += n
            if rec.cut_reason == "stop":
                self.tokens["abandoned"] += n
            self.rows[rec.rows[i][:2]] = Replayed(g, None, None, rec.worker, t1)

    # --- training --------------------------------------------------------------------------
    def train_step(self, op: TrainerOp) -> None:
        """A trainer's load of a published version, or its update of a recorded batch."""
        policy = self.trainers[op.trainer]
        if op.op == "load":
            policy.load_state(self.versions[op.version])
            self._release(op.version)
            return
        commit = self.schedule.commits[op.batch_id]
        if commit.outcome == "applied" and commit.version != op.version + 1:
            raise ScheduleError(f"batch {commit.batch_id} was trained from version {op.version} "
                                f"but its commit made version {commit.version}")
        t0 = self.ledger.now()
        rows = [self.rows[self._key(i)] for i in commit.sample_ids]
        fates = [self.schedule.fates[i] for i in commit.sample_ids]
        batch = train_batch([r.result["reward"] for r in rows], [f.group_id for f in fates],
                            [r.gen for r in rows], self.cfg)
        stats = policy.update(batch, temperature=self.cfg.rollout.temperature,
                              current_version=op.version)
        t1 = self.ledger.now()
        self.ledger.span("trainer", f"trainer{op.trainer}", t0, t1, samples=len(rows))
        if commit.outcome != "applied":
            return
        if not (torch.isfinite(torch.tensor(stats["loss"])) and
                torch.isfinite(torch.tensor(stats["grad_norm"]))):
            raise ScheduleError(f"the update of batch {commit.batch_id} is not finite here, so "
                                "the parameter service would have skipped it: the schedule "
                                "cannot be held (choose gentler train settings)")
        self.versions[commit.version] = policy.export_state()
        self.update_stats[commit.batch_id] = ({**stats, **IN_PLACE_COMMIT}, t1)
        if self.verify:
            recorded = self.original.updates[commit.version]["loss"]
            self._compare(f"update {commit.version} (batch {commit.batch_id}) loss", "loss",
                          recorded, stats["loss"])

    # --- verification ----------------------------------------------------------------------
    def _diverged(self, event: str, recorded: Any, replayed: Any) -> None:
        raise Divergence(f"replay diverged at {event}: recorded {recorded}, replayed {replayed}")

    def _compare(self, event: str, quantity: str, recorded: float, replayed: float) -> None:
        if recorded == replayed:
            return
        if self.tolerance is None:
            self._diverged(event, repr(recorded), repr(replayed))
        self.max_divergence[quantity] = max(self.max_divergence[quantity],
                                            abs(recorded - replayed))

    def _check_sample(self, key: tuple[int, int], g: Generation, result: dict[str, Any]) -> None:
        fate = self.schedule.sample(*key)
        assert fate is not None
        row = self.original.samples[fate.sample_id]
        event = f"sample {fate.sample_id} (slot {key[0]}, attempt {key[1]})"
        if row["response_ids"] != g.response_ids:
            if self.tolerance is None:
                self._diverged(f"{event} tokens", row["response_ids"], g.response_ids)
            self.max_divergence["token_mismatches"] += 1
            return
        versions = (min(g.versions), max(g.versions)) if g.versions else None
        if g.versions and versions != (row["policy_version"], row["policy_version_max"]):
            self._diverged(f"{event} policy versions", (row["policy_version"],
                                                        row["policy_version_max"]), versions)
        self._compare(f"{event} logprob_sum", "logprob_sum", row["logprob_sum"],
                      sum(g.logprobs))
        if (row["reward"], row["pass"]) != (result["reward"], result["pass"]):
            self._diverged(f"{event} reward (a code test at its time limit?)",
                           (row["reward"], row["pass"]), (result["reward"], result["pass"]))

    # --- the record ------------------------------------------------------------------------
    def record(self) -> None:
        """Write the replayed run through the ledger, record by record in the original order,
        so that its files line up with the original's."""
        led, s = self.ledger, self.schedule
        waiting: dict[int, set[int]] = {}  # applied batches whose samples are not all settled
        for kind, item in s.order:
            if kind == "generate":
                led.generation(item)
            elif kind == "interrupt":
                row = self.rows[(item["slot"], item["attempt"])]
                led.interrupted_attempt(
                    worker=row.worker, slot=item["slot"], group_id=item["group_id"],
                    attempt=item["attempt"], tokens=len(row.gen.response_ids),
                    old_version=item["old_version"], new_version=item["new_version"],
                    resubmitted=item["resubmitted"], t=row.t_emit)
            elif kind == "sample":
                self._record_sample(item)
                for batch_id, ids in list(waiting.items()):
                    ids.discard(item.sample_id)
                    if not ids:
                        del waiting[batch_id]
                        self._record_update(s.commits[batch_id])
            elif kind == "trainer_op":
                led.trainer_steps([item])
            elif kind == "commit":
                led.commit(batch_id=item.batch_id, trainer=item.trainer,
                           base_version=item.base_version, sample_ids=item.sample_ids,
                           outcome=item.outcome, version=item.version, reason=item.reason)
                if item.outcome == "applied":  # recorded once its samples are settled
                    waiting[item.batch_id] = set(item.sample_ids) - led.settled_ids()
                    if not waiting[item.batch_id]:
                        del waiting[item.batch_id]
                        self._record_update(item)
                else:
                    led.event("update_skipped", batch_id=item.batch_id, trainer=item.trainer,
                              reason=item.reason)
        if waiting:
            raise ScheduleError(f"batches {sorted(waiting)} were applied but their samples "
                                "were never settled")

    def _record_sample(self, fate: Any) -> None:
        led = self.ledger
        prompt = self.prompt(fate.group_id)
        row = self.rows[(fate.slot, fate.attempt)]
        if fate.status == "dropped_interrupted":
            led.drop_interrupted(prompt, slot=fate.slot, attempt=fate.attempt,
                                 tokens=len(row.gen.response_ids),
                                 old_version=self._interrupt(fate)["old_version"],
                                 new_version=fate.version, worker=row.worker, t_emit=row.t_emit,
                                 sample_id=fate.sample_id)
            return
        led.arrive(prompt, row.gen, {"response": row.text, **row.result},
                   current_version=fate.arrival_version, slot=fate.slot, attempt=fate.attempt,
                   worker=row.worker, t_emit=row.t_emit, sample_id=fate.sample_id)
        led.settle(fate.sample_id, fate.status, current_version=fate.version,
                   batch_id=fate.batch_id)

    def _interrupt(self, fate: Any) -> dict[str, Any]:
        return next(r for r in self.schedule.interrupts
                    if (r["slot"], r["attempt"]) == (fate.slot, fate.attempt))

    def _record_update(self, commit: Commit) -> None:
        stats, t = self.update_stats[commit.batch_id]
        self.ledger.event("version_change", t=t, old_version=commit.version - 1,
                          new_version=commit.version, batch_id=commit.batch_id,
                          trainer=commit.trainer)
        self.ledger.record_update(commit.version, commit.batch_id, commit.sample_ids, stats,
                                  t_commit=t)

    def final_policy(self) -> HFPolicy:
        """The rollout policy holding the last published version (what the run ended with)."""
        self._load_rollout(self.final_version())
        return self.rollout


def replay_run(run_dir: str | Path, out_dir: str | Path, overrides: list[str] | tuple = (),
               tolerance: float | None = None, threads: int | None = None,
               force: bool = False) -> dict[str, Any]:
    """Replay the run in `run_dir` into `out_dir`; returns the replay's summary.

    Raises ScheduleError (the schedule cannot be replayed), Divergence (a verification
    found a difference) or ConfigError (bad settings), before writing anything complete.
    """
    original = read_original(run_dir, out_dir, overrides)
    cfg = original.replay_config(threads)
    verify = original.is_verification(cfg)
    here = {"torch": torch.__version__, "threads_per_role": cfg.runtime.threads_per_role,
            "devices": {r: str(resolve_device(cfg.model.trainer_device, "trainer"))
                        for r in original.environment["devices"]}}
    differences = environment_differences(original.environment, here)
    for d in differences:
        print(f"rlcore replay: the environment differs from the run's: {d}", file=sys.stderr)
    if differences and verify and tolerance is None:
        raise ConfigError("a verification needs the run's environment for bit-exactness, and "
                          f"it differs ({'; '.join(differences)}); pass --tolerance T to "
                          "report the largest divergence instead of failing")
    torch.set_num_threads(cfg.runtime.threads_per_role)
    torch.manual_seed(cfg.seed)
    ledger = RunLedger(cfg, out_dir, force=force)
    replay = None
    try:
        replay = Replay(cfg, original, ledger, verify=verify, tolerance=tolerance)
        ledger.start_clock()
        ledger.event("run_start", cold_start_s=replay.load_s)
        replay.run()
        replay.record()
        ledger.count_tokens(sampled=replay.tokens["sampled"],
                            reprefilled=replay.tokens["reprefilled"],
                            kv_kept=replay.tokens["kv_kept"],
                            abandoned=replay.tokens["abandoned"])
        policy = replay.final_policy()
        digest = state_digest(policy.export_state())
        if verify and tolerance is None and digest != original.state_digest:
            raise Divergence(f"replay diverged at the final state: recorded "
                             f"{original.state_digest}, replayed {digest}")
        device = str(replay.device)
        info = {"of": str(run_dir), "schedule_digest": original.schedule_digest,
                "state_digest": original.state_digest,
                "kind": "verification" if verify else "counterfactual",
                "overrides": original.train_changes(cfg), "tolerance": tolerance,
                "max_divergence": replay.max_divergence if tolerance is not None else None}
        return ledger.finish(
            policy, wall_s=ledger.now(), cold_start_s=replay.load_s,
            waits={"trainer_data_s": 0.0, "trainer_ratio_s": 0.0, "rollout_throttle_s": 0.0,
                   "rollout_ratio_s": 0.0},
            placement={"cpus": {}, "unpinned_reason": "a replay runs every role in one thread"},
            devices={"rollout": device, "trainer": device}, replay=info)
    finally:
        if replay is not None:
            replay.rewards.close()
        ledger.close()
