"""`HFPolicy`: a trainable Hugging Face causal LM as the policy (paper §4.6).

Everything is loaded with `from_pretrained` from a local directory, whether it holds the
embedded tiny model or a downloaded Qwen2.5-0.5B-Instruct. Sampling runs in chunks of
`chunk_tokens` with a KV cache (`ChunkedSampler`) so that a rollout worker can look at the
policy clock between chunks; it records the log-probability of every sampled token under the
sampling distribution (logits / temperature), which `recompute_logprobs` reproduces exactly.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from rlcore.algo.batching import (
    minibatch_parts,
    shard_groups,
    slowest_rank_tokens,
    token_share,
)
from rlcore.algo.objectives import Correction, Inputs, Knobs, LossStats
from rlcore.algo.registry import objective
from rlcore.clock import WALL, Clock
from rlcore.clock.work import AllReduce, Prefill, Update
from rlcore.config import ConfigError, ModelConfig, TrainConfig
from rlcore.policy.data_parallel import RankGroup
from rlcore.policy.decoders import Decoders, resolve_decode
from rlcore.policy.device import bind, resolve_device
from rlcore.policy.digest import state_digest
from rlcore.policy.graphs import prepared_spans
from rlcore.policy.loading import LOAD_DTYPE, encode_prompt, load_model, load_tokenizer
from rlcore.policy.lora import (
    BaseId,
    adapter_elements,
    adapter_params,
    dropout_draws,
    peft_base_state,
    read_adapter,
    rollout_wrap,
    save_adapter,
    targets,
    wrap,
)
from rlcore.policy.model_dir import check_model_dir
from rlcore.policy.optim_steps import (
    SKIPPED_STEPS,
    check_skip_streak,
    optimizer_step,
    step_means,
)
from rlcore.policy.sampler import ChunkedSampler, Draws, Generation
from rlcore.policy.sampling_weights import SamplingCopy, hold, sampling_dtype
from rlcore.policy.train_batch import TrainBatch, pad_right, padded_tokens

# Loading bars from transformers would interleave with the runners' progress lines.
hf_logging.disable_progress_bar()


# Prompts whose token ids a policy remembers (a training split's worth; then it stops).
ENCODED_PROMPTS = 1 << 16

def fp16_autocast() -> contextlib.AbstractContextManager[Any]:
    """Autocast to fp16 on CUDA: the computation of an fp16 policy on a GPU."""
    return torch.autocast("cuda", dtype=torch.float16)


class HFPolicy:
    """A causal LM with its tokenizer, optimizer and sampling/recompute/update paths.

    Sampling and updates are reported to `clock` (`rlcore/clock/`) as they end, and the
    update's time stats are read from it.
    """

    def __init__(self, model_cfg: ModelConfig, train_cfg: TrainConfig, role: str = "rollout",
                 device: torch.device | None = None, clock: Clock = WALL):
        path = check_model_dir(model_cfg.path)
        self.clock = clock
        self.device = device or resolve_device(
            model_cfg.trainer_device if role == "trainer" else model_cfg.rollout_device, role
        )
        # A role builds its policy in the thread that computes with it: that thread's calls
        # that name no device (a library's) then act on this one
        bind(self.device)
        self.train_cfg = train_cfg
        self.objective = objective(train_cfg.objective)
        self.loss = self.objective.loss_fn()
        self.use_fp16 = model_cfg.dtype == "fp16" and self.device.type == "cuda"
        self.tokenizer = load_tokenizer(path)
        try:
            self.model = load_model(path, model_cfg.attn_implementation).to(self.device)
        except (OSError, ValueError) as e:
            raise ConfigError(f"could not load the model in '{path}': {e}") from e
        self._base: BaseId | None = None  # train.lora's base, taken at its first need
        # what sampling runs: the plain model, whose targets a LoRA trainer's PEFT wrapper
        # (`self.model` then) turns into LoRA layers in place
        self.plain = self.model
        self.model.train(False)  # no dropout: sampling and recompute must agree
        self.model_cfg = model_cfg
        self.sampling_dtype = sampling_dtype(model_cfg, self.device)
        # A rollout never trains: its own weights take the sampling dtype. A trainer that
        # samples (sync) gets a copy at its first sample where that dtype is not its own.
        self.sampling_copy: SamplingCopy | None = None
        # train.lora: the adapted layers and the live adapters (what trains, what is handed
        # over, and what every forward applies unmerged over the frozen base)
        self.lora = train_cfg.lora
        self.targets = targets(self.model, self.lora) if self.lora is not None else []
        # what a decode step's adapter products multiply per row (0: no adapters)
        self.adapter_elements = (adapter_elements(self.targets, self.lora.rank)
                                 if self.lora is not None else 0)
        self.adapter: dict[str, torch.Tensor] | None = None
        if role == "rollout":
            if self.lora is not None:
                self.adapter = rollout_wrap(self.model, self.lora, self.targets,
                                            self.sampling_dtype)
            else:
                hold(self.model, self.sampling_dtype)
        resolve_decode(model_cfg.decode, self.model)  # a bad model.decode fails here, not later
        self._decoders: Decoders | None = None
        self.chat = model_cfg.prompt_format == "chat"
        self._encoded: dict[tuple[str | None, str], list[int]] = {}
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id
        gen_eos = self.model.generation_config.eos_token_id
        gen_eos = gen_eos if isinstance(gen_eos, list) else [gen_eos]
        self.stop_ids = {i for i in [self.tokenizer.eos_token_id, *gen_eos] if i is not None}
        if self.lora is not None and role != "rollout":  # the base freezes; adapters train
            self.model = wrap(self.model, self.lora, self.targets)
            self.adapter = adapter_params(self.model)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.trainable_bytes = sum(p.numel() * p.element_size() for p in self.trainable)
        # a LoRA rollout has nothing to train
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=train_cfg.lr, betas=(train_cfg.betas[0], train_cfg.betas[1]),
            eps=train_cfg.adam_eps, weight_decay=train_cfg.weight_decay,
        ) if self.trainable else None
        self.scaler = torch.amp.GradScaler("cuda") if self.use_fp16 else None
        self.skipped_in_a_row = 0  # optimizer steps the scaler skipped since one applied
        # a data-parallel trainer's ranks (rlcore.policy.data_parallel): None, one trains all
        self.ranks: RankGroup | None = None
        # on the virtual clock, the ranks this one process trains for: it computes their
        # update whole (theirs up to the order of sums) and is charged their time, the
        # slowest rank's share and the gradient sum
        self.priced_ranks = 1

    # --- text ---------------------------------------------------------------------------
    def encode_prompt(self, prompt: str, system: str | None = None) -> list[int]:
        """Token ids of a prompt (chat-templated for `prompt_format: chat`, after the task's
        system message if any), remembered: a prompt is encoded once per group member and per
        resubmission otherwise."""
        key = (system, prompt)
        ids = self._encoded.get(key)
        if ids is None:
            ids = encode_prompt(self.tokenizer, prompt, chat=self.chat, system=system)
            if len(self._encoded) < ENCODED_PROMPTS:
                self._encoded[key] = ids
        return list(ids)

    def decode_response(self, response_ids: Sequence[int]) -> str:
        """Response text without its stop token; other special tokens stay visible."""
        ids = list(response_ids)
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return fp16_autocast() if self.use_fp16 else contextlib.nullcontext()

    # --- sampling -----------------------------------------------------------------------
    @property
    def decoders(self) -> Decoders:
        """The decoders over the weights sampling reads (`model.rollout_weights`)."""
        if self._decoders is None:
            model = self.plain
            if next(model.parameters()).dtype != self.sampling_dtype:
                self.sampling_copy = SamplingCopy(model, self.sampling_dtype)
                model = self.sampling_copy.model
            # a plain function, not the bound self.autocast: the policy would be in a cycle
            # that only the cyclic collector frees, its GPU memory with it
            autocast = fp16_autocast if self.use_fp16 else contextlib.nullcontext
            self._decoders = Decoders(model, self.model_cfg.decode, autocast)
        return self._decoders

    @decoders.setter
    def decoders(self, value: Decoders) -> None:
        self._decoders = value

    def prepare_decoding(self, rows: Iterable[int], prompts: Iterable[tuple[str, str | None]],
                         max_new_tokens: int) -> None:
        """Before the run: capture the `graph` steps of batches of each of `rows` rows from
        these (prompt, system) pairs (other decoders keep nothing: no prompt is encoded)."""
        if self.decoders.graphs is None:
            return
        widths = [len(self.encode_prompt(p, system)) for p, system in prompts]
        self.decoders.prepare(rows, prepared_spans(widths, max_new_tokens))

    def sampler(self, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int,
                temperature: float, draws: Draws | None, version: int = 0
                ) -> ChunkedSampler:
        return ChunkedSampler(self, prompt_ids, max_new_tokens=max_new_tokens,
                              temperature=temperature, draws=draws, version=version,
                              clock=self.clock)

    def generate(self, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int,
                 temperature: float, chunk_tokens: int, draws: Draws, version: int = 0
                 ) -> list[Generation]:
        """Sample one response per prompt, chunk by chunk, without interruption."""
        s = self.sampler(prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                         draws=draws, version=version)
        while not s.done:
            s.step(chunk_tokens)
        return s.gens

    def greedy(self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy responses (argmax), for evaluation."""
        s = self.sampler(prompt_ids, max_new_tokens=max_new_tokens, temperature=1.0,
                         draws=None)
        while not s.done:
            s.step(max_new_tokens)
        return [g.response_ids for g in s.gens]

    # --- training -----------------------------------------------------------------------
    def _response_logprobs(self, prompt_ids: Sequence[Sequence[int]],
                           response_ids: Sequence[Sequence[int]], temperature: float
                           ) -> torch.Tensor:
        """Log-probs of each response token, [B, R] left-aligned (padding positions are 0)."""
        seqs = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [self.pad_id] * (width - len(s)) for s in seqs],
                           device=self.device)  # [B, T], right padded
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs],
                            device=self.device)
        with self.autocast():
            # no KV cache: nothing decodes after this forward
            logits = self.model(input_ids=ids, attention_mask=mask,
                                use_cache=False).logits.float()  # [B, T, V]
        r_max = max(len(r) for r in response_ids)
        # Token j of response i sits at column len(p_i) + j and is predicted from the column before.
        start = torch.tensor([len(p) - 1 for p in prompt_ids], device=self.device)
        cols = (start[:, None] + torch.arange(r_max, device=self.device)).clamp(max=width - 2)
        pred = logits.gather(1, cols[:, :, None].expand(-1, -1, logits.shape[-1]))  # [B, R, V]
        logp = torch.log_softmax(pred / temperature, dim=-1)
        targets = pad_right(response_ids, self.pad_id, torch.long, self.device)  # [B, R]
        tok_logp = logp.gather(-1, targets[:, :, None]).squeeze(-1)  # [B, R]
        rmask = pad_right([[1.0] * len(r) for r in response_ids], 0.0, torch.float32, self.device)
        return tok_logp * rmask

    def recompute_logprobs(self, prompt_ids: Sequence[Sequence[int]],
                           response_ids: Sequence[Sequence[int]], temperature: float
                           ) -> list[list[float]]:
        """Per-token log-probs of given responses under the current weights (no grad)."""
        with torch.no_grad():
            lp = self._response_logprobs(prompt_ids, response_ids, temperature)
        return [lp[i, : len(r)].tolist() for i, r in enumerate(response_ids)]

    def _objective_loss(self, x: Inputs) -> tuple[torch.Tensor, LossStats]:
        """train.objective on one minibatch; its knobs read here so losses need no config."""
        cfg = self.train_cfg
        corr = Correction(cfg.clip_eps_high, cfg.dual_clip, cfg.behav_weight_cap,
                          cfg.behav_weight_mode)
        return self.loss(x, Knobs(cfg.clip_eps, cfg.kl_coef, corr))

    def update(self, batch: TrainBatch, *, temperature: float, current_version: int
               ) -> dict[str, float]:
        """One policy update (train.minibatches optimizer steps); returns mean stats, step
        counts and times, from which `commit_verdict` says whether it commits. With ranks,
        this rank's share of it."""
        cfg, clock = self.train_cfg, self.clock
        t0 = clock.now()
        n = len(batch)
        parts = minibatch_parts(n, cfg.minibatches)
        shares = None if self.ranks is None else [self._share(batch, idx) for idx in parts]
        mine = parts if shares is None else [idx for idx, _ in shares]
        prox_all: list[list[float]] | None = None
        if self.objective.needs_prox:
            # AReaL eq. 3: the proximal policy is the one before this update's first step;
            # a rank recomputes its own samples'
            rows = sorted(i for idx in mine for i in idx)
            part = batch.select(rows)
            recomputed = clock.compute(
                Prefill(calls=1, tokens=padded_tokens(part)),
                lambda: self.recompute_logprobs(part.prompt_ids, part.response_ids,
                                                temperature))
            prox_all = [[] for _ in range(n)]
            for i, lp in zip(rows, recomputed, strict=True):
                prox_all[i] = lp
        t_prox = clock.now() - t0
        if self.priced_ranks > 1:
            tokens = slowest_rank_tokens(
                [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids,
                                                 strict=True)],
                cfg.minibatches, self.priced_ranks, batch.groups(),
                [len(r) for r in batch.response_ids])
        else:
            tokens = sum(padded_tokens(batch.select(idx)) for idx in mine)
        lora = self.lora is not None
        totals = clock.compute(Update(tokens=tokens, frozen_base=lora), lambda: self._steps(
            batch, mine, prox_all, temperature=temperature, current_version=current_version,
            weights=None if shares is None else [w for _, w in shares]))
        if self.priced_ranks > 1:
            clock.charge(AllReduce(calls=len(parts), nbytes=self.trainable_bytes,
                                   ranks=self.priced_ranks))
        totals["time/prox_recompute_s"] = t_prox
        totals["time/update_s"] = clock.now() - t0
        return totals

    def _share(self, batch: TrainBatch, part: list[int]) -> tuple[list[int], float]:
        """This rank's samples of a part of the batch, and its share of the part's tokens."""
        assert self.ranks is not None
        every = batch.groups()
        groups = [every[i] for i in part]
        tokens = [len(batch.response_ids[i]) for i in part]
        shard = shard_groups(groups, tokens, self.ranks.world)[self.ranks.rank]
        return [part[j] for j in shard], token_share(shard, tokens)

    def _steps(self, batch: TrainBatch, parts: list[list[int]],
               prox_all: list[list[float]] | None, *, temperature: float,
               current_version: int, weights: list[float] | None = None) -> dict[str, float]:
        """An update's optimizer steps, one per part of the batch; returns the means of their
        stats over the steps applied (over every step when none was) and the step counts.
        With ranks, `parts` are this rank's shares and `weights` their shares of the tokens:
        each loss is weighted by its share and the gradients summed over the ranks."""
        cfg = self.train_cfg
        self.model.train(False)
        done: list[tuple[dict[str, float], bool]] = []  # each step's stats, and if it applied
        if self.optimizer is None:
            raise RuntimeError("a LoRA rollout's policy has nothing to train")
        drop = self.lora is not None and self.lora.dropout > 0
        for m, idx in enumerate(parts):
            mb = batch.select(idx)
            # train.lora.dropout: masks keyed by the update and step, so a replay draws them
            with (dropout_draws(self.model, current_version * len(parts) + m) if drop
                  else contextlib.nullcontext()):
                logp = self._response_logprobs(mb.prompt_ids, mb.response_ids, temperature)
            dev, f32 = self.device, torch.float32
            mask = pad_right([[1.0] * len(r) for r in mb.response_ids], 0.0, f32, dev)
            behav = pad_right(mb.behav_logprobs, 0.0, f32, dev)
            adv = torch.tensor(mb.advantages, dtype=f32, device=dev)[:, None].expand_as(mask)
            versions = pad_right(mb.versions, current_version, f32, dev)
            prox = pad_right([prox_all[i] for i in idx], 0.0, f32, dev) if prox_all else None
            loss, stats = self._objective_loss(
                Inputs(logp, behav, prox, adv, mask, (current_version - versions) * mask))
            if weights is not None:
                loss = loss * weights[m]
            self.optimizer.zero_grad(set_to_none=True)
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            loss = self.sum_gradients(loss)  # before unscaling: every rank sees the same sums
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            clip = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable, clip))
            applied = optimizer_step(self.optimizer, self.scaler)
            self.skipped_in_a_row = 0 if applied else self.skipped_in_a_row + 1
            done.append(({**stats.as_dict(), "loss": loss.item(), "grad_norm": grad_norm},
                         applied))
        totals = step_means(done)
        if totals[SKIPPED_STEPS] < len(done):
            self.state_loaded()  # sync samples next, from the sampling copy if it has one
        else:
            check_skip_streak(self.skipped_in_a_row, self.scaler)
        return totals

    def sum_gradients(self, loss: torch.Tensor) -> torch.Tensor:
        """Sum the trainable tensors' gradients over the ranks (nothing without ranks), and
        the weighted losses with them: the whole batch's loss."""
        if self.ranks is None:
            return loss
        total = loss.detach().reshape(1).clone()
        self.ranks.sum_([*(p.grad for p in self.trainable if p.grad is not None), total])
        return total[0]

    # --- state --------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The live trainable state by name (what weight slots carry): every weight, or under
        train.lora the adapters; writing into them changes the policy once `state_loaded`."""
        if self.adapter is not None:
            return self.adapter
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def state_loaded(self) -> None:
        """After the trainable state changed: bring the sampling weights up to it."""
        if self.sampling_copy is not None:
            self.sampling_copy.refresh()

    def state_digest(self) -> str:
        """`state_digest` of this policy's trainable tensors."""
        return state_digest(self.export_state())

    def base_id(self) -> BaseId:
        """The base the adapters sit on (train.lora), as loaded whatever dtype this role
        holds it in; taken once, at its first need (a save or an adapter's load)."""
        if self._base is None:
            path = self.model_cfg.path
            held = peft_base_state(self.model)
            # a rollout that holds its base in fp16 hashes a fresh load instead (on CPU)
            as_loaded = all(t.dtype == LOAD_DTYPE for t in held.values())
            self._base = BaseId.of(self.model if as_loaded else load_model(path), path)
        return self._base

    def base_digest(self) -> str:
        """`state_digest` of the base the adapters sit on, as loaded (train.lora), or of
        every weight as held."""
        if self.lora is not None:
            return self.base_id().digest
        return state_digest(dict(self.model.named_parameters()))

    def export_state(self) -> dict[str, torch.Tensor]:
        """A CPU copy of every trainable tensor, by name."""
        return {n: t.detach().to("cpu", copy=True) for n, t in self.state_tensors().items()}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy trainable tensors into the policy in place (names must match export_state)."""
        live = self.state_tensors()
        with torch.no_grad():
            for name, tensor in state.items():
                live[name].copy_(tensor)
        self.state_loaded()

    def load_adapter(self, path: str | Path) -> None:
        """Load a saved adapter (`save` under train.lora), refusing one whose base is not
        this model's."""
        adapter, saved = read_adapter(Path(path))
        base = self.base_id()
        differs = base.differs(saved)
        if differs is not None:
            raise ConfigError(
                f"the adapter in '{path}' was trained on a base model with digest "
                f"{saved.get('base_digest')}, but model.path '{self.model_cfg.path}' holds one "
                f"with digest {base.digest}: {differs}")
        self.load_state(adapter)

    def save(self, out_dir: str | Path) -> None:
        """save_pretrained of model and tokenizer, loadable by from_pretrained; under
        train.lora the adapters alone, as PEFT saves them, with their base's digest."""
        if self.lora is not None:
            save_adapter(Path(out_dir), self.state_tensors(), self.lora, self.targets,
                         self.model_cfg.path, self.base_id())
        else:
            self.model.save_pretrained(str(out_dir))
        self.tokenizer.save_pretrained(str(out_dir))
