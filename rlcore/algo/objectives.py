"""Policy objectives as pure tensor functions returning `(loss, stats)`.

Three policies are named apart throughout (AReaL's terms):
  behav  the policy that sampled the tokens (log-probs stored at generation time),
  prox   the proximal policy anchoring the trust region (decoupled PPO, a3po),
  logp   the current policy pi_theta being optimised (carries the gradient).
All token tensors are [B, R] (batch, response tokens) with a 0/1 `mask`; losses are token
means over the whole batch (AReaL's token-level aggregation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

LOG_RATIO_CLAMP = 20.0  # the paper's Listing 4 clamp; keeps exp() finite


@dataclass(frozen=True)
class Correction:
    """Off-policy correction knobs, as AReaL's `ppo_actor_loss_fn` defines them; None is off.

    clip_eps_high     upper clip of the ratio: clip(r, 1 - eps, 1 + clip_eps_high) (DAPO's
                      clip-higher; AReaL's eps_clip_higher);
    dual_clip         c > 1: a token's loss is at most c |A|, which binds only for A < 0 and a
                      large ratio (AReaL's c_clip); applied before the behaviour weight;
    behav_weight_cap  cap on the behaviour weight pi_prox / pi_behav (decoupled, a3po): with
                      `mask`, a token over the cap gets weight 0 but stays in the token-mean's
                      denominator and in the clip fraction (AReaL's behav_imp_weight_cap);
                      with `clamp`, the weight is truncated to the cap (truncated IS).
    """

    clip_eps_high: float | None = None
    dual_clip: float | None = None
    behav_weight_cap: float | None = None
    behav_weight_mode: str = "mask"


NO_CORRECTION = Correction()


@dataclass(frozen=True)
class LossStats:
    clip_frac: float  # fraction of tokens whose clipped branch is active
    dual_clip_frac: float  # fraction of tokens whose loss the dual clip bounded
    capped_frac: float  # fraction of tokens whose behaviour weight was over the cap
    imp_weight_mean: float  # importance weight vs the behaviour policy (see each objective)
    imp_weight_max: float  # ... before any cap
    kl: float  # k3 estimate, mean over tokens
    entropy: float  # -mean log pi_behav of the sampled tokens: a Monte-Carlo entropy estimate

    def as_dict(self) -> dict[str, float]:
        names = {"clip_frac": "loss/clip_frac", "dual_clip_frac": "loss/dual_clip_frac",
                 "capped_frac": "loss/behav_capped_frac",
                 "imp_weight_mean": "loss/imp_weight_mean",
                 "imp_weight_max": "loss/imp_weight_max", "kl": "loss/kl",
                 "entropy": "policy/entropy"}
        return {names[k]: v for k, v in asdict(self).items()}


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over positions where mask is 1 (0 if the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _stats(weight: torch.Tensor, clipped: torch.Tensor, dual: torch.Tensor,
           capped: torch.Tensor, kl: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor
           ) -> LossStats:
    with torch.no_grad():
        on = mask > 0
        w = weight.detach()[on]
        return LossStats(
            clip_frac=float(masked_mean(clipped.float(), mask)),
            dual_clip_frac=float(masked_mean(dual.float(), mask)),
            capped_frac=float(masked_mean(capped.float(), mask)),
            imp_weight_mean=float(w.mean()) if w.numel() else 1.0,
            imp_weight_max=float(w.max()) if w.numel() else 1.0,
            kl=float(masked_mean(kl.detach(), mask)),
            entropy=float(-masked_mean(behav_logp, mask)),
        )


def _clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float,
                       corr: Correction
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor]:
    """PPO's -min(r A, clip(r) A) per token, with r = exp(log_ratio), bounded by the dual clip
    when set; also r, the clipped and dual-clipped masks, and the k3 KL."""
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    high = clip_eps if corr.clip_eps_high is None else corr.clip_eps_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * advantages
    token_loss = -torch.min(unclipped, clipped)
    is_clipped = clipped < unclipped  # the min took the clipped branch
    is_dual = torch.zeros_like(is_clipped)
    if corr.dual_clip is not None:
        bound = corr.dual_clip * advantages.abs()  # c |A|: only A < 0 tokens can exceed it
        is_dual = bound < token_loss
        token_loss = torch.min(token_loss, bound)
    # Schulman's k3 estimator, non-negative by construction; clamped as in the paper.
    kl = (ratio - 1.0 - log_ratio).clamp(0.0, LOG_RATIO_CLAMP)
    return token_loss, ratio, is_clipped, is_dual, kl


def _behaviour_weight(prox_logp: torch.Tensor, behav_logp: torch.Tensor, corr: Correction
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pi_prox / pi_behav (a constant), as used and as it was, and where it is over the cap."""
    raw = torch.exp((prox_logp - behav_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if corr.behav_weight_cap is None:
        return raw, raw, torch.zeros_like(raw, dtype=torch.bool)
    over = raw > corr.behav_weight_cap
    if corr.behav_weight_mode == "mask":
        return torch.where(over, torch.zeros_like(raw), raw), raw, over
    return raw.clamp(max=corr.behav_weight_cap), raw, over


def pg_loss(logp: torch.Tensor, behav_logp: torch.Tensor, advantages: torch.Tensor,
            mask: torch.Tensor) -> tuple[torch.Tensor, LossStats]:
    """Plain policy gradient, -A log pi_theta (paper decoupled_objective=0)."""
    loss = masked_mean(-advantages * logp, mask)
    log_ratio = (logp.detach() - behav_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    kl = (ratio - 1.0 - log_ratio).clamp(0.0, LOG_RATIO_CLAMP)
    none = torch.zeros_like(mask)
    return loss, _stats(ratio, none, none, none, kl, behav_logp, mask)


def behav_clip_loss(logp: torch.Tensor, behav_logp: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_eps: float, kl_coef: float,
                    corr: Correction = NO_CORRECTION) -> tuple[torch.Tensor, LossStats]:
    """Clipped ratio against the behaviour policy plus k3 KL (paper Listing 4, =1).

    The proximal policy is the behaviour policy here, so there is no behaviour weight to cap.
    """
    if corr.behav_weight_cap is not None:
        raise ValueError("behav_clip has no behaviour weight (prox = behav) to cap")
    token_loss, ratio, is_clipped, is_dual, kl = _clipped_surrogate(
        logp - behav_logp, advantages, clip_eps, corr)
    loss = masked_mean(token_loss, mask) + kl_coef * masked_mean(kl, mask)
    return loss, _stats(ratio, is_clipped, is_dual, torch.zeros_like(mask), kl, behav_logp,
                        mask)


def decoupled_loss(logp: torch.Tensor, behav_logp: torch.Tensor, prox_logp: torch.Tensor,
                   advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float, kl_coef: float,
                   corr: Correction = NO_CORRECTION) -> tuple[torch.Tensor, LossStats]:
    """AReaL eq. 3: (pi_prox/pi_behav) * clipped surrogate of u = pi_theta/pi_prox.

    The behaviour weight is a constant (no gradient) that multiplies the clipped (and
    dual-clipped) token loss; the KL term is taken against prox and is not weighted.
    """
    prox_logp = prox_logp.detach()
    weight, raw, over = _behaviour_weight(prox_logp, behav_logp, corr)
    token_loss, _, is_clipped, is_dual, kl = _clipped_surrogate(
        logp - prox_logp, advantages, clip_eps, corr)
    loss = masked_mean(weight * token_loss, mask) + kl_coef * masked_mean(kl, mask)
    return loss, _stats(raw, is_clipped, is_dual, over, kl, behav_logp, mask)


def a3po_prox_logp(behav_logp: torch.Tensor, logp: torch.Tensor, staleness: torch.Tensor
                   ) -> torch.Tensor:
    """A-3PO's proximal approximation: alpha*behav + (1-alpha)*theta, alpha = 1/d (0 if d=0)."""
    d = staleness.float()
    alpha = torch.where(d >= 1, 1.0 / d.clamp(min=1.0), torch.zeros_like(d))
    return alpha * behav_logp + (1.0 - alpha) * logp.detach()


def a3po_loss(logp: torch.Tensor, behav_logp: torch.Tensor, staleness: torch.Tensor,
              advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float, kl_coef: float,
              corr: Correction = NO_CORRECTION) -> tuple[torch.Tensor, LossStats]:
    """Decoupled PPO with the loglinear proximal policy of A-3PO (seed 004): no extra forward."""
    prox = a3po_prox_logp(behav_logp, logp, staleness)
    return decoupled_loss(logp, behav_logp, prox, advantages, mask, clip_eps, kl_coef, corr)


# --- the registered objectives (registry.py): one signature, (Inputs, Knobs) -> (loss, stats)


@dataclass(frozen=True)
class Inputs:
    """One minibatch as an objective sees it; token tensors are [B, R] with a 0/1 `mask`."""

    logp: torch.Tensor  # the current policy's log-probs (carries the gradient)
    behav: torch.Tensor  # the behaviour policy's, recorded when the tokens were sampled
    prox: torch.Tensor | None  # the proximal policy's, recomputed (`needs_prox`), else None
    advantages: torch.Tensor
    mask: torch.Tensor
    staleness: torch.Tensor  # policy versions between each token's sampling and this update


@dataclass(frozen=True)
class Knobs:
    """The train settings a loss may read."""

    clip_eps: float
    kl_coef: float
    corr: Correction = NO_CORRECTION


def pg(x: Inputs, k: Knobs) -> tuple[torch.Tensor, LossStats]:
    return pg_loss(x.logp, x.behav, x.advantages, x.mask)


def behav_clip(x: Inputs, k: Knobs) -> tuple[torch.Tensor, LossStats]:
    return behav_clip_loss(x.logp, x.behav, x.advantages, x.mask, k.clip_eps, k.kl_coef,
                           k.corr)


def decoupled(x: Inputs, k: Knobs) -> tuple[torch.Tensor, LossStats]:
    assert x.prox is not None, "decoupled needs the recomputed proximal log-probs"
    return decoupled_loss(x.logp, x.behav, x.prox, x.advantages, x.mask, k.clip_eps,
                          k.kl_coef, k.corr)


def a3po(x: Inputs, k: Knobs) -> tuple[torch.Tensor, LossStats]:
    return a3po_loss(x.logp, x.behav, x.staleness, x.advantages, x.mask, k.clip_eps,
                     k.kl_coef, k.corr)

