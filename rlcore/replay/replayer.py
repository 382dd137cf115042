"""`rlcore replay`: re-execute a run's schedule in one process, with no clock.

The replay rebuilds the base policy and walks the schedule (`rlcore/record/schedule.py`): each
generation batch runs with the same rows, the weights of its recorded versions and the same
swaps and cuts; each trainer runs its recorded steps (loads and updates of the recorded
batches) with its own optimizer; every applied update publishes the version it made.
Generation runs here and training in a process of its own (`rlcore/replay/trainer_process.py`),
side by side as the run's rollout and trainer did, each step once what it needs exists (the
versions a batch samples with, the samples a batch trains on; `rlcore/replay/walk.py`
coordinates the threads and finds a schedule that cannot go on): the order the original
clocks chose does not matter, and a version is kept only while a later step needs it.

With no changed setting the replay is a *verification*: every sample's tokens,
log-probability sum, versions and reward, every applied update's loss and the final state's
digest must equal the original's; the first difference stops it with both values
(`Divergence`). With changed train settings it is *counterfactual*: the schedule is held and
the training changes (docs/replay.md says exactly what is held). Either way it writes an
ordinary run directory whose summary.json says what it replayed.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from rlcore.config import RunConfig
from rlcore.kernels import pin
from rlcore.policy.device import peak_gpu_bytes, resolve_device
from rlcore.policy.digest import state_digest
from rlcore.policy.generation import generate
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.optim_steps import skipped_steps
from rlcore.policy.sampler import ChunkedSampler, Draws
from rlcore.record.ledger import IN_PLACE_COMMIT, RunLedger
from rlcore.record.schedule import (
    Divergence,
    GenerationRecord,
    Schedule,
    ScheduleError,
    TrainerOp,
)
from rlcore.replay.checks import Verifier, check_held
from rlcore.replay.inputs import Original, check_environment, read_original
from rlcore.replay.record import Replayed, ReplayOutcome, record_replay
from rlcore.replay.trainer_process import StepDone, TrainerProcess, TrainStep
from rlcore.replay.walk import Walk
from rlcore.runners.common import preflight, train_batch
from rlcore.tasks.prompts import Prompt, PromptStream
from rlcore.tasks.reward import RewardPool


class Replay:
    """The replay of one schedule: policies, published versions, and what has been computed."""

    def __init__(self, cfg: RunConfig, original: Original, ledger: RunLedger, *,
                 verify: bool, tolerance: float | None):
        self.cfg, self.original, self.ledger = cfg, original, ledger
        self.schedule: Schedule = original.schedule
        self.verifier = Verifier(original, tolerance) if verify else None
        device = resolve_device(cfg.model.trainer_device, "trainer")
        self.device = device
        t0 = time.perf_counter()
        self.rollout = HFPolicy(cfg.model, cfg.train, role="rollout", device=device)
        self.load_s = time.perf_counter() - t0
        self.versions: dict[int, dict[str, torch.Tensor]] = {0: self.rollout.export_state()}
        self.rollout_version = 0
        self.uses = self._version_uses()
        self.rows: dict[tuple[int, int], Replayed] = {}
        self.update_stats: dict[int, tuple[dict[str, float], float]] = {}  # batch: stats, t
        self.skipped_steps = 0  # the loss scaler's, in every update replayed
        self.advantages: dict[int, float] = {}  # sample id: as trained by an applied update
        self.rewards = RewardPool(cfg.reward)
        self.tasks = preflight(cfg)
        # the buckets the live roles captured before their run: a replay decodes in the same
        self.rollout.prepare_decoding(range(1, cfg.train.update_batch_size + 1),
                                      [(t.prompt, t.system) for t in self.tasks],
                                      cfg.rollout.max_new_tokens)
        self._stream = PromptStream(self.tasks, cfg.seed)
        self._prompts: list[Prompt] = []
        self.tokens: Counter[str] = Counter()
        self.spans: list[tuple[str, str, float, float, int]] = []
        self.walk = Walk()
        self.trainer = TrainerProcess(cfg, self.schedule, device, self._load_uses())
        self._sent_all = False  # every trainer step is in the trainer process

    def outcome(self) -> ReplayOutcome:
        """What the replay computed, for its record."""
        return ReplayOutcome(schedule=self.schedule, rows=self.rows,
                             update_stats=self.update_stats, advantages=self.advantages,
                             skipped_steps=self.skipped_steps,
                             spans=self.spans, prompt=self.prompt)

    # --- inputs ----------------------------------------------------------------------------
    def prompt(self, group_id: int) -> Prompt:
        """The prompt of a group: the same seeded stream the runners dispatch from."""
        while len(self._prompts) <= group_id:
            self._prompts += self._stream.take(1)
        return self._prompts[group_id]

    def _version_uses(self) -> Counter[int]:
        """How many generations still need each version here (it is freed at zero); the
        final version is kept for the end."""
        uses: Counter[int] = Counter()
        for g in self.schedule.generations:
            uses.update(g.versions())
        uses[self.final_version()] += 1
        return uses

    def _load_uses(self) -> dict[int, int]:
        """How many trainer `load` steps need each version (the trainer process keeps it)."""
        return dict(Counter(op.version for ops in self.schedule.trainer_ops.values()
                            for op in ops if op.op == "load"))

    def final_version(self) -> int:
        return max([0] + [c.version for c in self.schedule.commits.values()
                          if c.outcome == "applied"])

    def _release(self, version: int) -> None:
        with self.walk.cond:
            self.uses[version] -= 1
            if self.uses[version] <= 0:
                self.versions.pop(version, None)

    # --- the walk --------------------------------------------------------------------------
    def run(self) -> None:
        """Generation (the records in order) and training (each trainer's steps in order)
        in two threads, each step once what it needs is there; a third takes back what the
        trainer process computed."""
        try:
            self.walk.run({"generation": self._generate_all, "training": self._train_all},
                          {"results": self._receive_all})
        finally:
            self.ledger.worker_cpu(self.trainer.stop(wait=self.walk.error is None))
        if self.walk.error is not None:
            raise self.walk.error

    def _generate_all(self) -> None:
        for g in self.schedule.generations:
            self.await_version(g.version, g)
            self.generate(g)
            self.walk.progress()

    def await_version(self, version: int, g: GenerationRecord) -> None:
        """Wait for a version a generation needs: its first, or one it swaps to mid-batch
        (the run's trainer published that one while the batch was running)."""
        self.walk.wait_for("generation", lambda: version in self.versions,
                    lambda: f"generation (record {g.seq}) waits for version {version}")

    def _train_all(self) -> None:
        """Send each trainer's steps, in its order, once what they need is under way."""
        ops = self.schedule.trainer_ops
        sent = dict.fromkeys(ops, 0)
        coming = {0}  # versions published, or to be published by an update already sent

        def sendable() -> bool:
            return any(sent[t] < len(o) and self._sendable(o[sent[t]], coming)
                       for t, o in ops.items())

        def waits() -> str:
            return "; ".join(
                f"trainer{t}'s step {o[sent[t]].trainer_seq} ({self._needs(o[sent[t]])})"
                for t, o in ops.items() if sent[t] < len(o))

        try:
            while any(sent[t] < len(o) for t, o in ops.items()):
                self.walk.wait_for("training", sendable, waits)
                for t, o in ops.items():
                    while sent[t] < len(o) and self._sendable(o[sent[t]], coming):
                        step = self._step(o[sent[t]])
                        if step.publish is not None:
                            coming.add(step.publish)
                        with self.walk.cond:
                            self.walk.in_flight += 1
                        self.trainer.send(step)
                        sent[t] += 1
        finally:
            with self.walk.cond:
                self._sent_all = True
                self.walk.cond.notify_all()

    def _receive_all(self) -> None:
        """Take back what the trainer process computed, as soon as it arrives."""
        while True:
            with self.walk.cond:
                if self.walk.error is not None or (self._sent_all and not self.walk.in_flight):
                    return
            msg = self.trainer.result(timeout=0.05)
            if msg is None:
                continue
            self._took(msg)
            with self.walk.cond:
                self.walk.in_flight -= 1
            self.walk.progress()

    def _sendable(self, op: TrainerOp, coming: set[int]) -> bool:
        if op.op == "load":
            return op.version in coming
        return all(self._key(i) in self.rows for i in self.schedule.commits[op.batch].sample_ids)

    def _needs(self, op: TrainerOp) -> str:
        if op.op == "load":
            return f"loads version {op.version}"
        return f"trains batch {op.batch_id}, waits for its samples"

    def _key(self, sample_id: int) -> tuple[int, int]:
        fate = self.schedule.fates[sample_id]
        return fate.slot, fate.attempt

    def load_rollout(self, version: int) -> None:
        if self.rollout_version != version:
            self.rollout.load_state(self.versions[version])
            self.rollout_version = version

    # --- generation ------------------------------------------------------------------------
    def generate(self, rec: GenerationRecord) -> None:
        """One generation batch with the recorded rows, versions, swaps and cuts.

        Past the recorded cut, rows that were emitted but are still running (possible only
        in a counterfactual) go on under the weights they had, until they end; a
        counterfactual batch that ends before its cut still cuts the recorded rows there.
        """
        cfg, ro = self.cfg, self.cfg.rollout
        t0 = self.ledger.now()
        self.load_rollout(rec.version)
        tasks = [self.prompt(group).task for _, _, group in rec.rows]
        sampler = self.rollout.sampler(
            [self.rollout.encode_prompt(t.prompt, t.system) for t in tasks],
            max_new_tokens=ro.max_new_tokens,
            temperature=ro.temperature, draws=Draws(cfg.seed, [(s, a) for s, a, _ in rec.rows]),
            version=rec.version)
        gen = generate(sampler, ro.chunk_tokens, cfg.staleness.interrupt,
                       RecordedLook(self, rec, sampler))
        self.tokens["reprefilled"] += gen.reprefilled
        self.tokens["kv_kept"] += gen.kv_kept
        kept = [i for i in range(len(rec.rows)) if i not in rec.cut]
        cut_len = gen.cut
        if rec.cut and not cut_len:  # under other weights the batch ended before its cut
            cut_len = {i: sampler.length(i) for i in rec.cut}
        for _, v in rec.swaps:
            self._release(v)
        self._release(rec.version)
        if self.verifier is not None:
            self.verifier.chunks(rec, sampler.chunks)
        t1 = self.ledger.now()
        self.spans.append(("rollout", rec.worker, t0, t1, len(kept)))
        self.tokens["sampled"] += sum(len(sampler.gens[i].response_ids) for i in kept)
        # Emitted rows the run never scored (code rewards still queued at its end) have no
        # fate: they are generated, for the token count, and not scored.
        scored = [i for i in kept if self.schedule.sample(*rec.rows[i][:2]) is not None]
        texts = [self.rollout.decode_response(sampler.gens[i].response_ids) for i in scored]
        results = self.rewards.map((text, self.prompt(rec.rows[i][2]).task)
                                   for text, i in zip(texts, scored, strict=True))
        for i, text, result in zip(scored, texts, results, strict=True):
            fate = self.schedule.sample(*rec.rows[i][:2])
            assert fate is not None, "a scored row has a fate"
            self.rewards.admit(fate.sample_id, self.prompt(rec.rows[i][2]), result)
            g = sampler.gens[i]
            self.rows[rec.rows[i][:2]] = Replayed(g, text, result, rec.worker, t1)
            if self.verifier is not None:
                self.verifier.sample(rec.rows[i][:2], g, result)
        for i, n in cut_len.items():
            g = sampler.gens[i]
            del g.response_ids[n:], g.logprobs[n:], g.versions[n:]
            self.tokens["sampled"] += n
            if rec.cut_reason == "stop":
                self.tokens["abandoned"] += n
            self.rows[rec.rows[i][:2]] = Replayed(g, None, None, rec.worker, t1)

    # --- training --------------------------------------------------------------------------
    def _step(self, op: TrainerOp) -> TrainStep:
        """A trainer step with what it needs: for an update, its batch of replayed samples
        (rewards and advantages recomputed), and the version it publishes if applied."""
        if op.op == "load":
            return TrainStep(op)
        commit = self.schedule.commits[op.batch]
        if commit.outcome == "applied" and commit.version != op.version + 1:
            raise ScheduleError(f"batch {commit.batch_id} was trained from version {op.version} "
                                f"but its commit made version {commit.version}")
        rows = [self.rows[self._key(i)] for i in commit.sample_ids]
        fates = [self.schedule.fates[i] for i in commit.sample_ids]
        batch = train_batch([r.reward for r in rows], [f.group_id for f in fates],
                            [r.gen for r in rows], self.cfg)
        if commit.outcome == "applied":
            self.advantages.update(zip(commit.sample_ids, batch.advantages, strict=True))
        return TrainStep(op, batch, commit.version if commit.outcome == "applied" else None)

    def _took(self, done: StepDone) -> None:
        """What the trainer process computed: a span, its update's verdict against the
        schedule's, and for an applied update its checks, its statistics and the version it
        published."""
        op = done.op
        t0, t1 = self.ledger.on_clock(done.t0), self.ledger.on_clock(done.t1)
        if op.op == "load":
            return
        commit = self.schedule.commits[op.batch]
        self.spans.append(("trainer", f"trainer{op.trainer}", t0, t1, len(commit.sample_ids)))
        stats = done.stats
        assert stats is not None
        self.skipped_steps += skipped_steps(stats)
        check_held(commit, stats)
        if commit.outcome != "applied":
            return
        assert done.state is not None
        self.update_stats[commit.batch_id] = ({**stats, **IN_PLACE_COMMIT}, t1)
        if self.uses[commit.version] > 0:
            with self.walk.cond:
                self.versions[commit.version] = done.state.unpack()
            self.walk.progress()
        if self.verifier is not None:
            self.verifier.loss(commit, stats["loss"])

    def final_policy(self) -> HFPolicy:
        """The rollout policy holding the last published version (what the run ended with)."""
        self.load_rollout(self.final_version())
        return self.rollout


class RecordedLook:
    """Between two chunks of a replayed batch: the cut and the swaps its record holds."""

    def __init__(self, replay: Replay, rec: GenerationRecord, sampler: ChunkedSampler):
        self.replay, self.rec, self.sampler = replay, rec, sampler
        self.swaps = dict(rec.swaps)

    def cut(self, running: list[int]) -> tuple[str, list[int]] | None:
        if self.rec.cut_after == self.sampler.chunks and self.rec.cut_reason is not None:
            return self.rec.cut_reason, self.rec.cut
        return None

    def swap(self) -> int | None:
        version = self.swaps.get(self.sampler.chunks)
        if version is not None:
            self.replay.await_version(version, self.rec)
            self.replay.load_rollout(version)
        return version


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
    check_environment(original, cfg, exact=verify and tolerance is None)
    pin(cfg)
    torch.manual_seed(cfg.seed)
    ledger = RunLedger(cfg, out_dir, force=force)
    replay = None
    try:
        t0 = time.perf_counter()
        replay = Replay(cfg, original, ledger, verify=verify, tolerance=tolerance)
        replay.trainer.start()
        cold_start_s = time.perf_counter() - t0
        ledger.start_clock()
        ledger.event("run_start", cold_start_s=cold_start_s)
        replay.run()
        wall_s = ledger.now()  # as a live run's: up to the last update, not its recording
        record_replay(ledger, replay.outcome())
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
                "max_divergence": replay.verifier.max_divergence
                if replay.verifier is not None and tolerance is not None else None}
        return ledger.finish(
            policy, wall_s=wall_s, cold_start_s=cold_start_s,
            waits={"trainer_data_s": 0.0, "trainer_ratio_s": 0.0, "rollout_throttle_s": 0.0,
                   "rollout_ratio_s": 0.0},
            placement={"cpus": {}, "unpinned_reason": "a replay runs every role in one thread"},
            devices={"rollout": device, "trainer": device}, weight_transport="none",
            weight_bytes=0,
            gpu_peak_bytes={**dict.fromkeys(("rollout", "trainer"), peak_gpu_bytes(replay.device)),
                            "weight_slots": None},
            replay=info, run_id=original.run_id().replayed_under(cfg.train.objective))
    finally:
        if replay is not None:
            replay.rewards.close()
            replay.trainer.stop(wait=False)
        ledger.close()
