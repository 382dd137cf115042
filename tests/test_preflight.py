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
