"""rlcore/kernels.py: what `runtime.kernels` pins, what it refuses, and what a run records of
it (docs/reproducibility.md). That the pinned runs give the same bits on other hosts is
tests/test_golden.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcore import kernels
from rlcore.config import ConfigError, config_from_dict
from rlcore.kernels import (
    KERNEL_VARIABLES,
    PORTABLE_ENV,
    PORTABLE_UNSET,
    cpu,
    cpu_name,
    in_force,
    intel_answer_loaded,
    parse_cpuinfo,
    pin,
    take_intel_mkl_paths,
)
from rlcore.launcher.protocol import server_key
from rlcore.measure.kernels_bench import bench_kernels
from rlcore.replay.inputs import environment_differences
from rlcore.runners.sync import sync_train
from tests.conftest import small_config

ROOT = Path(__file__).resolve().parent.parent

# The first processor of a /proc/cpuinfo, as an Intel Xeon with AMX shows it (abridged).
XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 8
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_bf16 avx512_fp16 amx_tile amx_bf16

processor\t: 1
vendor_id\t: GenuineIntel
"""


class TestCpuinfo:
    def test_the_first_processor_names_the_cpu(self):
        cpu = parse_cpuinfo(XEON)
        assert (cpu["vendor"], cpu["family"], cpu["model"], cpu["stepping"]) == \
            ("GenuineIntel", "6", "143", "8")
        assert cpu["model_name"] == "Intel(R) Xeon(R) Processor"

    def test_only_the_flags_that_decide_kernels_are_kept_in_their_order(self):
        # fpu is not one of them; amx_int8 is, but this CPU lacks it
        assert parse_cpuinfo(XEON)["flags"] == ["sse4_2", "avx", "avx2", "fma", "avx512f",
                                                "avx512_bf16", "avx512_fp16", "amx_tile",
                                                "amx_bf16"]

    def test_a_cpuinfo_without_fields_gives_nones(self):
        cpu = parse_cpuinfo("")
        assert cpu["vendor"] is None and cpu["flags"] == []


class TestPin:
    def test_portable_is_in_force_in_the_test_session(self):
        # conftest pinned it before any test computed
        now = in_force()
        assert now["torch_cpu_capability"] == "AVX2"
        assert now["mkl_cbwr"] == "AVX2,STRICT"
        assert now["mkl_intel_answer"] == (cpu()["vendor"] != "GenuineIntel")
        assert all(os.environ[k] == v for k, v in PORTABLE_ENV.items())
        assert not [k for k in PORTABLE_UNSET if k in os.environ]

    def test_pin_sets_the_threads_it_is_given(self):
        import torch

        before = torch.get_num_threads()
        try:
            assert pin(config_from_dict({"runtime": {"threads_per_role": 1}}), threads=2)[
                "torch_threads"] == 2
            assert pin(config_from_dict({"runtime": {"threads_per_role": 1}}))[
                "torch_threads"] == 1
        finally:
            torch.set_num_threads(before)

    def test_portable_refuses_a_machine_that_is_not_x86_64(self,
                                                           monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setattr("platform.machine", lambda: "arm64")
        with pytest.raises(ConfigError, match="runtime.kernels: native"):
            pin(config_from_dict({}))

    def test_native_pins_nothing_on_any_machine(self, monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setattr("platform.machine", lambda: "arm64")
        assert pin(config_from_dict({"runtime": {"kernels": "native"}}))["torch_threads"] == 1

    @pytest.mark.slow
    def test_a_process_that_computed_before_it_was_pinned_fails_saying_how_to_start_it(self):
        env = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}
        code = ("import torch; torch.ones(3).sum(); "
                "from rlcore.config import config_from_dict; from rlcore.kernels import pin; "
                "pin(config_from_dict({}))")
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        native = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120).stdout.strip()
        if native == "AVX2":  # this CPU's own kernels are AVX2: nothing differs to detect
            assert done.returncode == 0
        else:
            assert done.returncode != 0
            assert "computed in this process before rlcore pinned" in done.stderr
            assert "ATEN_CPU_CAPABILITY=avx2" in done.stderr


