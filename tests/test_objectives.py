"""Objectives against values worked out by hand, and the equivalences between them."""

from __future__ import annotations

import math

import pytest
import torch

from rlcore.algo.advantages import compute_advantages
from rlcore.algo.objectives import (
    NO_CORRECTION,
    Correction,
    LossStats,
    a3po_loss,
    a3po_prox_logp,
    behav_clip_loss,
    decoupled_loss,
    masked_mean,
    pg_loss,
)

L = math.log


def t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


class TestPolicyGradient:
    def test_value(self):
        logp = t([-1.0, -2.0])
        adv = t([0.5, 0.5])
        loss, stats = pg_loss(logp, behav_logp=logp.clone(), advantages=adv, mask=t([1, 1]))
        # -A*logp per token: 0.5*1 = 0.5 and 0.5*2 = 1.0; token mean = 0.75
        assert loss.item() == pytest.approx(0.75)
        assert stats.clip_frac == 0.0
        # entropy estimate = -mean(behav logp) = (1 + 2) / 2
        assert stats.entropy == pytest.approx(1.5)

    def test_mask_excludes_padding(self):
        logp = t([-1.0, -1000.0])
        loss, _ = pg_loss(logp, logp.clone(), t([1.0, 1.0]), mask=t([1, 0]))
        assert loss.item() == pytest.approx(1.0)  # only the first token: -1 * -1

    def test_gradient_is_minus_advantage(self):
        logp = t([-1.0, -2.0]).requires_grad_()
        loss, _ = pg_loss(logp, logp.detach(), t([0.5, -1.0]), t([1, 1]))
        loss.backward()
        # d/dlogp of mean(-A logp) = -A / 2
        assert logp.grad[0].tolist() == pytest.approx([-0.25, 0.5])


class TestBehavClip:
    def test_positive_advantage(self):
        behav = t([0.0, 0.0])
        logp = t([L(1.5), L(0.5)])  # ratios 1.5 and 0.5
        loss, stats = behav_clip_loss(logp, behav, t([1.0, 1.0]), t([1, 1]), clip_eps=0.2,
                                      kl_coef=0.1)
        # token 1: min(1.5, clip->1.2) = 1.2, clipped; token 2: min(0.5, 0.8) = 0.5
        # surrogate = -(1.2 + 0.5) / 2 = -0.85
        # k3: 1.5-1-ln1.5 = 0.0945349, 0.5-1-ln0.5 = 0.1931472, mean 0.1438410
        assert loss.item() == pytest.approx(-0.85 + 0.1 * 0.1438410, abs=1e-6)
        assert stats.clip_frac == pytest.approx(0.5)
        assert stats.imp_weight_max == pytest.approx(1.5)
        assert stats.imp_weight_mean == pytest.approx(1.0)
        assert stats.kl == pytest.approx(0.1438410, abs=1e-6)

    def test_negative_advantage(self):
        logp = t([L(1.5), L(0.5)])
        loss, stats = behav_clip_loss(logp, t([0.0, 0.0]), t([-1.0, -1.0]), t([1, 1]),
                                      clip_eps=0.2, kl_coef=0.0)
        # token 1: min(-1.5, -1.2) = -1.5 (unclipped); token 2: min(-0.5, -0.8) = -0.8 (clipped)
        # loss = (1.5 + 0.8) / 2 = 1.15
        assert loss.item() == pytest.approx(1.15)
        assert stats.clip_frac == pytest.approx(0.5)

    def test_clipped_token_has_no_gradient(self):
        logp = t([L(1.5), L(0.5)]).requires_grad_()
        loss, _ = behav_clip_loss(logp, t([0.0, 0.0]), t([1.0, 1.0]), t([1, 1]), 0.2, 0.0)
        loss.backward()
        # token 1 is clipped (constant 1.2); token 2: d(-r/2)/dlogp = -r/2 = -0.25
        assert logp.grad[0].tolist() == pytest.approx([0.0, -0.25])

    def test_log_ratio_is_clamped(self):
        loss, stats = behav_clip_loss(t([0.0]), t([-100.0]), t([-1.0]), t([1]), 0.2, 1.0)
        assert math.isfinite(loss.item())
        assert stats.kl <= 20.0


