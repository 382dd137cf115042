"""The rollout's policy without a model: `LengthPolicy` stands in for `HFPolicy` in the live
rollout loop (`rlcore/runners/asynchronous/rollout.py`), and its `LengthSampler` has
`ChunkedSampler`'s chunks, steps, prices and token versions, with each row's response length
drawn (`lengths.py`) instead of sampled. The generation loop
(`rlcore/policy/generation.py`) runs it as it runs the live one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlcore.clock.work import Adapters, Decode, Prefill, Work
from rlcore.plan.lengths import Lengths
from rlcore.policy.graphs import captured_work
from rlcore.policy.sampler import Draws, Generation
from rlcore.tasks.suites import Task


class LengthSampler:
    """`ChunkedSampler` without a model: the same chunks, steps and prices, with each row's
    (length, finished) drawn instead of sampled. Its responses are that many zeros."""

    def __init__(self, charge: Callable[[Work], None], prompt_ids: Sequence[Sequence[int]],
                 draws: Sequence[tuple[int, bool]], max_new_tokens: int, version: int = 0,
                 adapter_elements: int = 0, captured: bool = False):
        self.charge, self.max_new_tokens = charge, max_new_tokens
        self.captured = captured  # a step is charged its bucket, as ChunkedSampler's under a
        # profile that prices captured steps
        self.adapter_elements = adapter_elements  # as the policy's: 0 without train.lora
        self.prompt_ids = prompt_ids
        self.rows = len(prompt_ids)
        self.width = max(len(p) for p in prompt_ids)  # left-padded to the longest prompt
        self.draws = draws
        # the step at which a row stops appending: its stop token, or the cap
        self.ends = [n if fin else max_new_tokens for n, fin in draws]
        self.steps = 0
        self.chunks = 0
        self.version = self.logits_version = version  # as ChunkedSampler's
        self.step_versions: list[int] = []  # the version of each step's tokens
        self._gens: tuple[int, list[Generation]] | None = None
        charge(Prefill(calls=1, tokens=self.rows * self.width))

    def finished(self, row: int) -> bool:
        """The row has sampled its stop token."""
        return self.draws[row][1] and self.ends[row] <= self.steps

    def length(self, row: int) -> int:
        return min(self.ends[row], self.steps)

    @property
    def done(self) -> bool:
        return self.steps >= self.max_new_tokens or all(
            self.finished(i) for i in range(self.rows))

    @property
    def gens(self) -> list[Generation]:
        """The rows as generations (built once per step count: the loop reads them a row at
        a time)."""
        if self._gens is None or self._gens[0] != self.steps:
            self._gens = (self.steps, [
                Generation(list(ids), [0] * n, [0.0] * n, self.step_versions[:n],
                           self.finished(i))
                for i, ids in enumerate(self.prompt_ids) for n in (self.length(i),)])
        return self._gens[1]

    def step(self, n_tokens: int) -> int:
        """Up to n_tokens more steps; returns the tokens sampled (rows still running)."""
        sampled = steps = forwards = rows = row_context = 0
        if self.done:
            return 0
        self.chunks += 1
        for _ in range(n_tokens):
            if self.done:
                break
            sampled += sum(1 for e in self.ends if e > self.steps)
            self.step_versions.append(self.logits_version)
            self.steps += 1
            steps += 1
            if self.done:
                break  # as the live sampler: no forward pass after the last token
            self.logits_version = self.version
            forwards += 1
            if self.captured:
                r, span = captured_work(self.rows, self.width + self.max_new_tokens)
                rows, row_context = rows + r, row_context + r * span
            else:
                rows += self.rows
                row_context += self.rows * (self.width + self.steps)
        self.charge(Decode(steps=steps, rows=rows, row_context=row_context))
        if self.adapter_elements:
            self.charge(Adapters(steps=forwards, rows=rows, params=self.adapter_elements))
        return sampled

    def reprefill(self, version: int) -> None:
        self.version = self.logits_version = version
        self.charge(Prefill(calls=1, tokens=self.rows * (self.width + self.steps)))

    def keep_cache(self, version: int) -> None:
        """Nothing to price: the new weights decode on the cache as it is."""
        self.version = version


class LengthPolicy:
    """The rollout's policy (`rollout.py::RolloutPolicy`) without a model: prompts as long as
    the config's tokenizer makes them, responses as long as `lengths` draws for the attempt's
    seed, slot, attempt and task, every step priced through `charge`.

    A prompt's stand-in token ids are its task's index, repeated: the sampler reads the task
    whose lengths it draws from them.
    """

    device = torch.device("cpu")

    def __init__(self, charge: Callable[[Work], None], tasks: Sequence[Task],
                 prompt_tokens: dict[str, int], lengths: Lengths, adapter_elements: int,
                 captured: bool = False):
        """`adapter_elements`: the config's model's LoRA adapters, in elements (0: no LoRA);
        `captured`: the profile prices captured decode steps (`decode_path: graph`)."""
        self.charge, self.prompt_tokens, self.lengths = charge, prompt_tokens, lengths
        self.adapter_elements, self.captured = adapter_elements, captured
        self.index = {t.prompt: i for i, t in enumerate(tasks)}
        self.task_ids = [t.task_id for t in tasks]

    def encode_prompt(self, prompt: str, system: str | None = None) -> list[int]:
        return [self.index[prompt]] * self.prompt_tokens[prompt]

    def decode_response(self, response_ids: Sequence[int]) -> str:
        return ""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def state_loaded(self) -> None:
        """No weights to bring up to date."""

    def sampler(self, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int,
                temperature: float, draws: Draws | None, version: int = 0) -> LengthSampler:
        if draws is None:
            raise ValueError("a plan draws its lengths from the rows' (slot, attempt) keys")
        lengths = [self.lengths.draw(draws.seed, slot, attempt, self.task_ids[ids[0]])
                   for ids, (slot, attempt) in zip(prompt_ids, draws.keys, strict=True)]
        return LengthSampler(self.charge, prompt_ids, lengths, max_new_tokens, version,
                             self.adapter_elements, self.captured)
