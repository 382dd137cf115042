"""Where each rollout worker and trainer rank runs (rlcore/runners/asynchronous/layout.py):
the layout of a config on a machine of N GPUs, the layouts refused, and the memory
arithmetic, by hand; and the ranks' backend on each kind of device."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlcore.config import config_from_dict
from rlcore.errors import ConfigError
from rlcore.policy import data_parallel
from rlcore.policy.device import resolve_transport
from rlcore.runners.asynchronous.layout import (
    GIB,
    Layout,
    ModelSize,
    check_memory,
    kv_bytes_per_position,
    resolve_layout,
    role_bytes,
)


def resolver(gpus: int) -> Any:
    """resolve_device on a machine of `gpus` GPUs, without one."""
    def resolve(spec: str, role: str) -> torch.device:
        if spec == "auto":
            return torch.device("cpu") if gpus == 0 else \
                torch.device(f"cuda:{min(1 if role == 'trainer' else 0, gpus - 1)}")
        device = torch.device(spec)
        if device.type == "cuda" and (device.index or 0) >= gpus:
            raise ConfigError(f"model.{role}_device is '{spec}' but this machine has {gpus}")
        return device
    return resolve


def cfg(r: int = 1, m: int = 1, trainers: int = 1, **model: Any) -> Any:
    return config_from_dict({"mode": "areal", "model": model, "rollout": {"group_size": 4},
                             "train": {"update_batch_size": 32},
                             "runtime": {"rollout_workers": r, "trainer_ranks": m,
                                         "trainer_workers": trainers}})


def names(layout: Layout) -> tuple[list[str], list[str]]:
    return [str(d) for d in layout.rollout], [str(d) for d in layout.trainer]


@pytest.mark.parametrize(("gpus", "r", "m", "rollout", "trainer"), [
    (2, 1, 1, ["cuda:0"], ["cuda:1"]),  # the paper's pair, as before
    (4, 2, 2, ["cuda:0", "cuda:1"], ["cuda:2", "cuda:3"]),  # a GPU each
    (8, 7, 1, [f"cuda:{i}" for i in range(7)], ["cuda:7"]),
    (2, 2, 1, ["cuda:0", "cuda:0"], ["cuda:1"]),  # too few GPUs: the pair, shared
    (0, 2, 2, ["cpu", "cpu"], ["cpu", "cpu"]),  # no GPU: every worker on the CPU
])
def test_auto_gives_each_worker_a_gpu_where_there_are_enough(gpus: int, r: int, m: int,
                                                             rollout: list[str],
                                                             trainer: list[str]):
    assert names(resolve_layout(cfg(r, m), resolver(gpus), gpus)) == (rollout, trainer)


def test_device_lists_place_each_worker_and_rank():
    c = cfg(2, 2, rollout_devices=["cuda:3", "cuda:2"], trainer_devices=["cuda:0", "cuda:1"])
    layout = resolve_layout(c, resolver(4), 4)
    assert names(layout) == (["cuda:3", "cuda:2"], ["cuda:0", "cuda:1"])
    assert list(layout.roles()) == ["rollout0", "rollout1", "trainer0", "trainer0_rank1"]


@pytest.mark.parametrize(("c", "gpus", "fragment"), [
    (cfg(1, 2), 2, "trainer ranks 0 and 1 are both on cuda:1: NCCL runs one rank per GPU"),
    (cfg(1, 2, trainer_devices=["cpu", "cuda:0"]), 1, "all on CPU (gloo) or all on GPUs"),
    (cfg(1, 1, rollout_devices=["cuda:4"]), 4, "this machine has 4"),
])
def test_a_layout_that_cannot_work_is_refused(c: Any, gpus: int, fragment: str):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        resolve_layout(c, resolver(gpus), gpus)


def test_a_device_list_of_the_wrong_length_is_refused_in_the_config():
    with pytest.raises(ConfigError, match="names 1 devices for runtime.rollout_workers = 2"):
        cfg(2, 1, rollout_devices=["cuda:0"])
    with pytest.raises(ConfigError, match="each entry is cpu or cuda:N"):
        cfg(1, 1, trainer_devices=["gpu0"])


# Qwen2.5-0.5B: 494,032,768 parameters; 24 layers, 2 KV heads of 64: K and V at fp16 are
# 2 x 24 x 2 x 64 x 2 = 12,288 bytes a row and position
QWEN = ModelSize(params=494_032_768, trainable=494_032_768, kv_bytes_per_position=12_288)


def test_kv_bytes_by_hand():
    qwen = type("C", (), {"num_hidden_layers": 24, "num_attention_heads": 14,
                          "num_key_value_heads": 2, "hidden_size": 896})()
    assert kv_bytes_per_position(qwen, 2) == 12_288


def test_what_each_role_holds_by_hand():
    # 32 rows of 100 prompt tokens + 6 new (the default max_new_tokens)
    needs = role_bytes(QWEN, cfg(), prompt_tokens=100, slot_bytes=3 * 1000)
    weights = 4 * 494_032_768  # 1,976,131,072 bytes
    assert needs["rollout"] == {"weights": weights, "kv cache": 12_288 * 32 * 106}
    assert needs["trainer"] == {"weights": weights, "gradients": weights, "adam": 2 * weights}
    assert needs["slots"] == {"slots": 3000}


def test_a_gpu_that_cannot_hold_its_roles_is_refused_with_the_arithmetic():
    needs = role_bytes(QWEN, cfg(), prompt_tokens=100, slot_bytes=2 * 4 * 494_032_768)
    on_16 = lambda d: 16 * GIB  # noqa: E731
    two = Layout((torch.device("cuda:0"),), (torch.device("cuda:1"),))
    check_memory(two, needs, on_16, torch.device("cuda:0"))  # 1.84 + 0.04 + 3.68; 7.36: fits
    # two racing trainers on cuda:1: 2 x (1.84 + 1.84 + 3.68) = 14.72 GiB of 8
    racing = Layout((torch.device("cuda:0"),), (torch.device("cuda:1"),), racing=2)
    with pytest.raises(ConfigError, match=r"cuda:1 has 8.00 GiB and this layout puts 14.72 GiB"
                       r" on it before any activation \(trainer0 weights 1.84; "):
        check_memory(racing, needs, lambda d: 8 * GIB, None)
    # one GPU for everything, slots on it: 1.84 + 0.04 + 7.36 + 3.68 = 12.92 GiB of 12
    one = Layout((torch.device("cuda:0"),), (torch.device("cuda:0"),))
    with pytest.raises(ConfigError, match=r"puts 12.92 GiB on it.*weight slots slots 3.68"):
        check_memory(one, needs, lambda d: 12 * GIB, torch.device("cuda:0"))
    # the CPU is not checked
    cpu = Layout((torch.device("cpu"),), (torch.device("cpu"),), racing=4)
    check_memory(cpu, needs, lambda d: 0, None)


def test_ranks_on_gpus_meet_over_nccl_bound_to_their_gpu(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Any):
    assert data_parallel.backend_for(torch.device("cpu")) == "gloo"
    assert data_parallel.backend_for(torch.device("cuda:3")) == "nccl"
    calls: dict[str, Any] = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.__setitem__("current", d))
    monkeypatch.setattr(data_parallel.dist, "init_process_group",
                        lambda backend, **kw: calls.update(backend=backend, **kw))
    group = data_parallel.RankGroup(tmp_path / "rendezvous", 1, 2,
                                    device=torch.device("cuda:3"), timeout_s=5)
    assert (calls["backend"], calls["device_id"], calls["current"]) == \
        ("nccl", torch.device("cuda:3"), torch.device("cuda:3"))
    assert (calls["rank"], calls["world_size"], group.device) == (1, 2, torch.device("cuda:3"))


def test_rollout_workers_on_several_gpus_read_through_pinned_host_memory():
    gpu = torch.device("cuda:0")
    assert resolve_transport("auto", gpu) == "device"
    assert resolve_transport("auto", gpu, rollout_gpus=2) == "pinned"
    assert resolve_transport("auto", torch.device("cpu"), rollout_gpus=2) == "host"
