"""CUDA's rules for rlcore's GPU paths, checked on CPU against a fake `torch.cuda`
(`tests/fake_cuda.py`): every call names the role's device, whatever device is current in
the calling thread; captures run one at a time and never beside a wait; the transports wait
on streams, never on a device; pinned slots are registered once and unregistered."""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlcore.measure.timings import STEPS, sampling_grid
from rlcore.policy import device as device_mod
from rlcore.policy.decode_step import Weights
from rlcore.policy.decoders import StaticDecoder, cache_keyword
from rlcore.policy.graphs import (
    Bucket,
    GraphDecoder,
    GraphPool,
    prepared_spans,
    rows_bucket,
    span_bucket,
)
from rlcore.policy.sampler import FinishWatch
from rlcore.runners.asynchronous import weight_slots as ws
from rlcore.runners.asynchronous.vehicles import Threads
from tests.fake_cuda import FakeCuda
from tests.test_decoders import batch, qwen2

CUDA1 = torch.device("cuda", 1)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return FakeCuda().install(monkeypatch)


class TestEveryCallNamesTheRolesDevice:
    """A policy on cuda:1 in a thread whose current device is cuda:0 (the paper's sync runs
    and every replay) captures, replays, records and waits on cuda:1 only."""

    def bucket_on_cuda1(self) -> Bucket:
        model = qwen2(4, 2)
        b = Bucket(Weights.of(model), 2, 128, torch.device("cpu"), torch.float32)
        b.device = CUDA1  # the buffers stay on the CPU; every CUDA call must name cuda:1
        return b

    def test_a_bucket_captures_and_replays_on_its_own_device(self, cuda: FakeCuda):
        b = self.bucket_on_cuda1()
        assert cuda.current() == 0
        b.capture(contextlib.nullcontext, pool=("pool", 0))
        b.run(contextlib.nullcontext)
        assert cuda.devices() == {1}
        assert [c.what for c in cuda.calls].count("capture") == 1
        assert cuda.devices("replay") == {1} and cuda.current() == 0  # left as it was

    def test_the_finish_flag_is_recorded_on_the_flags_device(self, cuda: FakeCuda,
                                                             monkeypatch: pytest.MonkeyPatch):
        empty = torch.empty

        def unpinned(*args: object, pin_memory: bool = False, **kw: object) -> torch.Tensor:
            return empty(*args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(torch, "empty", unpinned)
        watch = FinishWatch(lag=1, device=CUDA1)
        for flag in (False, True, False):
            watch.push(torch.tensor(flag))
        assert watch.seen()  # the True, one push late
        assert cuda.devices("record_event") == {1}
        assert cuda.devices("event_synchronize") == {1}

    def test_waits_name_each_cuda_device_and_never_the_whole_device(self, cuda: FakeCuda):
        device_mod.wait_for([CUDA1, torch.device("cpu"), CUDA1, torch.device("cuda", 0)])
        assert sorted(c.device for c in cuda.calls) == [0, 1]
        assert {c.what for c in cuda.calls} == {"stream_synchronize"}

    def test_a_policy_binds_its_device_in_the_thread_that_builds_it(
            self, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
        from rlcore.config import config_from_dict
        from rlcore.policy import hf_policy
        from tests.conftest import small_config

        bound: list[tuple[str, str]] = []
        monkeypatch.setattr(hf_policy, "bind", lambda d: bound.append(
            (threading.current_thread().name, str(d))))
        cfg = config_from_dict(small_config(tiny_model_dir))
        t = threading.Thread(target=hf_policy.HFPolicy, args=(cfg.model, cfg.train),
                             name="role-thread")
        t.start()
        t.join()
        assert bound == [("role-thread", "cpu")]

    def test_each_role_thread_queues_on_a_stream_of_its_own(self, cuda: FakeCuda):
        """The threaded runner's roles on one GPU: on the shared legacy stream their kernels
        would serialise and each role's waits would wait for the other's work."""
        import queue

        seen: dict[str, object] = {}

        def role(ctx: SimpleNamespace) -> None:
            device = getattr(ctx, "device", None)
            if device is not None and device.type == "cuda":
                seen[ctx.name] = torch.cuda.current_stream(device)

        inbox: queue.Queue[object] = queue.Queue()
        threads = Threads()
        for name, dev in (("rollout0", CUDA1), ("trainer0", CUDA1),
                          ("cpu", torch.device("cpu")), ("service", None)):
            ctx = SimpleNamespace(name=name, cpus=None, inbox=inbox)
            if dev is not None:
                ctx.device = dev
            threads.start(name, role, ctx)  # type: ignore[arg-type]
        for t in threads.handles.values():
            t.join()
        assert inbox.empty(), inbox.get()
        legacy = torch.cuda.current_stream(CUDA1)  # this thread's: never set
        assert len({id(seen["rollout0"]), id(seen["trainer0"]), id(legacy)}) == 3
        assert [c.device for c in cuda.calls if c.what == "set_stream"] == [1, 1]


class TestCapturesAreAloneAndBeforeTheRun:
    def test_prepare_captures_each_rows_bucket_largest_first_into_one_pool(
            self, cuda: FakeCuda):
        model = qwen2(4, 2)
        pool = GraphPool(model, contextlib.nullcontext, cache_keyword(model))
        pool.prepare(range(1, 6), [200])
        assert list(pool.buckets) == [(8, 256), (4, 256), (2, 256), (1, 256)]
        assert [c.what for c in cuda.calls].count("capture") == 4
        # a later, narrower batch takes a prepared bucket: nothing is captured in the run
        ids, mask = batch([3, 5, 4])
        d = GraphDecoder(pool, ids, mask, cache_keyword(model), 16)
        d.refill()
        assert d.bucket is pool.buckets[(4, 256)]
        assert [c.what for c in cuda.calls].count("capture") == 4

    def test_a_batch_of_common_width_decodes_over_its_own_span_not_the_widest(
            self, cuda: FakeCuda):
        # 99 prompts of 20 tokens and one of 980, 16 new tokens: spans of 128 and 1024
        spans = prepared_spans([20] * 99 + [980], 16)
        assert spans == [1024, 128]
        model = qwen2(4, 2)
        pool = GraphPool(model, contextlib.nullcontext, cache_keyword(model))
        pool.prepare(range(1, 5), spans)
        assert list(pool.buckets) == [(4, 1024), (4, 128), (2, 1024), (2, 128), (1, 1024),
                                      (1, 128)]
        ids, mask = batch([20, 18, 20])
        d = GraphDecoder(pool, ids, mask, cache_keyword(model), 16)
        d.refill()
        assert (d.bucket.rows, d.bucket.span) == (4, 128)  # type: ignore[union-attr]
        assert [c.what for c in cuda.calls].count("capture") == 6

    def test_a_captured_step_is_charged_for_its_bucket_rows_and_span(self):
        model = qwen2(4, 2)
        pool = GraphPool(model, contextlib.nullcontext, cache_keyword(model), capture=False)
        ids, mask = batch([3, 5, 4])
        d = GraphDecoder(pool, ids, mask, cache_keyword(model), 16)
        d.refill()
        # 3 rows in a 4-row bucket, 5 + 16 columns in a span of 128: all of it computed
        assert d.work() == (4, 128)
        assert StaticDecoder(model, ids, mask, contextlib.nullcontext, cache_keyword(model),
                             16).work() == (3, 5)

    def test_the_captured_steps_fit_sees_rows_and_spans_it_can_tell_apart(self):
        batches, widths = sampling_grid("graph")
        buckets = [(rows_bucket(b), span_bucket(w + STEPS)) for b in batches for w in widths]
        assert len({span for _, span in buckets}) >= 3
        assert any(rows_bucket(b) != b for b in batches)
        # the charge's row and row x column terms over the grid: independent columns
        design = torch.tensor([[r, r * span] for r, span in buckets], dtype=torch.float64)
        assert int(torch.linalg.matrix_rank(design)) == 2

    def test_two_threads_capturing_at_once_take_turns(self, cuda: FakeCuda):
        cuda.capture_pause_s = 0.05
        models = [qwen2(4, 2, seed=s) for s in (0, 1)]
        pools = [GraphPool(m, contextlib.nullcontext, cache_keyword(m)) for m in models]
        failed: list[BaseException] = []

        def capture(pool: GraphPool) -> None:
            try:
                pool.bucket(2, 64, torch.float32)
            except BaseException as e:
                failed.append(e)

        threads = [threading.Thread(target=capture, args=(p,)) for p in pools]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failed
        (s0, e0, _), (s1, e1, _) = sorted(cuda.captures)
        assert e0 <= s1  # one after the other

    def test_a_transport_wait_never_falls_inside_another_threads_capture(
            self, cuda: FakeCuda):
        cuda.capture_pause_s = 0.2
        model = qwen2(4, 2)
        pool = GraphPool(model, contextlib.nullcontext, cache_keyword(model))
        started = threading.Event()
        waits: list[float] = []

        def waiter() -> None:
            started.wait()
            for _ in range(20):
                device_mod.wait_for([torch.device("cuda", 0)])
                waits.append(time.perf_counter())
                time.sleep(0.01)

        t = threading.Thread(target=waiter)
        t.start()
        started.set()
        pool.bucket(2, 64, torch.float32)
        t.join()
        ((s, e, _),) = cuda.captures
        assert not [w for w in waits if s < w < e]
        assert not [c for c in cuda.calls if c.what.endswith("synchronize") and c.capturing]


class TestNoRowIsEverFullyMasked:
    """Some SDPA kernels give NaN for a row whose every key is masked (pytorch#110213), and a
    masked-out NaN value still poisons a row (pytorch#101967): a bucket's warm-up and capture
    must not leave NaN in the buffers that a later, larger batch's rows attend past."""

    @staticmethod
    def nan_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
        real = torch.nn.functional.scaled_dot_product_attention

        def sdpa(q, k, v, attn_mask=None, **kw):  # type: ignore[no-untyped-def]
            out = real(q, k, v, attn_mask=attn_mask, **kw)
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                out = out.masked_fill(~attn_mask.any(-1, keepdim=True), float("nan"))
            return out

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)

    def test_a_larger_batch_after_a_padded_one_in_a_captured_bucket_stays_finite(
            self, cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch):
        from transformers import Qwen2Config, Qwen2ForCausalLM

        self.nan_sdpa(monkeypatch)
        torch.manual_seed(0)  # three layers: NaN reaches a padding row's written keys
        config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=128, tie_word_embeddings=True,
                             pad_token_id=0)
        config._attn_implementation = "sdpa"
        model = Qwen2ForCausalLM(config).eval()
        kw = cache_keyword(model)
        pool = GraphPool(model, contextlib.nullcontext, kw)
        pool.prepare([3], [16])  # warm-up and capture under the fake
        (bucket,) = pool.buckets.values()
        bucket.graph = None  # the fake records no kernels: the batches run the step eagerly
        for rows, width in ((3, 6), (4, 2)):  # row 3 is padding, then a real row
            ids, _ = batch([width] * rows, seed=rows)
            d = GraphDecoder(pool, ids, torch.ones_like(ids), kw, 8)
            assert torch.isfinite(d.refill()).all()
            with torch.no_grad():
                for step in range(8):
                    d.append(torch.full((rows,), 7 + step))
                    assert torch.isfinite(d.forward()).all(), (rows, step)
        assert len(pool.buckets) == 1