# For each kernel variable, a value that would choose other kernels than portable's on a
# host able to run them (AVX-512 and AMX hosts; oneDNN's when an op reaches it).
CHALLENGES = {
    "ATEN_CPU_CAPABILITY": "avx512",
    "MKL_CBWR": "AVX512",
    "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    "MKL_DEBUG_CPU_TYPE": "5",
    "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX",
    "DNNL_MAX_CPU_ISA": "AVX512_CORE_AMX",
    "ONEDNN_CPU_ISA_HINTS": "PREFER_YMM",
    "DNNL_CPU_ISA_HINTS": "PREFER_YMM",
    "ONEDNN_DEFAULT_FPMATH_MODE": "BF16",
    "DNNL_DEFAULT_FPMATH_MODE": "BF16",
}
# A short sync run in a fresh process (kernels are fixed per process); prints its digest.
SHORT_RUN = ("import json, sys; from rlcore.kernels import take_intel_mkl_paths; "
             "take_intel_mkl_paths(); from rlcore.config import config_from_dict; "
             "from rlcore.runners.sync import sync_train; "
             "sync_train(config_from_dict(json.loads(sys.argv[1])), sys.argv[2]); "
             "print(json.loads(open(sys.argv[2] + '/summary.json').read())"
             "['reproducibility']['state_digest'])")


