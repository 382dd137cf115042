"""The parameter service: the one writer of the global policy and of `policy_version`.

Weights live in `WeightSlots` (`weight_slots.py`): one current slot, and a staging slot per
trainer into which it writes its candidate state. A commit is decided here alone: if the
candidate was computed from the current version and its update applied an optimizer step,
the service publishes the staging slot as current at the next version (the paper's Listing
2, without a copy: the old current slot becomes the trainer's next staging slot). Otherwise
the commit is recorded as skipped and the version does not move (§4.4: an update whose
every step the fp16 loss scaler skipped is a commit with no update). The planner runs the
same service on a store without weights (`rlcore/plan/roles.py::Versions`).
"""

from __future__ import annotations

from rlcore.clock import Clock
from rlcore.clock.work import Commit
from rlcore.policy.optim_steps import NO_STEP_APPLIED
from rlcore.runners.asynchronous.contexts import ParamServiceContext
from rlcore.runners.asynchronous.interfaces import WeightStore
from rlcore.runners.asynchronous.messages import (
    CommitAck,
    CommitRequest,
    Ready,
    Stopped,
    UpdateDone,
)


class ParamService:
    """Decides commits; the only caller of `publish` after the initial weights. Being the one
    writer, it can read the head and then publish without a race."""

    def __init__(self, slots: WeightStore, clock: Clock):
        self.slots, self.clock = slots, clock

    def commit(self, req: CommitRequest) -> CommitAck:
        self.clock.charge(Commit())
        current, version = self.slots.head()
        if not req.updated:
            reason = NO_STEP_APPLIED
        elif req.base_version != version:
            reason = f"stale base (candidate from v{req.base_version}, current v{version})"
        else:  # the old current slot becomes the trainer's next staging slot
            self.slots.publish(req.slot, version + 1, req.digest)
            return CommitAck(True, version + 1, next_slot=current, t=self.clock.now())
        return CommitAck(False, version, next_slot=req.slot, t=self.clock.now(), reason=reason)


def verdict(req: CommitRequest, ack: CommitAck, commit_s: float) -> UpdateDone:
    """The controller's report of a decided commit; the controller also derives the
    `version_change` / `commit_skipped` event and the trainer's busy span from it.

    Sent by the service, not the trainer: a trainer that pipelines its next update reads the
    verdict only after computing it, and a controller told that late would hold rollout back
    (the throttle counts versions) for a whole update. One message per commit, because every
    message wakes the controller, on a core that the trainer or the rollout is using.
    """
    stats = {**req.stats, "time/commit_latency_s": max(0.0, ack.t - req.t_sent)}
    return UpdateDone(req.trainer, req.batch_id, ack.applied, ack.version, req.base_version,
                      ack.reason, stats, ack.t, req.t_start, commit_s, req.ops, req.work)


def param_service_main(ctx: ParamServiceContext) -> None:
    """Process entry: load the initial weights (or train.lora's initial adapters) into
    slot 0, then serve commits until None."""
    from rlcore.policy.digest import state_digest
    from rlcore.policy.loading import load_model
    from rlcore.policy.lora import initial_adapter, model_targets
    from rlcore.policy.model_dir import check_model_dir

    clock = ctx.clock
    t_load = clock.now()
    path, lora = check_model_dir(ctx.cfg.model.path), ctx.cfg.train.lora
    state = (dict(load_model(path).named_parameters()) if lora is None
             else initial_adapter(model_targets(path, lora), lora.rank))
    ctx.slots.write(0, ctx.slots.ordered(state))
    ctx.slots.publish(0, 0, state_digest(state) if ctx.slots.digests else None)
    del state
    ctx.inbox.put(Ready(ctx.name, ctx.pid(), "cpu", clock.now() - t_load))
    serve_commits(ctx)


def serve_commits(ctx: ParamServiceContext) -> None:
    """After the ready barrier: decide each commit request, answer its trainer and the
    controller, until a None request."""
    clock = ctx.clock
    service = ParamService(ctx.slots, clock)
    ctx.start.wait()
    cpu0 = ctx.own_cpu_s()
    while True:
        req = ctx.commit_q.get()
        if req is None:
            break
        t0 = clock.now()
        ack = service.commit(req)
        commit_s = clock.now() - t0
        ctx.ack_qs[req.trainer].put(ack)
        ctx.inbox.put(verdict(req, ack, commit_s))
    ctx.inbox.put(Stopped(ctx.name, cpu_s=ctx.own_cpu_s() - cpu0))