class TestPinnedSlotsHaveALifetime:
    """cudaHostRegister once per process, under a lock; cudaHostUnregister when the slots
    close or are collected; error 712 cleared and reported."""

    class Driver:
        def __init__(self, delay_s: float = 0.0):
            self.pinned: set[int] = set()
            self.calls: list[tuple[str, int]] = []
            self.delay_s = delay_s

        def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802
            time.sleep(self.delay_s)  # the binding releases the GIL for seconds at 0.5B
            self.calls.append(("register", ptr))
            if ptr in self.pinned:
                return ws.HOST_MEMORY_ALREADY_REGISTERED
            self.pinned.add(ptr)
            return 0

        def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802
            self.calls.append(("unregister", ptr))
            self.pinned.discard(ptr)
            return 0

    @pytest.fixture
    def driver(self, monkeypatch: pytest.MonkeyPatch) -> Driver:
        d = self.Driver()
        monkeypatch.setattr(torch.cuda, "cudart", lambda: d)
        self.cleared: list[int] = []
        monkeypatch.setattr(ws, "clear_cuda_error", lambda: self.cleared.append(1) or 712)
        return d

    def slots(self) -> ws.WeightSlots:
        spec = [("a", (64,), torch.float32), ("b", (8,), torch.float16)]
        return ws.WeightSlots(spec, 2, Threads().locked_array(4), shared=False,
                              transport="pinned")

    ON_GPU = [SimpleNamespace(is_cuda=True)]

    def test_three_rounds_of_slots_register_and_unregister_cleanly(self, driver: Driver):
        for close in (True, False, True):  # the second is only collected
            slots = self.slots()
            slots._pin_for(self.ON_GPU)  # type: ignore[arg-type]
            slots._pin_for(self.ON_GPU)  # type: ignore[arg-type]
            assert len(driver.pinned) == 4  # 2 slots x 2 dtypes, once
            if close:
                slots.close()
            del slots
            gc.collect()
            assert not driver.pinned
        assert not self.cleared
        registers = [p for what, p in driver.calls if what == "register"]
        assert len(registers) == 12

    def test_two_threads_first_copies_register_once(self, driver: Driver):
        driver.delay_s = 0.02
        slots = self.slots()
        threads = [threading.Thread(target=slots._pin_for, args=(self.ON_GPU,))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [w for w, _ in driver.calls].count("register") == 4
        slots.close()

    def test_already_registered_memory_is_cleared_and_reported(self, driver: Driver):
        slots = self.slots()
        first = slots._buffers[0][torch.float32]
        driver.pinned.add(first.data_ptr())  # a registration that is not the slots'
        with pytest.warns(RuntimeWarning, match="already page-locked"):
            slots._pin_for(self.ON_GPU)  # type: ignore[arg-type]
        assert self.cleared == [1]
        slots.close()
        assert driver.pinned == {first.data_ptr()}  # not ours to undo

    def test_a_refusal_undoes_the_registrations_and_says_what_to_set(
            self, driver: Driver, monkeypatch: pytest.MonkeyPatch):
        slots = self.slots()
        register = driver.cudaHostRegister
        calls = iter(range(100))
        monkeypatch.setattr(driver, "cudaHostRegister",
                            lambda p, s, f: 2 if next(calls) == 2 else register(p, s, f))
        with pytest.raises(RuntimeError, match="weight_transport: host or device"):
            slots._pin_for(self.ON_GPU)  # type: ignore[arg-type]
        assert not driver.pinned and self.cleared == [1]

    def test_every_loaded_cuda_runtime_is_found_and_cleared(
            self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
        """torch's libcudart, a wheel's bundled libcudart-<hash>.so.N and one whose file was
        replaced since it was loaded: error 712 is cleared in each, others are not opened."""
        plain = "/venv/nvidia/cuda_runtime/lib/libcudart.so.12"
        bundled = "/venv/site-packages/vllm.libs/libcudart-d0da41ae.so.11.0"
        deleted = "/opt/cuda 12/lib64/libcudart.so.12.4.127"
        maps = tmp_path / "maps"
        maps.write_text("\n".join([
            f"7f10-7f20 r--p 00000000 08:01 11 {plain}",
            f"7f20-7f30 r-xp 00001000 08:01 11 {plain}",  # a library maps several ranges
            f"7f30-7f40 r-xp 00000000 08:01 12        {bundled}",
            f"7f40-7f50 r-xp 00000000 08:01 13 {deleted} (deleted)",
            "7f50-7f60 r-xp 00000000 08:01 14 /venv/nvidia/cudnn/lib/libcudnn.so.9",
            "7f60-7f70 r-xp 00000000 08:01 15 /opt/libcudart_tools/libfoo.so",
            "7ffd-7ffe rw-p 00000000 00:00 0                          [stack]",
            "7ffe-7fff rw-p 00000000 00:00 0",
        ]) + "\n")
        cleared: list[str] = []

        class Runtime:
            def __init__(self, path: str):
                self.path = path

            def cudaGetLastError(self) -> int:  # noqa: N802
                cleared.append(self.path)
                return 712 if self.path == bundled else 0

        monkeypatch.setattr(ws, "MAPS", maps, raising=False)
        monkeypatch.setattr(ws.ctypes, "CDLL", Runtime)
        assert ws.clear_cuda_error() == 712
        assert sorted(cleared) == sorted([plain, bundled, deleted])

    def test_a_finalizer_run_inside_a_registration_does_not_deadlock(self, driver: Driver):
        """The collector may run another slots' finalizer (which takes the same class lock)
        in the thread that is registering."""
        other = [torch.zeros(4)]
        register = driver.cudaHostRegister

        def collecting(ptr: int, size: int, flags: int) -> int:
            ws.HostPins._release(other)  # as gc would, mid-registration
            return register(ptr, size, flags)

        driver.cudaHostRegister = collecting  # type: ignore[method-assign]
        slots = self.slots()
        t = threading.Thread(target=slots._pin_for, args=(self.ON_GPU,), daemon=True)
        t.start()
        t.join(timeout=10)
        assert not t.is_alive(), "deadlocked on HostPins._lock"
        assert len(driver.pinned) == 4  # 2 slots x 2 dtypes
        slots.close()
        assert not driver.pinned

    def test_the_pinned_check_skips_slots_shared_memory_cannot_hold(
            self, monkeypatch: pytest.MonkeyPatch):
        """A /dev/shm of 1 MiB cannot hold two 1 MiB slots: the GPU check records a skip
        instead of making them (SIGBUS would end every later check unrecorded)."""
        from rlcore.measure import cuda_checks

        def no_slots(*args, **kwargs):
            raise AssertionError("slots made past /dev/shm's size")

        monkeypatch.setattr(cuda_checks, "shared_memory_free", lambda: 2**20, raising=False)
        monkeypatch.setattr(cuda_checks, "WeightSlots", no_slots)
        found = cuda_checks.pinned_three_times(torch.device("cpu"), mib=1)
        assert "/dev/shm" in found["skipped"]

    def test_a_check_that_skips_is_recorded_as_skipped(
            self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
        import json

        from rlcore.measure import cuda_checks

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        for name in ("captures_at_once", "capture_beside_waits", "other_device"):
            monkeypatch.setattr(cuda_checks, name, lambda dev: {})
        monkeypatch.setattr(cuda_checks, "pinned_three_times", lambda dev: {"skipped": "small"})
        assert cuda_checks.main(["--out", str(tmp_path / "c.json"), "--device", "cuda:0"]) == 0
        checks = json.loads((tmp_path / "c.json").read_text())["checks"]
        assert checks["pinned_three_times"]["status"] == "skipped"
        assert checks["pinned_three_times"]["why"] == "small"
        assert checks["other_device"]["status"] == "ok"


class TestBuffersSentThroughCudaIpcAreReturned:
    """A worker ends through `os._exit`, which runs no deleter: a GPU buffer it received
    from the main process would never be counted as returned, and the main process would
    hold the block until it exits (a bench's repeats and pytest run many runs in one)."""

    @pytest.mark.parametrize("fails", [False, True])
    def test_a_worker_drops_the_slots_it_received_before_it_exits(
            self, monkeypatch: pytest.MonkeyPatch, fails: bool):
        import queue
        import weakref

        from rlcore.runners.asynchronous import vehicles

        monkeypatch.setattr(vehicles, "die_with_parent", lambda *a, **k: None)
        monkeypatch.setattr(vehicles, "_parent_pid", lambda: 1)
        monkeypatch.setattr(vehicles, "pin", lambda cfg: None)
        slots = ws.WeightSlots([("w", (4,), torch.float32)], 2, Threads().locked_array(4),
                               shared=False)
        buffer = weakref.ref(slots._buffers[0][torch.float32])
        inbox: queue.Queue[object] = queue.Queue()
        ctx = SimpleNamespace(name="rollout0", cpus=None, cfg=None, inbox=inbox, slots=slots)

        def role(c: SimpleNamespace) -> None:
            if fails:
                raise RuntimeError("the role failed")

        with pytest.raises(SystemExit) if fails else contextlib.nullcontext():
            vehicles._process_entry(role, ctx)  # type: ignore[arg-type]
        assert buffer() is None
        assert inbox.empty() != fails  # a failure is still reported

    @pytest.mark.parametrize(("processes", "transport", "freed"),
                             [(True, "device", True), (True, "host", False),
                              (False, "device", False)])
    def test_the_main_process_frees_what_it_sent_once_the_workers_ended(
            self, monkeypatch: pytest.MonkeyPatch, processes: bool, transport: str,
            freed: bool):
        from rlcore.runners.asynchronous.runtime import Runtime

        order: list[str] = []
        rt = object.__new__(Runtime)  # its parts only: building one needs a GPU here
        rt.watchdog = None
        rt.rank_dir = None  # no trainer ranks
        rt.v = SimpleNamespace(processes=processes,  # type: ignore[assignment]
                               end_all=lambda ends: order.append("end_all"))
        rt.slots = SimpleNamespace(transport=transport,  # type: ignore[assignment]
                                   close=lambda: order.append("close"),
                                   release_buffers=lambda: order.append("release"))
        monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: order.append("ipc_collect"))
        rt.shutdown()
        assert order == ["end_all", "close", *(["release", "ipc_collect"] if freed else [])]


# CUDA calls that act on whatever device is current, or wait on a whole device
IMPLICIT = re.compile(r"torch\.cuda\.(Stream|current_stream|Event)\(\)|torch\.cuda\.synchronize\("
                      r"|\.record\(\)|torch\.cuda\.graph\([a-z_.]+\)")


def test_rlcore_makes_no_cuda_call_that_names_no_device():
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in sorted((ROOT / "rlcore").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if IMPLICIT.search(line)]
    assert not found, "\n".join(found)


class TestRolesPrepareBeforeTheClockStarts:
    def test_off_graph_nothing_is_prepared_and_no_prompt_encoded(self, tiny_model_dir: Path):
        from rlcore.config import config_from_dict
        from rlcore.policy.hf_policy import HFPolicy
        from tests.conftest import small_config

        cfg = config_from_dict(small_config(tiny_model_dir))
        policy = HFPolicy(cfg.model, cfg.train)

        def prompts():  # type: ignore[no-untyped-def]
            raise AssertionError("encoded")
            yield

        policy.prepare_decoding([4], prompts(), 8)

    @pytest.mark.parametrize("mode", ["sync", "async"])
    def test_each_role_that_samples_prepares_before_the_measured_clock(
            self, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            mode: str):
        from rlcore.config import config_from_dict
        from rlcore.evaluation import evaluate_run
        from rlcore.policy import hf_policy
        from rlcore.policy.hf_policy import HFPolicy
        from rlcore.record.ledger import RunLedger
        from rlcore.runners import run_mode
        from tests.conftest import small_config

        seen: list[tuple[str, object]] = []
        bound: set[tuple[str, str]] = set()
        monkeypatch.setattr(hf_policy, "bind", lambda d: bound.add(
            (threading.current_thread().name, str(d))))
        start = RunLedger.start_clock
        monkeypatch.setattr(HFPolicy, "prepare_decoding", lambda self, rows, prompts, m:
                            seen.append(("prepare", (list(rows), len(list(prompts)), m))))
        monkeypatch.setattr(RunLedger, "start_clock", lambda self: (
            seen.append(("start", None)), start(self))[1])
        cfg = config_from_dict(small_config(tiny_model_dir, mode=mode,
                                            train={"updates": 1, "update_batch_size": 8}))
        run_mode(cfg, tmp_path / mode)
        assert [what for what, _ in seen] == ["prepare", "start"]
        # each thread that computes bound its role's device itself (the final weights are
        # read into a CPU policy by the main thread after the run)
        roles = ({("MainThread", "cpu")} if mode == "sync" else
                 {("rollout0", "cpu"), ("trainer0", "cpu"), ("MainThread", "cpu")})
        assert bound == roles
        rows, n_prompts, max_new = seen[0][1]  # type: ignore[misc]
        assert rows == ([8] if mode == "sync" else list(range(1, 9))) and max_new == 5
        # sync has its training prompts at hand; on CPU a live run hands its rollouts none,
        # since nothing there will capture
        assert (n_prompts == 0) == (mode == "async")
        bound.clear()  # the held-out evaluation builds and runs its policy in this thread
        evaluate_run(tmp_path / mode)
        assert bound == {("MainThread", "cpu")}


@pytest.mark.parametrize(("role", "lora"), [("rollout", False), ("trainer", False),
                                           ("trainer", True)])  # the last samples a copy
def test_a_policy_that_sampled_is_freed_by_its_last_reference(tiny_model_dir: Path,
                                                               role: str, lora: bool):
    """A policy in a reference cycle outlives `del` until the cyclic collector runs, and
    with it its weights, captured graphs and KV buckets on the GPU (`run --eval` loads the
    evaluation policy beside it)."""
    import weakref

    from rlcore.config import config_from_dict
    from rlcore.policy.hf_policy import HFPolicy
    from rlcore.policy.sampler import Draws
    from tests.conftest import small_config

    train = {"lora": {"rank": 4}} if lora else {}
    cfg = config_from_dict(small_config(tiny_model_dir, train=train))
    gc.collect()
    gc.disable()  # only reference counts may free it
    try:
        policy = HFPolicy(cfg.model, cfg.train, role=role)
        policy.generate([policy.encode_prompt("1+2=")], max_new_tokens=4, temperature=1.0,
                        chunk_tokens=4, draws=Draws(0, [(0, 0)]))
        assert policy._decoders is not None
        alive = weakref.ref(policy)
        del policy
        assert alive() is None
    finally:
        gc.enable()