class TestDecoupled:
    def test_value(self):
        behav, prox, logp = t([L(0.5)]), t([0.0]), t([L(1.5)])
        loss, stats = decoupled_loss(logp, behav, prox, t([1.0]), t([1]), clip_eps=0.2,
                                     kl_coef=0.0)
        # behaviour weight pi_prox/pi_behav = 1/0.5 = 2; u = 1.5 clipped to 1.2 -> -2 * 1.2
        assert loss.item() == pytest.approx(-2.4)
        assert stats.imp_weight_max == pytest.approx(2.0)
        assert stats.clip_frac == 1.0

    @pytest.mark.parametrize("kl_coef", [0.0, 0.3])
    def test_prox_equal_behaviour_is_behav_clip(self, kl_coef: float):
        torch.manual_seed(0)
        behav = torch.randn(3, 5, dtype=torch.float64) - 2
        logp_a = (behav + 0.3 * torch.randn(3, 5, dtype=torch.float64)).requires_grad_()
        logp_b = logp_a.detach().clone().requires_grad_()
        adv = torch.randn(3, 1, dtype=torch.float64).expand(3, 5)
        mask = t([1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0])
        la, sa = decoupled_loss(logp_a, behav, behav.clone(), adv, mask, 0.2, kl_coef)
        lb, sb = behav_clip_loss(logp_b, behav, adv, mask, 0.2, kl_coef)
        la.backward()
        lb.backward()
        assert la.item() == pytest.approx(lb.item(), abs=1e-12)
        assert torch.allclose(logp_a.grad, logp_b.grad, atol=1e-12)
        assert sa.clip_frac == sb.clip_frac and sa.kl == pytest.approx(sb.kl)


class TestA3PO:
    def test_prox_interpolation(self):
        behav, logp = t([L(0.25)] * 3), t([0.0] * 3)
        prox = a3po_prox_logp(behav, logp, staleness=t([0, 1, 2]))
        # d=0: alpha=0 -> theta (log 1 = 0); d=1: alpha=1 -> behav; d=2: alpha=1/2 -> log 0.5
        assert prox[0].tolist() == pytest.approx([0.0, L(0.25), L(0.5)])

    def test_value_at_staleness_two(self):
        loss, stats = a3po_loss(t([0.0]), t([L(0.25)]), staleness=t([2]), advantages=t([1.0]),
                                mask=t([1]), clip_eps=0.2, kl_coef=0.0)
        # prox = 0.5 (log-linear midpoint); weight = 0.5/0.25 = 2; u = 1/0.5 = 2 -> clipped 1.2
        assert loss.item() == pytest.approx(-2.4)
        assert stats.imp_weight_max == pytest.approx(2.0)

    def test_sandwich(self):
        torch.manual_seed(1)
        behav, logp = torch.randn(4, 6) - 2, torch.randn(4, 6) - 2
        prox = a3po_prox_logp(behav, logp, torch.randint(0, 6, (4, 6)))
        assert torch.all(prox >= torch.minimum(behav, logp) - 1e-6)
        assert torch.all(prox <= torch.maximum(behav, logp) + 1e-6)

    def test_staleness_zero_is_on_policy_clipped_loss(self):
        torch.manual_seed(2)
        behav = torch.randn(3, 4, dtype=torch.float64) - 1
        logp_a = behav.clone().requires_grad_()  # on-policy: pi_theta == pi_behav
        logp_b = behav.clone().requires_grad_()
        adv = torch.randn(3, 1, dtype=torch.float64).expand(3, 4)
        mask = torch.ones(3, 4, dtype=torch.float64)
        la, _ = a3po_loss(logp_a, behav, torch.zeros(3, 4), adv, mask, 0.2, 0.0)
        lb, _ = behav_clip_loss(logp_b, behav, adv, mask, 0.2, 0.0)
        la.backward()
        lb.backward()
        assert la.item() == pytest.approx(lb.item(), abs=1e-12)
        assert torch.allclose(logp_a.grad, logp_b.grad, atol=1e-12)


class TestAdvantages:
    rewards = [1, 0, 0, 0, 1, 1, 0, 0]
    groups = ["a"] * 4 + ["b"] * 4

    def test_group_mean(self):
        adv = compute_advantages(self.rewards, self.groups, "group_mean", normalize=False)
        # group a mean 0.25, group b mean 0.5
        assert adv == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])

    def test_batch_mean(self):
        adv = compute_advantages(self.rewards, self.groups, "batch_mean", normalize=False)
        assert adv == pytest.approx([r - 0.375 for r in self.rewards])

    def test_none_and_normalize(self):
        assert compute_advantages([1, 0], ["a", "b"], "none", False) == [1.0, 0.0]
        adv = compute_advantages([1, 0], ["a", "b"], "batch_mean", True)
        # [0.5, -0.5] / std (sample std of [0.5, -0.5] = 0.7071)
        assert adv == pytest.approx([0.70710, -0.70710], abs=1e-4)


def test_masked_mean_of_empty_mask_is_zero():
    assert masked_mean(t([5.0]), t([0.0])).item() == 0.0


