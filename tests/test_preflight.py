"""A run on hardware that cannot hold it is refused before anything is written: a device
the machine lacks, and AReaL-style weight slots larger than the free shared memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from rlcore.cli import main
from rlcore.config import ConfigError
from rlcore.runners.asynchronous import runtime
from rlcore.runners.asynchronous.weight_slots import check_shared_memory, shared_memory_free
from tests.conftest import small_config

GIB = 2**30


def run_cli(tmp_path: Path, cfg: dict) -> int:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return main(["run", str(config), "--out", str(tmp_path / "out")])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_without_cuda(tiny_model_dir: Path, tmp_path: Path, capsys):
    cfg = small_config(tiny_model_dir, mode="areal")
    cfg["model"]["trainer_device"] = "cuda:1"
    assert run_cli(tmp_path, cfg) == 2
    err = capsys.readouterr().err
    assert "model.trainer_device is 'cuda:1' but CUDA is not available here" in err
    assert "GPU setup" in err
    assert not (tmp_path / "out").exists()


class TestSharedMemory:
    # two slots of 1000 fp32 + 10 fp16 values: 4020 bytes each, 8040 in all
    SPEC = [("w", (10, 100), torch.float32), ("b", (10,), torch.float16)]

    def test_slots_that_fit(self):
        check_shared_memory(self.SPEC, 2, free=8040)
        check_shared_memory(self.SPEC, 2, free=None)  # no /dev/shm to ask: not checked

    def test_slots_that_do_not_fit_name_the_numbers(self):
        spec = [("embed", (GIB // 4,), torch.float32)]  # 1 GiB per slot
        with pytest.raises(ConfigError) as e:
            check_shared_memory(spec, 2, free=64 * 2**20)  # Docker's default 64 MB
        msg = str(e.value)
        assert "2 copies" in msg and "1.00 GiB each, 2.00 GiB in all" in msg
        assert "has 0.06 GiB free" in msg and "--shm-size=3g" in msg
        assert "sync or async" in msg

    def test_one_byte_short(self):
        with pytest.raises(ConfigError):
            check_shared_memory(self.SPEC, 2, free=8039)

    def test_the_free_space_is_read_from_the_file_system(self, tmp_path: Path):
        assert shared_memory_free(str(tmp_path)) > 0
        assert shared_memory_free(str(tmp_path / "absent")) is None


def test_an_areal_run_with_too_little_shared_memory(tiny_model_dir: Path, tmp_path: Path,
                                                    capsys, monkeypatch: pytest.MonkeyPatch):
    """A simulated 1 kB limit: the run stops before its directory or any worker exists."""
    monkeypatch.setattr(runtime, "shared_memory_free", lambda path="": 1024)
    assert run_cli(tmp_path, small_config(tiny_model_dir, mode="areal")) == 2
    err = capsys.readouterr().err
    assert "in shared memory" in err and "has 0.00 GiB free" in err
    assert not (tmp_path / "out").exists()


# --- a GPU the installed torch has no kernels for ---------------------------------------------

# torch 2.11.0+cu130's list: no sm_70, so no V100
CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]


class TestKernelImages:
    @pytest.mark.parametrize(("capability", "arch", "runs"), [
        # a cubin: the same major, a minor at or above its own
        ((7, 0), "sm_70", True), ((7, 0), "sm_75", False), ((7, 0), "sm_60", False),
        ((8, 9), "sm_86", True), ((8, 9), "sm_80", True), ((8, 6), "sm_89", False),
        ((9, 0), "sm_86", False), ((10, 0), "sm_90", False), ((12, 0), "sm_120", True),
        ((10, 3), "sm_100", True), ((10, 0), "sm_103", False),
        # PTX: compiled by the driver for any capability at or above its own
        ((9, 0), "compute_90", True), ((9, 0), "compute_80", True),
        ((7, 0), "compute_75", False), ((12, 1), "compute_120", True),
        # arch-specific code runs on its capability only; family code on its major
        ((9, 0), "sm_90a", True), ((10, 0), "sm_90a", False), ((10, 0), "compute_90a", False),
        ((10, 3), "sm_100f", True), ((10, 3), "sm_100a", False), ((12, 0), "sm_100f", False),
        # not an architecture
        ((9, 0), "", False), ((9, 0), "gfx90a", False),
    ])
    def test_by_hand(self, capability: tuple[int, int], arch: str, runs: bool):
        from rlcore.policy.device import kernel_image_runs

        assert kernel_image_runs(capability, arch) is runs


def fake_gpus(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int],
              arches: list[str], name: str = "Tesla V100-SXM2-32GB", n: int = 2) -> None:
    """torch.cuda as on a machine with `n` GPUs of `capability` and a torch built for
    `arches`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(arches))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