def _short_run_digest(model: Path, out: Path, kernels: str, env: dict[str, str]) -> str:
    cfg = small_config(model, runtime={"kernels": kernels, "progress_every": 0},
                       train={"updates": 2})
    clean = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    done = subprocess.run([sys.executable, "-c", SHORT_RUN, json.dumps(cfg), str(out)],
                          cwd=ROOT, env={**clean, **env}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()[-1]


@pytest.fixture(scope="module")
def clean_digest(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A short portable run's digest, started with none of the kernel variables set."""
    return _short_run_digest(tiny_model_dir, tmp_path_factory.mktemp("clean") / "run",
                             "portable", {})


def test_every_kernel_variable_has_a_challenge():
    assert set(CHALLENGES) == set(KERNEL_VARIABLES)


class TestTheCallersEnvironment:
    """A portable run's weights are the same whatever kernel variables its caller exported:
    each is tried at a value that, left unpinned, chooses other kernels on this host."""

    @pytest.mark.slow
    @pytest.mark.parametrize("name", sorted(CHALLENGES))
    def test_a_variable_the_caller_set_changes_no_weight(
            self, name: str, tiny_model_dir: Path, tmp_path: Path, clean_digest: str):
        value = CHALLENGES[name]
        # portable as if it left this one variable to the caller: the pins set by hand, the
        # kernels setting native so that rlcore touches nothing
        unpinned = {**PORTABLE_ENV, name: value}
        if _short_run_digest(tiny_model_dir, tmp_path / "unpinned", "native",
                        unpinned) == clean_digest:
            pytest.skip(f"{name}={value} left unpinned chooses no other kernel for this model "
                        f"on this CPU ({cpu_name()}; flags {' '.join(cpu()['flags'])}), so "
                        "this host cannot show that portable pins it")
        assert _short_run_digest(tiny_model_dir, tmp_path / "pinned", "portable",
                                 {name: value}) == clean_digest
        recorded = json.loads((tmp_path / "pinned" / "config.json").read_text())
        assert recorded["environment"]["kernels"]["variables"][name] == {
            "seen": value, "set": KERNEL_VARIABLES[name]}


def _pin_in_a_fresh_process(env: dict[str, str], first: str = "") -> subprocess.CompletedProcess:
    code = (f"{first}from rlcore.config import config_from_dict; "
            "from rlcore.kernels import pin; print(pin(config_from_dict({}))['mkl_cbwr'])")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


class TestIntelAnswer:
    """MKL runs its AVX2 branch only where it believes the CPU is Intel's; rlcore answers
    for other vendors' CPUs (kernels.take_intel_mkl_paths)."""

    def test_an_intel_cpu_needs_no_answer(self, monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setattr("rlcore.kernels.cpu", lambda: parse_cpuinfo(XEON))
        monkeypatch.setattr("rlcore.kernels._intel_answer_library",
                            lambda: pytest.fail("built an answer for an Intel CPU"))
        assert take_intel_mkl_paths() is None

    @pytest.fixture
    def other_vendor(self, tmp_path: Path) -> dict[str, str]:
        """A clean environment for a child on this non-Intel CPU, answer cached in tmp_path."""
        if cpu()["vendor"] == "GenuineIntel":
            pytest.skip("this CPU is Intel's: MKL takes its AVX2 branch without an answer")
        keep = {k: v for k, v in os.environ.items()
                if k not in PORTABLE_ENV and k != "LD_PRELOAD"}
        return {**keep, "RLCORE_CACHE_DIR": str(tmp_path / "cache")}

    def test_the_session_and_its_children_have_the_answer(self, other_vendor: dict[str, str]):
        assert intel_answer_loaded()
        assert "mkl-intel-answer-" in os.environ["LD_PRELOAD"]

    @pytest.mark.slow
    def test_a_fresh_process_builds_the_answer_and_runs_mkls_avx2_branch(
            self, other_vendor: dict[str, str], tmp_path: Path):
        done = _pin_in_a_fresh_process(other_vendor)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split()[-1] == "AVX2,STRICT"
        assert len(list((tmp_path / "cache").glob("mkl-intel-answer-*.so"))) == 1

    @pytest.mark.slow
    def test_torch_imported_first_is_refused_saying_how_to_start(
            self, other_vendor: dict[str, str]):
        done = _pin_in_a_fresh_process(other_vendor, first="import torch; ")
        assert done.returncode != 0
        assert "MKL runs on its AUTO" in done.stderr
        assert "before importing torch, or start the process with LD_PRELOAD=" in done.stderr

    @pytest.mark.slow
    def test_without_a_compiler_portable_says_what_to_install(
            self, other_vendor: dict[str, str], tmp_path: Path):
        (tmp_path / "bin").mkdir()  # a PATH with no compiler on it
        done = _pin_in_a_fresh_process({**other_vendor, "PATH": str(tmp_path / "bin"),
                                        "CC": "cc"})
        assert done.returncode != 0
        assert "no C compiler was found (install gcc, or set CC)" in done.stderr
        assert "runtime.kernels: native" in done.stderr


def test_a_run_records_its_cpu_and_kernels(tiny_model_dir: Path, tmp_path: Path):
    sync_train(config_from_dict(small_config(tiny_model_dir)), tmp_path / "run")
    env = json.loads((tmp_path / "run" / "config.json").read_text())["environment"]
    assert env["kernels"]["setting"] == "portable"
    assert env["kernels"]["torch_cpu_capability"] == "AVX2"
    assert env["kernels"]["mkl_cbwr"] == "AVX2,STRICT"
    assert env["kernels"]["torch_threads"] == 1
    assert env["cpu"]["vendor"] and "avx2" in env["cpu"]["flags"]
    rep = json.loads((tmp_path / "run" / "summary.json").read_text())["reproducibility"]
    assert rep["environment"]["kernels"] == "portable"
    assert rep["environment"]["cpu_capability"] == "AVX2"
    assert rep["environment"]["cpu"].startswith(env["cpu"]["vendor"])


def test_the_record_names_each_variable_as_seen_and_as_set(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(kernels.STARTED_WITH, "MKL_ENABLE_INSTRUCTIONS", "AVX512")
    monkeypatch.setitem(kernels.STARTED_WITH, "MKL_DEBUG_CPU_TYPE", "5")
    variables = in_force()["variables"]
    assert list(variables) == list(KERNEL_VARIABLES)
    # the test session runs pinned (conftest): what it computes with is portable's
    assert variables["MKL_ENABLE_INSTRUCTIONS"] == {"seen": "AVX512", "set": "AVX2"}
    assert variables["MKL_DEBUG_CPU_TYPE"] == {"seen": "5", "set": None}


def test_a_native_runs_cpu_is_part_of_its_environment():
    recorded = {"torch": "2.13.0", "threads_per_role": 1, "devices": {},
                "cpu": "AuthenticAMD 26/2/1 AMD EPYC"}
    here = {**recorded, "cpu": "GenuineIntel 6/143/8 Intel(R) Xeon(R) Processor"}
    assert environment_differences(recorded, here) == [
        "cpu was 'AuthenticAMD 26/2/1 AMD EPYC', here it is "
        "'GenuineIntel 6/143/8 Intel(R) Xeon(R) Processor'"]
    # under portable kernels the replay leaves the CPU out: it does not decide the numbers
    portable = {k: v for k, v in here.items() if k != "cpu"}
    assert environment_differences(recorded, portable) == []


def test_a_server_started_with_other_kernels_is_not_reused():
    base = {"PATH": "/usr/bin"}
    keys = {server_key(base)} | {server_key({**base, var: "avx2"}) for var in (
        "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR")}
    assert len(keys) == 5


@pytest.mark.slow
def test_bench_kernels_times_each_mode_on_each_kernels(tiny_model_dir: Path, tmp_path: Path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(small_config(tiny_model_dir, staleness={"staleness_k": 1})))
    result = bench_kernels(str(config), [], updates=2, repeats=1)
    runs = result["runs"]
    assert set(runs) == {"sync/portable", "sync/native", "areal/portable", "areal/native"}
    assert (runs["sync/portable"]["cpu_capability"], runs["sync/portable"]["mkl_cbwr"]) == \
        ("AVX2", "AVX2,STRICT")
    # native runs start without rlcore's variables: MKL is not in its reproducible mode
    assert runs["areal/native"]["mkl_cbwr"] == "OFF"
    for mode in ("sync", "areal"):
        assert result["portable_over_native"][mode] == pytest.approx(
            runs[f"{mode}/portable"]["wall_s"]["median"]
            / runs[f"{mode}/native"]["wall_s"]["median"])