class TestCorrectionKnobs:
    """AReaL's ppo_actor_loss_fn knobs, each against a loss worked out by hand."""

    # decoupled, u = pi_theta/pi_prox = 1 on every token; behaviour weights 2, 0.5, 4, 1
    WEIGHTS = [2.0, 0.5, 4.0, 1.0]
    ADV = [1.0, 1.0, -1.0, -1.0]

    def weighted(self, corr: Correction) -> tuple[torch.Tensor, LossStats, torch.Tensor]:
        prox = t([-1.0] * 4)
        behav = prox - torch.log(t(self.WEIGHTS))
        logp = prox.clone().requires_grad_(True)
        loss, stats = decoupled_loss(logp, behav, prox, t(self.ADV), t([1.0] * 4), 0.2, 0.0,
                                     corr)
        loss.backward()
        return loss.detach(), stats, logp.grad

    def test_no_cap(self):
        loss, stats, _ = self.weighted(NO_CORRECTION)
        # token losses -A * w (u = 1, unclipped): -2, -0.5, +4, +1 -> 2.5 / 4
        assert float(loss) == pytest.approx(0.625)
        assert stats.capped_frac == 0.0 and stats.imp_weight_max == pytest.approx(4.0)

    def test_mask_drops_the_token_but_keeps_it_in_the_denominator(self):
        loss, stats, grad = self.weighted(Correction(behav_weight_cap=3.0))
        # weight 4 > 3 is masked to 0: (-2 - 0.5 + 0 + 1) / 4 tokens, not / 3
        assert float(loss) == pytest.approx(-0.375)
        assert stats.capped_frac == pytest.approx(0.25)
        assert float(grad[0, 2]) == 0.0  # no gradient through a masked token
        # the raw weight is still what is reported
        assert stats.imp_weight_max == pytest.approx(4.0)

    def test_clamp_truncates_the_weight(self):
        loss, stats, grad = self.weighted(Correction(behav_weight_cap=3.0,
                                                     behav_weight_mode="clamp"))
        # weight 4 -> 3: (-2 - 0.5 + 3 + 1) / 4
        assert float(loss) == pytest.approx(0.375)
        assert stats.capped_frac == pytest.approx(0.25)
        # d/dlogp of -A w u at u = 1 is -A w / 4: token 3 has A = -1, w = 3
        assert float(grad[0, 2]) == pytest.approx(3.0 / 4)

    def dual(self, c: float | None, weights: list[float]) -> tuple[torch.Tensor, LossStats]:
        # u = 5, 1.1, 5, 0.5 against prox; A = -1, -1, +1, +1
        prox = t([-2.0] * 4)
        logp = prox + torch.log(t([5.0, 1.1, 5.0, 0.5]))
        behav = prox - torch.log(t(weights))
        return decoupled_loss(logp, behav, prox, t([-1.0, -1.0, 1.0, 1.0]), t([1.0] * 4),
                              0.2, 0.0, Correction(dual_clip=c))

    def test_dual_clip_binds_on_one_token(self):
        ones = [1.0] * 4
        loss, stats = self.dual(None, ones)
        # -min(uA, clip(u)A): 5 (A < 0, the unclipped branch), 1.1, -1.2 (clipped), -0.5
        assert float(loss) == pytest.approx((5 + 1.1 - 1.2 - 0.5) / 4)
        assert stats.clip_frac == pytest.approx(0.25) and stats.dual_clip_frac == 0.0
        loss, stats = self.dual(3.0, ones)
        # min(5, c |A| = 3) = 3 on the first token only
        assert float(loss) == pytest.approx((3 + 1.1 - 1.2 - 0.5) / 4)
        assert stats.dual_clip_frac == pytest.approx(0.25)
        assert stats.clip_frac == pytest.approx(0.25)

    def test_dual_clip_comes_before_the_behaviour_weight(self):
        loss, _ = self.dual(3.0, [2.0, 1.0, 1.0, 1.0])
        # first token: min(5, 3) * 2 = 6 (the weight after the bound), not min(10, 3) = 3
        assert float(loss) == pytest.approx((6 + 1.1 - 1.2 - 0.5) / 4)

    def asymmetric(self, high: float | None) -> tuple[torch.Tensor, LossStats]:
        behav = t([-1.0] * 4)
        logp = behav + torch.log(t([1.5, 0.5, 1.25, 0.9]))
        return behav_clip_loss(logp, behav, t([1.0, -1.0, 1.0, -1.0]), t([1.0] * 4), 0.2, 0.0,
                               Correction(clip_eps_high=high))

    def test_asymmetric_clip_on_both_sides(self):
        loss, stats = self.asymmetric(0.28)
        # clip(r, 0.8, 1.28): r = 1.5, A > 0 -> -1.28 (upper, clip_eps_high); r = 0.5, A < 0
        # -> +0.8 (lower, clip_eps); r = 1.25 inside -> -1.25; r = 0.9 inside -> +0.9
        assert float(loss) == pytest.approx((-1.28 + 0.8 - 1.25 + 0.9) / 4)
        assert stats.clip_frac == pytest.approx(0.5)
        loss, stats = self.asymmetric(None)  # symmetric: 1.25 is clipped to 1.2 as well
        assert float(loss) == pytest.approx((-1.2 + 0.8 - 1.2 + 0.9) / 4)
        assert stats.clip_frac == pytest.approx(0.75)

    def test_behav_clip_has_no_behaviour_weight_to_cap(self):
        x = t([-1.0])
        with pytest.raises(ValueError, match="no behaviour weight"):
            behav_clip_loss(x, x, x, t([1.0]), 0.2, 0.0, Correction(behav_weight_cap=2.0))
