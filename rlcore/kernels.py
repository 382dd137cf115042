"""The CPU kernels and thread counts that decide a run's last bits, pinned before torch
computes anything (`runtime.kernels`, docs/reproducibility.md).

Torch picks its own vectorised kernels (ATen), MKL's GEMM and oneDNN's primitives for the
CPU it finds, and each rounds differently: on an AVX-512 host a run and its twin on an AVX2
host differ from the first log-probability, and over a run the difference flips sampled
tokens. `portable` fixes every choice to one that all x86-64 CPUs since about 2013 share:

- ATen's kernels at AVX2 (`ATEN_CPU_CAPABILITY`, read at torch's first dispatch);
- MKL in its strict conditional-numerical-reproducibility mode on the AVX2 branch
  (`MKL_CBWR=AVX2,STRICT`, read at MKL's first call): CNR fixes MKL's code path, cache
  blocking and reduction order, STRICT its GEMM's result for any thread count. MKL honours
  that branch only where it believes the CPU is Intel's (elsewhere it silently takes AUTO),
  so on other x86-64 CPUs rlcore answers MKL's is-it-Intel question itself
  (`take_intel_mkl_paths`): every CPU then runs the same MKL code;
- MKL's instruction cap at AVX2 (`MKL_ENABLE_INSTRUCTIONS`): a caller's `AVX512` makes
  MKL run AVX-512 code inside its strict AVX2 branch, while the branch still reads AVX2;
- oneDNN's ISA at AVX2 and its fp32 math strict (`ONEDNN_MAX_CPU_ISA`,
  `ONEDNN_DEFAULT_FPMATH_MODE`, their `DNNL_` twins), for whatever model or op reaches it;
- a fixed torch thread count per process (parallel reductions split by thread count).

Every environment variable that chooses one of these kernels is in `KERNEL_VARIABLES`:
`portable` sets it to its value there or removes it, whatever the caller exported, and a
run records each as the process saw it and as it computed with it (`variables`).

`native` leaves each library to pick the fastest code for this CPU: faster on big models,
but a run's numbers are then a function of the CPU model as well as of the config.

Both settings are read once per process, at first use, so `pin` runs in each process that
computes (the CLI, every worker and the warm launcher's jobs) before it computes, and
checks what is in force afterwards: a process that computed before it was pinned fails
with a message instead of running with other kernels. MKL's vendor answer must be in place
before torch is even imported: the CLI, the launcher's server and the test session take it
first thing (`take_intel_mkl_paths`), and the processes they start inherit it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from rlcore.allocator import keep_heap
from rlcore.config import ConfigError, RunConfig
from rlcore.errors import KernelsError

# Every variable that ATen, MKL or oneDNN reads to choose a kernel (each read once per
# process, at the library's first use; docs/reproducibility.md), with the value `portable`
# gives it (None: removed). oneDNN reads ONEDNN_ before DNNL_: both are pinned so that
# neither is the caller's. Thread counts are pinned by torch.set_num_threads, which MKL and
# OpenMP follow, not by variables.
KERNEL_VARIABLES: dict[str, str | None] = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's vectorised kernels
    "MKL_CBWR": "AVX2,STRICT",  # MKL's reproducibility branch
    # MKL's widest instructions, inside any branch: AVX512 runs AVX-512 code within the
    # strict AVX2 branch, which still reads AVX2
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "MKL_DEBUG_CPU_TYPE": None,  # the CPU older MKLs assume on a CPU not Intel's
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's widest instructions
    "DNNL_MAX_CPU_ISA": "AVX2",
    "ONEDNN_CPU_ISA_HINTS": "NO_HINTS",  # oneDNN's vector register width
    "DNNL_CPU_ISA_HINTS": "NO_HINTS",
    "ONEDNN_DEFAULT_FPMATH_MODE": "STRICT",  # whether oneDNN may compute fp32 in bf16/tf32
    "DNNL_DEFAULT_FPMATH_MODE": "STRICT",
}
# Set for `portable` in this process's environment, so that children inherit them too.
PORTABLE_ENV = {k: v for k, v in KERNEL_VARIABLES.items() if v is not None}
# Removed for `portable`, in this process and so in its children.
PORTABLE_UNSET = tuple(k for k, v in KERNEL_VARIABLES.items() if v is None)
# The variables as this process was started with them, before rlcore set any.
STARTED_WITH = {k: os.environ.get(k) for k in KERNEL_VARIABLES}
PORTABLE_CAPABILITY = "AVX2"  # torch.backends.cpu.get_cpu_capability() under portable
PORTABLE_MKL_BRANCH = "AVX2,STRICT"  # mkl_branch() under portable
X86_64 = ("x86_64", "amd64")
# MKL's branch codes (mkl_cbwr.h), as mkl_cbwr_get(MKL_CBWR_ALL) returns them: the branch,
# plus MKL_CBWR_STRICT in strict mode.
MKL_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
                8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512",
                13: "AVX512_MIC_E1", 14: "AVX512_E1"}
MKL_CBWR_ALL = -1
MKL_CBWR_STRICT = 0x10000
# The /proc/cpuinfo flags that decide which kernels a library may pick.
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16",
             "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
# MKL asks itself whether the CPU is Intel's through these two functions, which torch's
# library exports and calls through the dynamic linker; a library loaded ahead of torch that
# defines them answers for it. The answer changes which code MKL may run, nothing else.
INTEL_ANSWER = ("int mkl_serv_intel_cpu_true(void) { return 1; }\n"
                "int mkl_serv_intel_cpu(void) { return 1; }\n")
CACHE_VAR = "RLCORE_CACHE_DIR"  # where the built answer lives (default ~/.cache/rlcore)


def pin(cfg: RunConfig, threads: int | None = None) -> dict[str, Any]:
    """Pin this process's CPU kernels to `cfg.runtime.kernels` and torch's threads to
    `threads` (default `runtime.threads_per_role`), and have its allocator keep the heap it
    grows (`allocator.keep_heap`); returns what is in force."""
    level = cfg.runtime.kernels
    if level == "portable" and platform.machine().lower() not in X86_64:
        raise ConfigError(
            f"runtime.kernels is 'portable', which pins x86-64 kernels, but this machine is "
            f"{platform.machine()}: set runtime.kernels: native (its numbers are then this "
            "machine's own, docs/reproducibility.md)")
    vendor_problem = take_intel_mkl_paths()
    if level == "portable":
        os.environ.update(PORTABLE_ENV)
        for name in PORTABLE_UNSET:
            os.environ.pop(name, None)
    import torch  # here: the environment above must be set before torch first computes

    torch.set_num_threads(threads if threads is not None else cfg.runtime.threads_per_role)
    keep_heap()
    now = in_force()
    if level == "portable":
        _check_portable(now, vendor_problem)
    return now


def _check_portable(now: dict[str, Any], vendor_problem: str | None) -> None:
    if now["torch_cpu_capability"] != PORTABLE_CAPABILITY:
        lacks = [f for f in ("avx2", "fma") if f not in cpu()["flags"]]
        why = (f"this CPU lacks {', '.join(lacks)}" if lacks else
               "torch computed in this process before rlcore pinned its kernels")
        raise KernelsError(
            f"runtime.kernels is 'portable' but torch's CPU kernels here are "
            f"{now['torch_cpu_capability']}, not {PORTABLE_CAPABILITY}: {why}. Start the "
            "process with ATEN_CPU_CAPABILITY=avx2, or set runtime.kernels: native")
    if now["mkl_cbwr"] not in (None, PORTABLE_MKL_BRANCH):
        why = vendor_problem or (
            "MKL was used in this process before rlcore pinned it. Start the process with "
            f"MKL_CBWR={PORTABLE_ENV['MKL_CBWR']}")
        raise KernelsError(
            f"runtime.kernels is 'portable' but MKL runs on its {now['mkl_cbwr']} branch, not "
            f"{PORTABLE_MKL_BRANCH}: {why}; or set runtime.kernels: native")


def take_intel_mkl_paths() -> str | None:
    """Have MKL run its Intel code paths in this process and in those it starts, on any
    x86-64 CPU; None when it does (or needs nothing), else why it cannot."""
    vendor = cpu()["vendor"]
    if vendor in (None, "GenuineIntel") or platform.machine().lower() not in X86_64:
        return None
    try:
        answer = _intel_answer_library()
    except (OSError, subprocess.SubprocessError, KernelsError) as e:
        return None if intel_answer_loaded() else (
            f"on this {vendor} CPU MKL takes its AVX2 branch only once rlcore has built a "
            f"two-line C library that tells it the CPU is Intel's, and that failed: {e} "
            f"(it is built once into {_cache_dir()}; {CACHE_VAR} names another directory)")
    preloaded = os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
    if str(answer) not in preloaded:  # every process started from here loads it first
        os.environ["LD_PRELOAD"] = " ".join([str(answer), *preloaded])
    if intel_answer_loaded():  # at this process's start (LD_PRELOAD), or by an earlier call
        return None
    if "torch" not in sys.modules:
        # Ahead of torch in the global scope, so torch's calls bind to it when it loads.
        ctypes.CDLL(str(answer), mode=ctypes.RTLD_GLOBAL)
        return None
    return (f"torch was imported in this process before rlcore could answer MKL's vendor "
            f"question on this {vendor} CPU: call rlcore.kernels.take_intel_mkl_paths() "
            f"before importing torch, or start the process with LD_PRELOAD={answer}")


def _cache_dir() -> Path:
    return Path(os.environ.get(CACHE_VAR) or Path.home() / ".cache" / "rlcore")


@cache
def _intel_answer_library() -> Path:
    """INTEL_ANSWER compiled once into the cache directory, named by its source's hash."""
    name = hashlib.sha256(INTEL_ANSWER.encode()).hexdigest()[:12]
    out = _cache_dir() / f"mkl-intel-answer-{name}.so"
    if out.exists():
        return out
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise KernelsError("no C compiler was found (install gcc, or set CC)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        source, built = Path(tmp) / "answer.c", Path(tmp) / "answer.so"
        source.write_text(INTEL_ANSWER)
        done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(built), str(source)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise KernelsError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        built.replace(out)  # atomic: a concurrent process sees no half-written library
    return out


def in_force() -> dict[str, Any]:
    """The kernels and threads this process computes with (what `config.json` records)."""
    import torch

    return {
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": mkl_branch(),
        "mkl_intel_answer": intel_answer_loaded(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA",
                                             os.environ.get("DNNL_MAX_CPU_ISA", "ALL")),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "variables": kernel_variables(),
    }


def kernel_variables() -> dict[str, dict[str, str | None]]:
    """Each of KERNEL_VARIABLES as this process was started with it (`seen`) and as it is
    now, after rlcore pinned it (`set`); None where the variable is absent."""
    return {k: {"seen": STARTED_WITH[k], "set": os.environ.get(k)} for k in KERNEL_VARIABLES}


def mkl_branch() -> str | None:
    """MKL's reproducibility branch in force ('AVX2,STRICT'; OFF when not in CNR mode); None
    where torch has no MKL."""
    get = _mkl_cbwr_get()
    if get is None:
        return None
    code = get(MKL_CBWR_ALL)
    branch = MKL_BRANCHES.get(code & ~MKL_CBWR_STRICT, str(code & ~MKL_CBWR_STRICT))
    return f"{branch},STRICT" if code & MKL_CBWR_STRICT else branch


def intel_answer_loaded() -> bool:
    """Whether MKL's vendor question is answered by rlcore's library in this process (the
    process's global symbols define it; torch's own copy is not among them)."""
    return hasattr(ctypes.CDLL(None), "mkl_serv_intel_cpu_true")


@cache
def _mkl_cbwr_get() -> Any:
    import torch

    if not torch.backends.mkl.is_available():
        return None
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        fn = ctypes.CDLL(str(lib)).mkl_serv_cbwr_get
    except (OSError, AttributeError):  # another build of torch: MKL linked otherwise
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    return fn


@cache
def cpu() -> dict[str, Any]:
    """This CPU as /proc/cpuinfo names it (`parse_cpuinfo`); off Linux, what platform knows."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {"vendor": None, "family": None, "model": None, "stepping": None,
                "model_name": platform.processor() or None, "machine": platform.machine(),
                "flags": []}


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Vendor, family, model, stepping, model name and the flags of CPU_FLAGS it has, from
    /proc/cpuinfo's first processor (the model name alone can be as vague as 'AMD EPYC')."""
    first = text.split("\n\n")[0]
    fields = {k.strip(): v.strip() for k, v in
              (line.split(":", 1) for line in first.splitlines() if ":" in line)}
    flags = set(fields.get("flags", "").split())
    return {"vendor": fields.get("vendor_id"), "family": fields.get("cpu family"),
            "model": fields.get("model"), "stepping": fields.get("stepping"),
            "model_name": fields.get("model name"), "machine": platform.machine(),
            "flags": [f for f in CPU_FLAGS if f in flags]}


def cpu_name() -> str:
    """This CPU in one line: 'GenuineIntel 6/143/8 Intel(R) Xeon(R) ...'."""
    c = cpu()
    ident = "/".join(str(c[k]) for k in ("family", "model", "stepping") if c[k] is not None)
    return " ".join(str(x) for x in (c["vendor"], ident, c["model_name"]) if x) or c["machine"]
