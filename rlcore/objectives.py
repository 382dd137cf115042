"""Policy objectives as pure tensor functions returning `(loss, stats)`.

Three policies are named apart throughout (AReaL's terms):
  behav  the policy that sampled the tokens (log-probs stored at generation time),
  prox   the proximal policy anchoring the trust region (decoupled PPO, a3po),
  logp   the current policy pi_theta being optimised (carries the gradient).
All token tensors are [B, R] (batch, response tokens) with a 0/1 `mask`; losses are token
means over the whole batch (AReaL's token-level aggregation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

LOG_RATIO_CLAMP = 20.0  # the paper's Listing 4 clamp; keeps exp() finite


@dataclass(frozen=True)
class LossStats:
    clip_frac: float  # fraction of tokens whose clipped branch is active
    imp_weight_mean: float  # importance weight vs the behaviour policy (see each objective)
    imp_weight_max: float
    kl: float  # k3 estimate, mean over tokens
    entropy: float  # -mean log pi_behav of the sampled tokens: a Monte-Carlo entropy estimate

    def as_dict(self) -> dict[str, float]:
        names = {"clip_frac": "loss/clip_frac", "imp_weight_mean": "loss/imp_weight_mean",
                 "imp_weight_max": "loss/imp_weight_max", "kl": "loss/kl",
                 "entropy": "policy/entropy"}
        return {names[k]: v for k, v in asdict(self).items()}


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over positions where mask is 1 (0 if the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _stats(weight: torch.Tensor, clipped: torch.Tensor, kl: torch.Tensor,
           behav_logp: torch.Tensor, mask: torch.Tensor) -> LossStats:
    with torch.no_grad():
        on = mask > 0
        w = weight.detach()[on]
        return LossStats(
            clip_frac=float(masked_mean(clipped.float(), mask)),
            imp_weight_mean=float(w.mean()) if w.numel() else 1.0,
            imp_weight_max=float(w.max()) if w.numel() else 1.0,
            kl=float(masked_mean(kl.detach(), mask)),
            entropy=float(-masked_mean(behav_logp, mask)),
        )


def _clipped_surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's -min(r A, clip(r) A) per token, with r = exp(log_ratio); also r, clipped, k3."""
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    token_loss = -torch.min(unclipped, clipped)
    is_clipped = clipped < unclipped  # the min took the clipped branch
    # Schulman's k3 estimator, non-negative by construction; clamped as in the paper.
    kl = (ratio - 1.0 - log_ratio).clamp(0.0, LOG_RATIO_CLAMP)
    return token_loss, ratio, is_clipped, kl


def pg_loss(logp: torch.Tensor, behav_logp: torch.Tensor, advantages: torch.Tensor,
            mask: torch.Tensor) -> tuple[torch.Tensor, LossStats]:
    """Plain policy gradient, -A log pi_theta (paper decoupled_objective=0)."""
    loss = masked_mean(-advantages * logp, mask)
    log_ratio = (logp.detach() - behav_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    kl = (ratio - 1.0 - log_ratio).clamp(0.0, LOG_RATIO_CLAMP)
    return loss, _stats(ratio, torch.zeros_like(mask), kl, behav_logp, mask)


def behav_clip_loss(logp: torch.Tensor, behav_logp: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_eps: float, kl_coef: float
                    ) -> tuple[torch.Tensor, LossStats]:
    """Clipped ratio against the behaviour policy plus k3 KL (paper Listing 4, =1)."""
    token_loss, ratio, is_clipped, kl = _clipped_surrogate(logp - behav_logp, advantages, clip_eps)
    loss = masked_mean(token_loss, mask) + kl_coef * masked_mean(kl, mask)
    return loss, _stats(ratio, is_clipped, kl, behav_logp, mask)


def decoupled_loss(logp: torch.Tensor, behav_logp: torch.Tensor, prox_logp: torch.Tensor,
                   advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float, kl_coef: float
                   ) -> tuple[torch.Tensor, LossStats]:
    """AReaL eq. 3: (pi_prox/pi_behav) * clipped surrogate of u = pi_theta/pi_prox.

    The behaviour weight is a constant (no gradient); the KL term is taken against prox.
    """
    prox_logp = prox_logp.detach()
    behav_w = torch.exp((prox_logp - behav_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    token_loss, _, is_clipped, kl = _clipped_surrogate(logp - prox_logp, advantages, clip_eps)
    loss = masked_mean(behav_w * token_loss, mask) + kl_coef * masked_mean(kl, mask)
    return loss, _stats(behav_w, is_clipped, kl, behav_logp, mask)


def a3po_prox_logp(behav_logp: torch.Tensor, logp: torch.Tensor, staleness: torch.Tensor
                   ) -> torch.Tensor:
    """A-3PO's proximal approximation: alpha*behav + (1-alpha)*theta, alpha = 1/d (0 if d=0)."""
    d = staleness.float()
    alpha = torch.where(d >= 1, 1.0 / d.clamp(min=1.0), torch.zeros_like(d))
    return alpha * behav_logp + (1.0 - alpha) * logp.detach()


def a3po_loss(logp: torch.Tensor, behav_logp: torch.Tensor, staleness: torch.Tensor,
              advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float, kl_coef: float
              ) -> tuple[torch.Tensor, LossStats]:
    """Decoupled PPO with the loglinear proximal policy of A-3PO (seed 004): no extra forward."""
    prox = a3po_prox_logp(behav_logp, logp, staleness)
    return decoupled_loss(logp, behav_logp, prox, advantages, mask, clip_eps, kl_coef)


def compute_advantages(rewards: Sequence[float], group_ids: Sequence[str], baseline: str,
                       normalize: bool) -> list[float]:
    """Reward minus a baseline: the batch mean, the mean of samples sharing a prompt, or none.

    Plain Python: it runs on the controller's critical path, where tensor overhead dominates.
    """
    r = [float(x) for x in rewards]
    if baseline == "batch_mean":
        mean = sum(r) / len(r)
        adv = [x - mean for x in r]
    elif baseline == "group_mean":
        sums: dict[str, list[float]] = {}
        for g, x in zip(group_ids, r, strict=True):
            acc = sums.setdefault(g, [0.0, 0.0])
            acc[0] += x
            acc[1] += 1
        adv = [x - sums[g][0] / sums[g][1] for g, x in zip(group_ids, r, strict=True)]
    else:
        adv = r
    if normalize and len(adv) > 1:
        mean = sum(adv) / len(adv)
        std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (len(adv) - 1))
        adv = [a / (std + 1e-6) for a in adv]
    return adv
