"""train.lora: config checks, what trains, the adapters sampling applies unmerged, delivery
checked on arrival, and a LoRA run in every mode, evaluated and replayed."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlcore.cli import main
from rlcore.config import ConfigError, LoraConfig, RunConfig, config_from_dict
from rlcore.errors import DeliveryFailed, WorkerFailed
from rlcore.policy import digest, lora
from rlcore.policy.decode_step import Weights
from rlcore.policy.digest import state_digest
from rlcore.policy.hf_policy import HFPolicy
from rlcore.policy.train_batch import TrainBatch
from rlcore.record.rundir import read_jsonl, validate_summary
from rlcore.replay.replayer import replay_run
from rlcore.runners import run_mode
from rlcore.runners.asynchronous import rollout as rollout_role
from rlcore.runners.asynchronous.vehicles import Threads
from rlcore.runners.asynchronous.weight_slots import (
    WeightSlots,
    check_arrival,
    spec_bytes,
    trainable_spec,
)
from tests.conftest import small_config

RANK = 4


def lora_config(model_dir: Path, mode: str = "sync", **lora_keys: Any) -> RunConfig:
    return config_from_dict(small_config(model_dir, mode=mode, train={
        "updates": 4, "lora": {"rank": RANK, **lora_keys}}))


def batch_of(policy: HFPolicy, rows: int = 8, seed: int = 0) -> TrainBatch:
    """Responses sampled by the policy, with made-up advantages of both signs."""
    rng = random.Random(seed)
    prompts = [policy.encode_prompt(f"{rng.randint(1, 9)}+{rng.randint(1, 9)}=")
               for _ in range(rows)]
    from rlcore.policy.sampler import Draws

    gens = policy.generate(prompts, max_new_tokens=4, temperature=1.0, chunk_tokens=4,
                           draws=Draws(seed, [(i, 0) for i in range(rows)]))
    return TrainBatch([g.prompt_ids for g in gens], [g.response_ids for g in gens],
                      [g.logprobs for g in gens], [[0] * len(g.response_ids) for g in gens],
                      [rng.choice([-1.0, 1.0]) for _ in gens])


# --- config -------------------------------------------------------------------------------
class TestConfig:
    def test_absent_is_full_fine_tuning(self, tiny_model_dir: Path):
        assert config_from_dict(small_config(tiny_model_dir)).train.lora is None

    def test_a_bad_value_names_its_key(self, tiny_model_dir: Path):
        for keys, said in [({"rank": 0}, "train.lora.rank"),
                           ({"targets": []}, "train.lora.targets"),
                           ({"dropout": 1.0}, "train.lora.dropout"),
                           ({"ranks": 4}, "under 'train.lora'")]:
            with pytest.raises(ConfigError, match=said):
                config_from_dict(small_config(tiny_model_dir, train={"lora": keys}))

    def test_a_target_the_model_lacks(self, tiny_model_dir: Path, tmp_path: Path):
        cfg = lora_config(tiny_model_dir, targets=["q_proj", "c_attn"])
        with pytest.raises(ConfigError, match=r"train.lora.targets names \['c_attn'\].*q_proj"):
            run_mode(cfg, tmp_path / "run")
        assert not (tmp_path / "run").exists()  # refused before anything was written

    def test_a_rank_above_a_layer_width(self, tiny_model_dir: Path, tmp_path: Path):
        cfg = lora_config(tiny_model_dir, rank=4096)
        with pytest.raises(ConfigError, match="train.lora.rank 4096 is above the width"):
            run_mode(cfg, tmp_path / "run")

    def test_the_reference_lists_the_section(self):
        from rlcore.config import config_reference_markdown

        text = config_reference_markdown()
        assert "## `train.lora`, when set" in text and "| `rank` | `8` |" in text


# --- what trains ----------------------------------------------------------------------------
class TestTraining:
    def test_only_the_adapters_train_and_every_one_moves(self, tiny_model_dir: Path):
        cfg = lora_config(tiny_model_dir)
        policy = HFPolicy(cfg.model, cfg.train, role="trainer")
        base_before = {n: t.clone() for n, t in lora.peft_base_state(policy.model).items()}
        adapter_before = policy.export_state()
        groups = policy.optimizer.param_groups if policy.optimizer else []
        assert {id(p) for g in groups for p in g["params"]} == \
            {id(t) for t in policy.state_tensors().values()}
        for seed in range(3):  # B starts at zero, so A's gradient needs a step first
            policy.update(batch_of(policy, seed=seed), temperature=1.0, current_version=seed)
        after = policy.export_state()
        assert set(after) == set(adapter_before) and len(after) == 2 * 7 * 2  # 2 layers
        assert all(not torch.equal(adapter_before[n], after[n]) for n in after)
        base_after = lora.peft_base_state(policy.model)
        assert set(base_after) == {n for n, _ in
                                   HFPolicy(cfg.model, config_from_dict(small_config(
                                       tiny_model_dir)).train).model.named_parameters()}
        assert all(torch.equal(base_before[n], base_after[n]) for n in base_after)

    def test_version_zero_is_the_base_in_every_role(self, tiny_model_dir: Path):
        cfg = lora_config(tiny_model_dir)
        trainer = HFPolicy(cfg.model, cfg.train, role="trainer")
        rollout = HFPolicy(cfg.model, cfg.train, role="rollout")
        assert trainer.state_digest() == rollout.state_digest()
        assert trainer.base_digest() == rollout.base_digest()
        full = HFPolicy(cfg.model, config_from_dict(small_config(tiny_model_dir)).train)
        assert rollout.base_digest() == full.base_digest()

    def test_one_base_digest_whatever_dtype_a_role_holds(self, tiny_model_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
        from rlcore.policy import hf_policy

        # what a GPU under model.dtype fp16 resolves: the rollout holds its weights in fp16
        monkeypatch.setattr(hf_policy, "sampling_dtype", lambda cfg, dev: torch.float16)
        cfg = lora_config(tiny_model_dir)
        trainer = HFPolicy(cfg.model, cfg.train, role="trainer")
        rollout = HFPolicy(cfg.model, cfg.train, role="rollout")
        assert {p.dtype for p in rollout.model.parameters()} >= {torch.float16}
        assert trainer.base_digest() == rollout.base_digest()
        assert rollout.base_id().dtype == "float32"
        assert rollout.base_id().files == ("model.safetensors",)

    def test_a_differing_base_says_what_differs(self):
        here = lora.BaseId("sha256:1", "float32", ("model.safetensors",))
        saved = {"base_digest": "sha256:1", "base_dtype": "float32",
                 "base_files": ["model.safetensors"]}
        assert here.differs(saved) is None
        for change, said in [({"base_dtype": "float16"}, "of float16 weights, this one of "
                                                          "float32"),
                             ({"base_files": ["a.safetensors"]}, r"weight files \['a."),
                             ({}, "same names, but their weights differ"),
                             ({"base_dtype": None}, "records neither the dtype")]:
            other = {k: v for k, v in {**saved, "base_digest": "sha256:2", **change}.items()
                     if v is not None}
            assert re.search(said, here.differs(other) or ""), (change, here.differs(other))

    def test_the_rollout_applies_what_it_loads_unmerged(self, tiny_model_dir: Path):
        cfg = lora_config(tiny_model_dir)
        trainer = HFPolicy(cfg.model, cfg.train, role="trainer")
        for seed in range(2):
            trainer.update(batch_of(trainer, seed=seed), temperature=1.0, current_version=seed)
        rollout = HFPolicy(cfg.model, cfg.train, role="rollout")
        base = {n: p.detach().clone() for n, p in rollout.model.named_parameters()}
        step = Weights.of(rollout.model)
        rollout.load_state(trainer.export_state())
        assert rollout.state_digest() == trainer.state_digest()
        # the base is untouched, and the decode step reads the loaded adapters in place
        assert all(torch.equal(p, base[n]) for n, p in rollout.model.named_parameters()
                   if ".lora_" not in n)
        live = {t.data_ptr() for t in rollout.state_tensors().values()}
        ads = [ad for layer in step.layers for ad in (layer.q_ad, layer.k_ad, layer.v_ad,
                                                      layer.o_ad, layer.gate_ad, layer.up_ad,
                                                      layer.down_ad)]
        assert all(ad is not None for ad in ads)
        assert {t.data_ptr() for ad in ads if ad is not None for t in (ad.a, ad.b)} == live
        # the rollout samples unmerged; the trainer recomputes with PEFT's forward: they agree
        # to rounding
        batch = batch_of(rollout, seed=5)
        recomputed = trainer.recompute_logprobs(batch.prompt_ids, batch.response_ids, 1.0)
        gap = max(abs(x - y) for r, q in zip(batch.behav_logprobs, recomputed, strict=True)
                  for x, y in zip(r, q, strict=True))
        print(f"largest |log-prob rollout - trainer| under LoRA, fp32: {gap:.3g}")
        assert gap < 1e-5

    def test_dropout_draws_are_keyed_by_the_update(self, tiny_model_dir: Path):
        cfg = lora_config(tiny_model_dir, dropout=0.5)
        runs = []
        for _ in range(2):
            torch.manual_seed(123)
            policy = HFPolicy(cfg.model, cfg.train, role="trainer")
            batch = batch_of(policy)
            torch.manual_seed(_)  # the global generator must not matter
            policy.update(batch, temperature=1.0, current_version=0)
            runs.append(policy.state_digest())
        assert runs[0] == runs[1]

    def test_dropout_masks_the_update_and_nothing_else(self, tiny_model_dir: Path):
        states = {}
        for p in (0.0, 0.5):
            cfg = lora_config(tiny_model_dir, dropout=p)
            policy = HFPolicy(cfg.model, cfg.train, role="trainer")
            batch = batch_of(policy)  # the same responses: version 0 is the base either way
            policy.update(batch, temperature=1.0, current_version=0)
            states[p] = policy.state_digest()
            twice = [policy.recompute_logprobs(batch.prompt_ids, batch.response_ids, 1.0)
                     for _ in range(2)]
            assert twice[0] == twice[1]  # off outside the update: a forward is deterministic
        assert states[0.0] != states[0.5]

    def test_a_fresh_trainer_recomputes_without_dropout(self, tiny_model_dir: Path):
        """Before its first update (whose proximal recompute comes first) a trainer holding
        adapters that move the output (B not zero: a later version, loaded) recomputes
        deterministically: PEFT makes its dropout modules in train mode."""
        cfg = lora_config(tiny_model_dir, dropout=0.5)
        policy = HFPolicy(cfg.model, cfg.train, role="trainer")
        g = torch.Generator().manual_seed(0)
        policy.load_state({n: torch.randn(t.shape, generator=g) * 0.1
                           for n, t in policy.export_state().items()})
        batch = batch_of(policy)
        twice = [policy.recompute_logprobs(batch.prompt_ids, batch.response_ids, 1.0)
                 for _ in range(2)]
        assert twice[0] == twice[1]
        assert not [n for n, m in policy.model.named_modules() if m.training]


def test_two_roles_wrapping_at_once_keep_the_warning_filters_and_the_generator(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    """The threaded runner's rollout and trainer wrap their models at once; each wrap
    silences one warning and forks the global generator, so each must restore what it saw,
    not what the other saved."""
    import threading
    import time
    import warnings

    import peft
    from transformers import AutoModelForCausalLM

    real = peft.get_peft_model
    first = threading.Event()

    def slow(model: Any, config: Any) -> Any:  # both inside at once, the first out first
        late = first.is_set()
        first.set()
        time.sleep(0.6 if late else 0.3)
        warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning,
                      stacklevel=2)
        torch.rand(1)  # PEFT's initialisation draws
        return real(model, config)

    monkeypatch.setattr(peft, "get_peft_model", slow)
    models = [AutoModelForCausalLM.from_pretrained(tiny_model_dir) for _ in range(2)]
    chosen = lora.targets(models[0], LoraConfig(rank=2))
    failed: list[BaseException] = []

    def role(i: int) -> None:
        time.sleep(0.1 * i)
        try:
            lora.wrap(models[i], LoraConfig(rank=2), chosen)
        except BaseException as e:
            failed.append(e)

    before = torch.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        threads = [threading.Thread(target=role, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert not failed, failed
    assert torch.equal(torch.get_rng_state(), before)


class TestUnmerged:
    """Sampling applies the adapters unmerged (decode_step.py::linear, PEFT's forward), so an
    update below half an ulp of an fp16 base is not rounded away."""

    def test_an_update_below_half_an_fp16_ulp_reaches_the_output(self):
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        from rlcore.policy.decode_step import Adapter, linear

        n, rank, s = 64, 8, 4.0
        w0 = torch.full((n, n), 0.03, dtype=torch.float16)  # as an fp16 rollout holds it
        a, b = torch.full((rank, n), 0.01), torch.full((n, rank), 1e-5)
        update = s * b @ a  # 3.2e-6 per entry: under half an ulp of 0.03 in fp16 (7.6e-6)
        assert torch.equal((w0.float() + update).half(), w0)  # merged, it would be lost
        h = torch.linspace(-1, 2, n, dtype=torch.float16)[None]  # [1, 64]
        # a bias that cancels the base's product (q_proj has one), so the output is at the
        # update's scale, where fp16 resolves it
        bias = -(h.float() @ w0.float().T)[0].half()
        base = linear(h, w0, bias, None)
        out = linear(h, w0, bias, Adapter(a, b, s))
        expected = (h.float() @ update.T)[0]  # scale * B @ A @ h
        assert out.dtype == torch.float16 and expected.abs().min() > 1e-4
        assert ((out.float() - base.float())[0] / expected - 1).abs().max() < 0.5
        # op for op PEFT's forward over the same fp16 base and fp32 adapters
        layer = torch.nn.Linear(n, n, dtype=torch.float16)
        with torch.no_grad():
            layer.weight.copy_(w0)
            layer.bias.copy_(bias)
        peft_model = get_peft_model(torch.nn.Sequential(layer), PeftLoraConfig(
            r=rank, lora_alpha=int(s * rank), target_modules=["0"]))
        peft_layer = peft_model.base_model.model[0]
        with torch.no_grad():
            peft_layer.lora_A["default"].weight.copy_(a)
            peft_layer.lora_B["default"].weight.copy_(b)
            assert peft_layer.lora_A["default"].weight.dtype == torch.float32
            assert torch.equal(peft_layer(h), out)

    def test_an_fp16_rollouts_targets_compute_as_the_trainers_under_autocast(
            self, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
        from rlcore.policy import hf_policy

        cfg = lora_config(tiny_model_dir)
        trainer = HFPolicy(cfg.model, cfg.train, role="trainer")
        for seed in range(2):
            trainer.update(batch_of(trainer, seed=seed), temperature=1.0, current_version=seed)
        monkeypatch.setattr(hf_policy, "sampling_dtype", lambda cfg, dev: torch.float16)
        rollout = HFPolicy(cfg.model, cfg.train, role="rollout")
        rollout.load_state(trainer.export_state())
        gen = torch.Generator().manual_seed(0)
        worst = 0.0
        for t in rollout.targets:
            h = torch.randn(64, t.in_features, generator=gen).half()
            with torch.no_grad():
                mine = rollout.model.get_submodule(t.path)(h).double()
                # the trainer's forward as on a GPU under model.dtype fp16: fp32 weights under
                # fp16 autocast (the CPU's)
                with torch.autocast("cpu", dtype=torch.float16):
                    layer = trainer.model.get_submodule(lora.PREFIX + t.path)
                    theirs = layer(h.float()).double()
            worst = max(worst, ((mine - theirs).abs().mean() / theirs.abs().mean()).item())
        # merged into fp16 weights they differ by about 3e-4: the merge's own rounding
        print(f"fp16 rollout's targets vs the trainer's under autocast: {worst:.2g} relative")
        assert worst < 5e-5

    def test_an_fp16_rollout_samples_the_trainers_adapters(self, tiny_model_dir: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
        from rlcore.policy import hf_policy

        cfg = lora_config(tiny_model_dir)
        trainer = HFPolicy(cfg.model, cfg.train, role="trainer")
        # what a GPU under fp16 resolves: on CPU the rollout then computes in fp16 throughout
        monkeypatch.setattr(hf_policy, "sampling_dtype", lambda cfg, dev: torch.float16)
        rollout = HFPolicy(cfg.model, cfg.train, role="rollout")
        assert rollout.decoders.kind == "static"
        gen = torch.Generator().manual_seed(0)
        state = trainer.export_state()
        for name in state:  # an update the log-probabilities show well above fp16's rounding
            if ".lora_B." in name:
                state[name] = 3e-3 * torch.randn(state[name].shape, generator=gen)
        batch = batch_of(trainer, rows=8, seed=5)
        base = trainer.recompute_logprobs(batch.prompt_ids, batch.response_ids, 1.0)
        trainer.load_state(state)
        rollout.load_state(state)
        sampled = batch_of(rollout, rows=8, seed=5)
        recomputed = trainer.recompute_logprobs(sampled.prompt_ids, sampled.response_ids, 1.0)

        def gap(x: list[list[float]], y: list[list[float]]) -> float:
            return max(abs(p - q) for r, s in zip(x, y, strict=True)
                       for p, q in zip(r, s, strict=True))

        moved = gap(trainer.recompute_logprobs(batch.prompt_ids, batch.response_ids, 1.0),
                    base)
        behind = gap(sampled.behav_logprobs, recomputed)
        print(f"fp16 rollout vs fp32 trainer under LoRA: largest |log-prob gap| {behind:.3g}, "
              f"against {moved:.3g} that the update moved them")
        assert behind < moved / 4


# --- delivery ------------------------------------------------------------------------------
def withhold_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every rollout policy's loads land in a copy: its sampling weights never change."""
    live = HFPolicy.state_tensors

    def withheld(self: HFPolicy) -> dict[str, torch.Tensor]:
        state = live(self)
        return {n: t.clone() for n, t in state.items()} if self.optimizer is None else state

    monkeypatch.setattr(HFPolicy, "state_tensors", withheld)


def moving_lora_config(model_dir: Path) -> RunConfig:
    """A threaded LoRA run whose adapter moves at every version: the tiny model's rewards may
    all be 0 (no gradient), but AdamW's weight decay still shrinks the A matrices."""
    return config_from_dict(small_config(model_dir, mode="async", train={
        "updates": 4, "weight_decay": 0.1, "lora": {"rank": RANK}}))


class TestDelivery:
    def slots(self, digests: bool = True) -> WeightSlots:
        spec = [("w", (3,), torch.float32)]
        return WeightSlots(spec, 2, Threads().locked_array(4), shared=False, digests=digests)

    def test_a_reader_gets_the_digest_published_with_its_copy(self):
        slots = self.slots()
        state = {"w": torch.tensor([1.0, 2.0, 3.0])}
        slots.write(1, [state["w"]])
        slots.publish(1, 5, state_digest(state))
        got = {"w": torch.zeros(3)}
        assert slots.read_into([got["w"]]) == 5
        assert slots.last_digest == state_digest(state)
        check_arrival(slots, 5, got, "rollout0")  # what arrived is what was published

    def test_a_state_that_did_not_arrive_stops_the_reader(self):
        slots = self.slots()
        published = {"w": torch.tensor([1.0, 2.0, 3.0])}
        slots.write(1, [published["w"]])
        slots.publish(1, 3, state_digest(published))
        slots.read_into([torch.zeros(3)])  # into a copy: the reader's own state is untouched
        with pytest.raises(DeliveryFailed, match="rollout0 loaded policy version 3"):
            check_arrival(slots, 3, {"w": torch.zeros(3)}, "rollout0")

    def test_slots_without_digests_check_nothing(self):
        slots = self.slots(digests=False)
        slots.write(0, [torch.ones(3)])
        slots.publish(0, 0)
        slots.read_into([torch.zeros(3)])
        assert slots.last_digest is None
        check_arrival(slots, 0, {"w": torch.zeros(3)}, "rollout0")

    @staticmethod
    def count_copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
        """Every `Tensor.to`, `.cpu` and `.copy_` made from now on, by name."""
        calls: list[str] = []
        for name in ("to", "cpu", "copy_"):
            real = getattr(torch.Tensor, name)

            def counted(self, *a, _real=real, _name=name, **k):  # type: ignore[no-untyped-def]
                calls.append(_name)
                return _real(self, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, counted)
        return calls

    def test_an_arrival_check_copies_once_per_dtype(self, tiny_model_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
        """Each device-to-host copy blocks (behind another role's kernels on a shared
        stream): a state of adapters is hashed through one per dtype, not one per tensor."""
        spec = trainable_spec(str(tiny_model_dir), LoraConfig(rank=RANK))
        assert len({n.split(".layers.")[1].split(".")[0] for n, _, _ in spec}) == 2
        g = torch.Generator().manual_seed(0)
        state = {n: torch.randn(shape, generator=g).to(dtype) for n, shape, dtype in spec}
        slots = SimpleNamespace(last_digest=state_digest(state))
        calls = self.count_copies(monkeypatch)
        check_arrival(slots, 1, state, "rollout0")  # type: ignore[arg-type]
        assert len(state) > 2 and len(calls) == len({t.dtype for t in state.values()}) == 1

    def test_the_digest_is_one_pass_over_each_tensor_s_bytes_in_name_order(
            self, monkeypatch: pytest.MonkeyPatch):
        """Grouping the copies by dtype leaves the digest's value as it was: each tensor's
        name, dtype, shape and bytes, in name order."""
        import hashlib


        def by_hand(state: dict[str, torch.Tensor]) -> str:
            h = hashlib.sha256()
            for name in sorted(state):
                t = state[name].contiguous()
                h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
                h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            return "sha256:" + h.hexdigest()

        g = torch.Generator().manual_seed(1)
        state = {"b": torch.randn(4, 3, generator=g).t(),  # not contiguous
                 "a": torch.randn(5, generator=g).half(), "c": torch.randn(2, 2, generator=g),
                 "d": torch.randn(3, generator=g) > 0, "e": torch.zeros(0, 2),
                 "f": torch.randn(6, generator=g).bfloat16(), "g": torch.randn(7, generator=g)}
        expected = by_hand(state)
        calls = self.count_copies(monkeypatch)
        assert state_digest(state) == expected
        assert len(calls) == len({t.dtype for t in state.values()}) == 4
        monkeypatch.setattr(digest, "DIGEST_COPY_BYTES", 16)  # a copy or more per tensor
        assert state_digest(state) == expected
        assert state_digest({**state, "c": state["c"] + 1}) != expected

    def test_a_publication_without_its_digest_is_refused(self):
        with pytest.raises(ValueError, match="without its digest"):
            self.slots().publish(0, 0)

    @pytest.mark.slow
    def test_a_rollout_whose_adapter_is_withheld_stops_the_run(
            self, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        withhold_adapters(monkeypatch)
        # the rollout worker refuses the first version after 0 it loads (which one is up to
        # timing); had it loaded none, the run's end would refuse the last
        with pytest.raises((WorkerFailed, DeliveryFailed)) as failed:
            run_mode(moving_lora_config(tiny_model_dir), tmp_path / "run")
        said = f"{failed.value}\n{failed.value.__cause__}"
        assert re.search(r"(rollout0|the run's end) loaded policy version [1-9]\d* as "
                         r"sha256:\w+, but the parameter service published", said), said
        assert not (tmp_path / "run" / "summary.json").exists()

    @pytest.mark.slow
    def test_the_runs_end_refuses_an_adapter_the_rollout_never_checked(
            self, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
        withhold_adapters(monkeypatch)
        monkeypatch.setattr(rollout_role, "check_arrival", lambda *args: None)
        with pytest.raises(DeliveryFailed, match=r"the run's end loaded policy version 4 "):
            run_mode(moving_lora_config(tiny_model_dir), tmp_path / "run")
        assert not (tmp_path / "run" / "summary.json").exists()


# --- every mode ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lora_runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("lora")
    runs = {}
    for mode in ("sync", "async", "areal"):
        run_mode(lora_config(tiny_model_dir, mode=mode), out / mode)
        runs[mode] = out / mode
    return runs


@pytest.mark.slow
class TestModes:
    @pytest.mark.parametrize("mode", ["sync", "async", "areal"])
    def test_a_run_saves_its_adapter_and_hands_only_it_over(
            self, lora_runs: dict[str, Path], tiny_model_dir: Path, mode: str):
        run = lora_runs[mode]
        summary = json.loads((run / "summary.json").read_text())
        validate_summary(summary)
        assert summary["updates"] == 4
        cfg = lora_config(tiny_model_dir)
        adapter_bytes = spec_bytes(trainable_spec(str(tiny_model_dir), cfg.train.lora))
        full_bytes = spec_bytes(trainable_spec(str(tiny_model_dir)))
        sync = summary["scheduling"]["weight_sync"]
        assert sync["bytes_per_version"] == (0 if mode == "sync" else adapter_bytes)
        assert adapter_bytes < full_bytes / 4
        saved, base = lora.read_adapter(run / "policy")
        assert state_digest(saved) == summary["reproducibility"]["state_digest"]
        rollout = HFPolicy(cfg.model, cfg.train, role="rollout")
        assert base["base_digest"] == rollout.base_digest()
        assert {u["version"] for u in read_jsonl(run / "updates.jsonl")} == {1, 2, 3, 4}

    def test_eval_scores_the_adapter_on_its_base(self, lora_runs: dict[str, Path],
                                                 tiny_model_dir: Path):
        run = lora_runs["areal"]
        assert main(["eval", str(run)]) == 0
        assert main(["eval", str(run), "--weights", "base"]) == 0
        final, base = (json.loads((run / f).read_text()) for f in ("eval.json",
                                                                    "eval_base.json"))
        assert final["policy"] == "final" and base["policy"] == "base"

    def test_eval_refuses_an_adapter_on_another_base(self, lora_runs: dict[str, Path],
                                                     tmp_path: Path):
        run = tmp_path / "sync"
        shutil.copytree(lora_runs["sync"], run)
        meta = json.loads((run / "policy" / lora.BASE_FILE).read_text())
        meta["base_digest"] = "sha256:" + "0" * 64
        (run / "policy" / lora.BASE_FILE).write_text(json.dumps(meta))
        with pytest.raises(ConfigError, match="trained on a base model with digest.*their "
                                              "weights differ"):
            from rlcore.evaluation import evaluate_run

            evaluate_run(run)

    @pytest.mark.parametrize("mode", ["sync", "areal"])
    def test_an_fp16_rollout_evaluates_the_runs_adapter(self, lora_runs: dict[str, Path],
                                                        tmp_path: Path, mode: str,
                                                        monkeypatch: pytest.MonkeyPatch):
        from rlcore.evaluation import evaluate_run
        from rlcore.policy import hf_policy

        run = tmp_path / mode
        shutil.copytree(lora_runs[mode], run)
        # what a GPU under model.dtype fp16 resolves for the evaluating rollout
        monkeypatch.setattr(hf_policy, "sampling_dtype", lambda cfg, dev: torch.float16)
        result, _ = evaluate_run(run)
        assert result["policy"] == "final"

    @pytest.mark.parametrize("mode", ["areal", "sync"])
    def test_a_lora_run_replays_bit_for_bit(self, lora_runs: dict[str, Path], tmp_path: Path,
                                            mode: str):
        summary = replay_run(lora_runs[mode], tmp_path / "replay")
        original = json.loads((lora_runs[mode] / "summary.json").read_text())
        assert summary["reproducibility"]["state_digest"] == \
            original["reproducibility"]["state_digest"]
        a, b = (read_jsonl(d / "updates.jsonl") for d in (lora_runs[mode], tmp_path / "replay"))
        assert [r["loss"] for r in a] == [r["loss"] for r in b]

    def test_a_counterfactual_replay_under_another_objective(self, lora_runs: dict[str, Path],
                                                             tmp_path: Path):
        summary = replay_run(lora_runs["areal"], tmp_path / "cf",
                             overrides=["train.objective=decoupled"])
        assert summary["reproducibility"]["replay"]["kind"] == "counterfactual"
        assert summary["objective"] == "decoupled"


# --- the virtual clock and the planner ------------------------------------------------------
V100 = "v100x2-qwen0.5b-fp16"


class TestPricing:
    def test_an_adapter_update_its_products_and_a_digest_have_their_own_terms(self):
        from rlcore.clock.work import Adapters, Digest, Update, terms

        assert terms(Update(tokens=10)) == {"update.call_s": 1, "update.per_token_s": 10}
        assert terms(Update(tokens=10, frozen_base=True)) == {"lora_update.call_s": 1,
                                                              "lora_update.per_token_s": 10}
        assert terms(Adapters(steps=3, rows=12, params=7)) == {"adapters.call_s": 3,
                                                                "adapters.per_param_s": 84}
        assert terms(Digest(nbytes=2_000_000_000)) == {"sha256.call_s": 1, "sha256.per_gb": 2.0}

    def test_a_lora_sampler_charges_its_adapters_beside_each_decode(self, tiny_model_dir: Path):
        """A decode chunk of a LoRA policy charges `Adapters` for its forward passes' rows at
        rank x (in + out) over the targets; one of every weight charges the same `Decode`
        and no `Adapters`."""
        from transformers import AutoConfig

        from rlcore.clock.work import Adapters, Decode
        from rlcore.policy.sampler import Draws
        from tests.test_sampler import Recorder

        conf = AutoConfig.from_pretrained(str(tiny_model_dir))
        h, layers = conf.hidden_size, conf.num_hidden_layers
        kv_out = conf.num_key_value_heads * h // conf.num_attention_heads
        # q_proj: h in, h out; v_proj: h in, the key/value heads' width out
        params = RANK * ((h + h) + (h + kv_out)) * layers
        charged = {}
        for name, targets in (("lora", ["q_proj", "v_proj"]), ("full", None)):
            cfg = (lora_config(tiny_model_dir, targets=targets) if targets
                   else config_from_dict(small_config(tiny_model_dir)))
            policy = HFPolicy(cfg.model, cfg.train, role="rollout")
            policy.stop_ids = set()  # every row samples every step
            clock = Recorder()
            s = policy.sampler([[5, 6, 7]] * 3, max_new_tokens=5, temperature=1.0,
                               draws=Draws(0, [(i, 0) for i in range(3)]))
            s.clock = clock
            s.step(3)  # 3 tokens, a forward after each: 3 passes of 3 rows
            s.step(3)  # the last 2 tokens, a forward after the first only
            charged[name] = [w for w in clock.work if isinstance(w, Decode | Adapters)]
        assert params > 0 and charged["lora"] == [
            charged["full"][0], Adapters(steps=3, rows=9, params=params),
            charged["full"][1], Adapters(steps=1, rows=3, params=params)]
        assert [(d.steps, d.rows) for d in charged["full"]] == [(3, 9), (2, 3)]

    def test_the_planner_s_sampler_charges_them_as_the_live_one(self):
        from rlcore.clock.work import Adapters, Decode, Work
        from rlcore.plan.sampler import LengthSampler

        for elements in (0, 1000):
            work: list[Work] = []
            s = LengthSampler(work.append, [[1, 1], [2, 2, 2]], [(5, False), (2, True)],
                              max_new_tokens=5, adapter_elements=elements)
            s.step(3)
            s.step(3)
            decodes = [w for w in work if isinstance(w, Decode)]
            adapters = [w for w in work if isinstance(w, Adapters)]
            assert [(d.steps, d.rows) for d in decodes] == [(3, 6), (2, 2)]
            assert adapters == ([] if not elements else [Adapters(3, 6, 1000),
                                                         Adapters(1, 2, 1000)])

    def test_a_profile_that_prices_a_merge_says_what_replaced_it(self):
        import yaml

        from rlcore.clock.profile import HARDWARE_DIR, profile_from_dict

        data = yaml.safe_load((HARDWARE_DIR / f"{V100}.yaml").read_text())
        data["merge"] = data.pop("adapters")
        with pytest.raises(ConfigError, match="old.yaml: key merge is no longer read: "
                                              r"sampling applies LoRA adapters unmerged.*"
                                              r"`adapters` \(call_s, per_param_s"):
            profile_from_dict(data, "old.yaml")
        data.pop("merge")
        assert profile_from_dict(data, "old.yaml").adapters is None  # optional, as before

    def test_a_lora_hand_over_charges_its_digests_and_a_full_one_none(self):
        from rlcore.clock.work import Digest, Weights
        from rlcore.plan.roles import Versions
        from rlcore.runners.asynchronous.weight_slots import copy_work

        assert copy_work(Versions(40), "write") == [Weights("write", 40)]
        assert copy_work(Versions(40, digests=True), "read") == [Weights("read", 40),
                                                                 Digest(40)]
        assert copy_work(TestDelivery().slots(), "read") == [Weights("read", 12), Digest(12)]

    def test_the_paper_profile_prices_the_0_5b_adapters(self):
        from rlcore.clock.profile import load_profile
        from rlcore.clock.work import Adapters, Digest, Weights
        from rlcore.config import LoraConfig

        full = load_profile(V100)
        view = full.under(LoraConfig(rank=8))
        # by hand, Qwen2.5-0.5B: per layer sum(in + out) over the 7 targets is 22,912; 24
        # layers; fp32 adapters
        assert view.model_bytes == 4 * 8 * 22_912 * 24 == 17_596_416
        assert view.lora_view is not None
        assert view.lora_view.adapter_elements == 8 * 22_912 * 24 == 4_399_104
        assert abs(view.model_bytes / (full.model_bytes or 1) - 0.0089) < 1e-4
        copy = view.seconds(Weights("read", 123))  # the run's own bytes do not matter
        assert copy == pytest.approx(0.001 + 17_596_416 / 1e9 / 8.0)
        # the run's own adapters (5 elements) do not matter either: 0.5B's multiply a row
        assert view.seconds(Adapters(steps=3, rows=10, params=5)) == pytest.approx(
            3 * 0.020 + 10 * 4_399_104 * 1.6e-13)
        assert full.under(None).seconds(Adapters(3, 10, 5)) == pytest.approx(
            3 * 0.020 + 10 * 5 * 1.6e-13)
        assert view.seconds(Digest(123)) == pytest.approx(0.007 + 17_596_416 / 1e9 / 1.0)
        attention = full.under(LoraConfig(rank=1, targets=("q_proj", "v_proj")))
        assert attention.model_bytes == 4 * 1 * ((896 + 896) + (896 + 128)) * 24

    def test_a_run_of_every_weight_sees_the_profile_as_it_was(self):
        from rlcore.clock.profile import load_profile
        from rlcore.config import LoraConfig

        full = load_profile(V100)
        assert full.under(None) is full
        assert full.under(LoraConfig()).digest() != full.digest()
        assert full.under(LoraConfig(rank=8)).digest() != full.under(LoraConfig(rank=1)).digest()

    def test_a_profile_that_cannot_price_lora_says_what_it_lacks(self):
        from rlcore.clock.profile import load_profile
        from rlcore.config import LoraConfig

        with pytest.raises(ConfigError, match="cpu-2core cannot price train.lora: it has no "
                                              "lora_update, adapters, sha256"):
            load_profile("cpu-2core").under(LoraConfig())
        with pytest.raises(ConfigError, match=r"names \['c_attn'\], which hardware profile"):
            load_profile(V100).under(LoraConfig(targets=("q_proj", "c_attn")))

    @pytest.mark.slow
    def test_an_emulated_lora_run_is_priced_at_the_paper_s_adapters(
            self, tiny_model_dir: Path, tmp_path: Path):
        from rlcore.clock.profile import load_profile

        summaries = {}
        for rank in (None, 8):
            train: dict[str, Any] = {"updates": 4}
            if rank:
                train["lora"] = {"rank": rank}
            cfg = config_from_dict(small_config(
                tiny_model_dir, mode="areal", train=train,
                runtime={"progress_every": 0, "clock": "virtual", "hardware": V100}))
            summaries[rank] = run_mode(cfg, tmp_path / f"r{rank}")
        full, adapted = summaries[None], summaries[8]
        view = load_profile(V100).under(lora_config(tiny_model_dir, rank=8).train.lora)
        assert adapted["clock"]["profile_digest"] == view.digest()
        assert full["clock"]["profile_digest"] == load_profile(V100).digest()
        # a version's copies: the adapters of Qwen2.5-0.5B, not its 2 GB
        read = adapted["scheduling"]["weight_sync"]["reload_s"]  # copy and check: no merge
        assert read == pytest.approx(0.001 + 17_596_416 / 8e9 + 0.007 + 17_596_416 / 1e9,
                                     rel=1e-6)
        assert full["scheduling"]["weight_sync"]["reload_s"] == pytest.approx(
            0.001 + 1_976_131_072 / 8e9, rel=1e-6)

    def test_the_planner_sweeps_the_rank(self, tiny_model_dir: Path, capsys):
        import yaml

        cfg = small_config(tiny_model_dir, mode="areal",
                           runtime={"hardware": V100, "progress_every": 0})
        path = tiny_model_dir.parent / "plan-lora.yaml"
        path.write_text(yaml.safe_dump(cfg))
        out = tiny_model_dir.parent / "plans.json"
        assert main(["plan", str(path), "--sweep", "train.lora.rank=1,32",
                     "--out", str(out)]) == 0
        plans = json.loads(out.read_text())
        assert [p["train.lora.rank"] for p in plans] == ["1", "32"]
        assert all(p["updates_per_s"] > 0 for p in plans)


# --- the paper's setup with the largest model LoRA fits ------------------------------------
# Qwen2.5-3B-Instruct's config.json where it differs from Qwen2.5-0.5B's
QWEN25_3B = {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
             "num_attention_heads": 16, "num_key_value_heads": 2, "max_window_layers": 70}
PAPER_LORA = Path(__file__).resolve().parents[1] / "config" / "paper-lora.yaml"


def qwen25_3b_on_meta() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlcore.policy.stand_in import QWEN25_05B

    with torch.device("meta"):
        return Qwen2ForCausalLM(Qwen2Config(**{**QWEN25_05B, **QWEN25_3B}))


class TestPaperLora:
    def test_the_3b_profile_prices_qwen2_5_3b_s_shapes(self):
        from rlcore.clock.profile import load_profile

        model = qwen25_3b_on_meta()
        profile = load_profile("v100x2-qwen3b-fp16")
        assert profile.model_bytes == 4 * sum(p.numel() for p in model.parameters())
        chosen = lora.targets(model, LoraConfig(rank=8))
        layers: dict[str, list[int]] = {}
        for t in chosen:
            name = t.path.rsplit(".", 1)[-1]
            layers.setdefault(name, [t.in_features, t.out_features, 0])[2] += 1
        assert {n: list(v) for n, v in (profile.linear_layers or {}).items()} == layers
        view = profile.under(LoraConfig(rank=8))
        assert view.model_bytes == spec_bytes(lora.adapter_spec(chosen, 8))
        assert view.lora_view is not None
        assert view.lora_view.adapter_elements == lora.adapter_elements(chosen, 8)
        assert view.lora_view.adapter_elements == spec_bytes(lora.adapter_spec(chosen, 8)) // 4

    def test_the_arithmetic_of_what_fits_is_the_model_s(self):
        """The counts config/paper-lora.yaml's header works from are Qwen2.5-3B's."""
        model = qwen25_3b_on_meta()
        chosen = lora.targets(model, LoraConfig(rank=8))
        header = PAPER_LORA.read_text()
        for count in (sum(p.numel() for p in model.parameters()),
                      spec_bytes(lora.adapter_spec(chosen, 8)) // 4):
            assert f"{count:,}" in header, count

    def test_it_is_the_paper_s_setup_with_adapters(self):
        from rlcore.config import load_config

        paper = load_config(PAPER_LORA.parent / "paper.yaml")
        adapted = load_config(PAPER_LORA)
        assert adapted.train.lora == LoraConfig(rank=8)
        assert adapted.train.lr == pytest.approx(10 * paper.train.lr)
        assert adapted.runtime.hardware == "v100x2-qwen3b-fp16"
        assert adapted.model.path == "models/Qwen2.5-3B-Instruct"
        same = ("rollout", "task", "staleness", "eval")
        assert [getattr(adapted, s) for s in same] == [getattr(paper, s) for s in same]

    def test_it_plans_on_a_stand_in_s_tokenizer(self, tmp_path: Path, capsys):
        from rlcore.policy.stand_in import build_stand_in

        build_stand_in(tmp_path / "m", "tiny")
        out = tmp_path / "plans.json"
        assert main(["plan", str(PAPER_LORA), "--set", f"model.path={tmp_path / 'm'}",
                     "--set", "mode=areal", "--sweep", "train.lora.rank=8",
                     "--out", str(out)]) == 0
        plan = json.loads(out.read_text())[0]
        assert plan["hardware"] == "v100x2-qwen3b-fp16" and plan["updates_per_s"] > 0
