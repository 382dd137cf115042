"""ChunkedSampler hands the model its KV cache under the keyword the installed transformers
expects: `cache` from 5.24 on, `past_key_values` before (deprecated in 5.24, gone in 5.40);
and records the same whether it sees a batch's finish at once or, as on a GPU, late."""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace

import pytest
import torch

from rlcore.clock.work import Decode
from rlcore.config import RunConfig
from rlcore.policy.decoders import HFDecoder, cache_keyword
from rlcore.policy.generation import generate
from rlcore.policy.sampler import FINISH_LAG, ChunkedSampler, Draws, FinishWatch
from tests.test_backend import PROMPTS, policy_for


def cached(s: ChunkedSampler) -> int:
    """Positions the sampler's KV cache holds."""
    d = s.decoder
    return d.cache.get_seq_length() if isinstance(d, HFDecoder) else d.filled


class OldForward(torch.nn.Module):
    def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
        return input_ids


class NewForward(torch.nn.Module):
    def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs):
        return input_ids


@pytest.mark.parametrize(("model", "keyword"), [(OldForward(), "past_key_values"),
                                                (NewForward(), "cache")])
def test_cache_keyword_follows_the_forward_signature(model: torch.nn.Module, keyword: str):
    assert cache_keyword(model) == keyword


@pytest.mark.parametrize("decode", ["hf", "static"])
@pytest.mark.parametrize("swap", ["keep_cache", "reprefill"])
def test_chunked_sampling_raises_no_deprecation_warning(cfg: RunConfig, swap: str, decode: str):
    """Prefill, chunks, a weight swap (`keep_cache` or `reprefill`), more chunks: with every
    FutureWarning and DeprecationWarning an error, and the cache filled as it goes (a keyword
    the model does not know would be swallowed by its **kwargs and leave the cache empty)."""
    policy = policy_for(dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, decode=decode)))
    policy.stop_ids = set()  # no row stops early: every row runs every step
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    width = max(len(p) for p in ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        s = policy.sampler(ids, max_new_tokens=6, temperature=1.0,
                           draws=Draws(0, [(i, 0) for i in range(len(ids))]), version=0)
        assert cached(s) == width
        s.step(2)
        assert cached(s) == width + 2
        getattr(s, swap)(version=1)
        while not s.done:
            s.step(2)
        greedy = policy.greedy(ids, 3)
    assert cached(s) == width + 5  # the last token is sampled, not fed back
    assert [len(g.response_ids) for g in s.gens] == [6] * len(ids)
    # keep_cache: the third token still comes from logits of the old weights
    expected = [0, 0, 0, 1, 1, 1] if swap == "keep_cache" else [0, 0, 1, 1, 1, 1]
    assert [g.versions for g in s.gens] == [expected] * len(ids)
    assert [len(r) for r in greedy] == [3] * len(ids)


class Recorder:
    """A clock that keeps what is charged to it, in order; `decode_path` names what its
    profile prices (None: no profile, as the wall clock)."""

    def __init__(self, decode_path: str | None = None) -> None:
        self.work: list[object] = []
        self.profile = None if decode_path is None else SimpleNamespace(
            decode_path=decode_path, prices_captured_steps=decode_path == "graph")

    def charge(self, work: object) -> None:
        self.work.append(work)

    def compute(self, work: object, fn):
        self.work.append(work)
        return fn()


def test_finish_watch_reads_each_flag_lag_steps_late():
    watch = FinishWatch(lag=2, device=torch.device("cpu"))
    seen = []
    for flag in [False, False, True, False, False]:
        watch.push(torch.tensor(flag))
        seen.append(watch.seen())
    assert seen == [False, False, False, False, True]  # the third flag, two pushes on
    at_once = FinishWatch(lag=0, device=torch.device("cpu"))
    at_once.push(torch.tensor(True))
    assert at_once.seen()


def sampled_with_lag(cfg: RunConfig, monkeypatch: pytest.MonkeyPatch, decode: str, lag: int,
                     chunk: int) -> tuple[list[tuple], list[object], int, int]:
    """The prompts sampled with the finish read `lag` steps late: the responses, the work
    charged, the sampler's steps and its decoder's context."""
    monkeypatch.setitem(FINISH_LAG, "cpu", lag)
    policy = policy_for(dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, decode=decode)))
    ids = [policy.encode_prompt(p) for p in PROMPTS]
    clock = Recorder()
    s = ChunkedSampler(policy, ids, max_new_tokens=24, temperature=1.0,
                       draws=Draws(3, [(i, 0) for i in range(len(ids))]), clock=clock)
    generate(s, chunk, "resubmit")
    rows = [(g.response_ids, g.logprobs, g.versions, g.finished) for g in s.gens]
    return rows, clock.work, s.steps, s.decoder.context


@pytest.mark.parametrize("decode", ["hf", "static"])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_a_late_finish_records_and_charges_the_same(cfg: RunConfig,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    decode: str, chunk: int):
    """What a GPU does (the finish read two or five steps late), run on CPU: the steps past
    the finish are run and then dropped, so the responses, the work charged to the clock and
    the step count are those of reading it at once."""
    rows, work, steps, context = sampled_with_lag(cfg, monkeypatch, decode, 0, chunk)
    assert all(f for *_, f in rows) and steps < 24  # the rows stop (the warm-started
    # model answers in a few tokens): there is a finish to see
    for lag in (2, 5):
        late = sampled_with_lag(cfg, monkeypatch, decode, lag, chunk)
        assert late[:3] == (rows, work, steps)
        if chunk > 1:  # the decoder ran past the finish
            assert late[3] > context


def test_a_profile_that_prices_captured_steps_is_charged_their_buckets(cfg: RunConfig):
    """A virtual run of a GPU whose captured step its profile prices: each step is charged
    the bucket it would compute there, whatever this machine's decoder computes."""
    policy = policy_for(cfg)
    policy.stop_ids = set()  # every step decodes: 3 forwards after the first token
    ids = [policy.encode_prompt(p) for p in PROMPTS[:3]]  # 3 rows: a bucket of 4
    width = max(len(i) for i in ids)
    charged = {}
    for path in (None, "graph"):
        clock = Recorder(path)
        s = ChunkedSampler(policy, ids, max_new_tokens=4, temperature=1.0,
                           draws=Draws(3, [(i, 0) for i in range(3)]), clock=clock)
        s.step(4)
        (decode,) = [w for w in clock.work if isinstance(w, Decode)]
        charged[path] = (decode.steps, decode.rows, decode.row_context)
    # the batch's own: 3 rows over width + 1, + 2, + 3 columns
    assert charged[None] == (4, 9, 3 * (3 * width + 6))
    # the bucket's: 4 rows over a span of 128, three times
    assert charged["graph"] == (4, 12, 3 * 4 * 128)