class TestKernelsForTheDevice:
    def test_a_v100_under_a_torch_without_sm70_is_refused_with_the_build_that_has_it(
            self, monkeypatch: pytest.MonkeyPatch):
        from rlcore.policy.device import resolve_device

        fake_gpus(monkeypatch, (7, 0), CU130)
        with pytest.raises(ConfigError) as e:
            resolve_device("cuda:1", "trainer")
        msg = str(e.value)
        assert "model.trainer_device is 'cuda:1'" in msg and "Tesla V100-SXM2-32GB" in msg
        assert "compute capability 7.0 (sm_70)" in msg
        assert ", ".join(CU130) in msg and torch.__version__ in msg
        assert "https://download.pytorch.org/whl/cu126" in msg and "docs/setup.md" in msg
        with pytest.raises(ConfigError, match="model.rollout_device is 'auto'"):
            resolve_device("auto", "rollout")

    def test_a_gpu_the_build_has_code_for_is_taken(self, monkeypatch: pytest.MonkeyPatch):
        from rlcore.policy.device import resolve_device

        fake_gpus(monkeypatch, (9, 0), CU130, name="NVIDIA H200")
        assert resolve_device("auto", "trainer") == torch.device("cuda:1")
        fake_gpus(monkeypatch, (7, 0), ["sm_50", "sm_60", "sm_70", "sm_75"])  # cu126's kind
        assert resolve_device("cuda:0", "rollout") == torch.device("cuda:0")
        fake_gpus(monkeypatch, (12, 1), ["sm_90", "compute_90"])  # PTX the driver compiles
        assert resolve_device("cuda:0", "rollout") == torch.device("cuda:0")

    def test_a_newer_gpu_is_told_to_take_a_newer_cuda_build(
            self, monkeypatch: pytest.MonkeyPatch):
        from rlcore.policy.device import resolve_device

        fake_gpus(monkeypatch, (12, 0), ["sm_80", "sm_86", "sm_90"], name="RTX 5090")
        with pytest.raises(ConfigError, match="sm_120") as e:
            resolve_device("cuda:0", "rollout")
        assert "whl/cuXYZ" in str(e.value) and "cu126" not in str(e.value)

    def test_a_torch_without_cuda_names_no_architectures_to_check(
            self, monkeypatch: pytest.MonkeyPatch):
        from rlcore.policy.device import check_kernels

        fake_gpus(monkeypatch, (7, 0), [])
        check_kernels(torch.device("cuda:0"), "model.rollout_device is 'cuda:0'")
        check_kernels(torch.device("cpu"), "model.rollout_device is 'cpu'")

    @pytest.mark.parametrize("mode", ["sync", "areal"])
    def test_a_run_on_such_a_gpu_writes_nothing(self, tiny_model_dir: Path, tmp_path: Path,
                                                capsys, monkeypatch: pytest.MonkeyPatch,
                                                mode: str):
        fake_gpus(monkeypatch, (7, 0), CU130)
        cfg = small_config(tiny_model_dir, mode=mode)
        cfg["model"]["trainer_device"] = "cuda:0"
        assert run_cli(tmp_path, cfg) == 2
        err = capsys.readouterr().err
        first = "trainer_device is 'cuda:0'" if mode == "sync" else "rollout_device is 'auto'"
        assert f"model.{first}" in err and "sm_70" in err
        assert not (tmp_path / "out").exists()


# --- shared memory for calibrate's weight copies ----------------------------------------------

def test_calibrate_refuses_weight_copies_shared_memory_cannot_hold_before_timing(
        cfg, monkeypatch: pytest.MonkeyPatch):
    """A simulated 1 kB /dev/shm: a ConfigError before any slot exists or anything is
    timed, where the copies would have died of SIGBUS."""
    from rlcore.measure import calibrate, copy_timings

    def never(*args, **kwargs):
        raise AssertionError("timed or allocated before shared memory was checked")

    monkeypatch.setattr(copy_timings, "shared_memory_free", lambda path="": 1024)
    monkeypatch.setattr(copy_timings, "WeightSlots", never)
    monkeypatch.setattr(calibrate, "time_sampling", never)
    for call in (lambda: copy_timings.time_weights(cfg, 1),
                 lambda: calibrate.calibrate(cfg, "here", reps=1)):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert "rlcore calibrate times host weight copies" in msg
        assert "has 0.00 GiB free" in msg and "give /dev/shm more" in msg
